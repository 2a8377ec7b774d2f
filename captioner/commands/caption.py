"""`captioner caption IMAGE... [--model M [--model M2 ...]] [--beam N] [--attention-out DIR] [--json]`: caption
image files, globs or directories with ``api.load_captioner(...).caption`` (no ``--model``: the shipped Flickr8k
model; several: their ensemble, models/ensemble.py), optionally writing each image's per-word attention overlay
(captioner/visualize.py)."""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path
from typing import Sequence

from captioner.arguments import int_at_least
from captioner.names import ENSEMBLE_ATTENTIONS, HARD_DECODING_MODES

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def expand_image_paths(items: Sequence[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Files, globs and directories → image paths (sorted per item) and (item, reason) misses."""
    paths: list[Path] = []
    missing: list[tuple[str, str]] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and q.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                missing.append((item, "directory holds no image files"))
            paths += found
        elif p.exists():
            paths.append(p)
        elif any(ch in item for ch in "*?["):
            found = sorted(Path(q) for q in glob.glob(item, recursive=True) if Path(q).is_file())
            if not found:
                missing.append((item, "glob matched no files"))
            paths += found
        else:
            missing.append((item, "no such file"))
    return paths, missing


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner caption", description=main.__doc__)
    parser.add_argument("images", nargs="*", help="image files, globs or directories")
    parser.add_argument("--model", "--checkpoint", dest="checkpoint", action="append", default=None,
                        help="model folder, hub model id (owner/name, from the local Hugging Face cache), "
                             "checkpoint file, run directory or shipped model name (default: the shipped "
                             "Flickr8k model; see --list-models); given more than once, an ensemble of those "
                             "models (one vocabulary and encoder): the mean of their word log-probabilities "
                             "at each step")
    parser.add_argument("--ensemble-attention", choices=ENSEMBLE_ATTENTIONS, default=None,
                        help="with several models, the attention the overlays and --json results show: the "
                             "first model's or the mean of all (default: first)")
    parser.add_argument("--list-models", action="store_true", help="list the shipped pretrained models and exit")
    parser.add_argument("--allow-unk", action="store_true",
                        help="let captions contain <unk> (by default the search never chooses it)")
    parser.add_argument("--block-trigrams", action=argparse.BooleanOptionalAction, default=None,
                        help="never let a caption repeat a trigram (default: the checkpoint's eval.block_trigrams)")
    parser.add_argument("--beam", type=int_at_least(1), default=3, help="beam width (1 = greedy)")
    parser.add_argument("--n-best", type=int_at_least(1), default=1, help="captions to print per image (<= --beam)")
    parser.add_argument("--max-length", type=int_at_least(1), default=None,
                        help="most words per caption (default: the checkpoint's eval.max_length, or the "
                             "longest training caption)")
    parser.add_argument("--length-penalty", type=float, default=None,
                        help="beam ranking: score / length ** P (default: the checkpoint's eval.length_penalty)")
    parser.add_argument(
        "--attention-mode", choices=HARD_DECODING_MODES, default=None,
        help="hard-attention decoding mode (default: the checkpoint's eval setting)",
    )
    parser.add_argument("--attention-out", default=None, help="write one overlay PNG per image here")
    parser.add_argument("--gif", action="store_true", help="with --attention-out, also write an animated GIF")
    parser.add_argument("--batch-size", type=int_at_least(1), default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner caption IMAGE... [--model DIR | owner/name | CKPT] [--model ...]`: one caption per image (several
    --model: an ensemble's); exit 1 if any failed."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_models:
        from captioner.zoo import describe, scan_models

        models, damaged = scan_models()
        for name, meta in models.items():
            print(describe(name, meta))
        if not models:
            print("no shipped models in this installation")
        for reason in damaged.values():
            print(f"captioner caption: shipped model left out: {reason}", file=sys.stderr)
        return 1 if damaged else 0
    if not args.images:
        parser.error("give at least one image (or --list-models)")
    if args.n_best > args.beam:
        parser.error(f"argument --n-best: must be <= --beam ({args.beam}), got {args.n_best}")

    if args.ensemble_attention and len(args.checkpoint or []) < 2:
        parser.error("argument --ensemble-attention: needs two or more --model/--checkpoint")

    from captioner.data.images import ImageLoadError, load_image

    model = _load(args)
    if model is None:
        return 2

    paths, failures = expand_image_paths(args.images)
    results: list[dict] = []
    out_dir = Path(args.attention_out) if args.attention_out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(paths), args.batch_size):
        batch_paths, images = [], []
        for path in paths[start : start + args.batch_size]:
            try:
                images.append(load_image(path))
                batch_paths.append(path)
            except ImageLoadError as err:
                failures.append((str(path), str(err)))
        if not images:
            continue
        outputs = model.caption(
            images, beam=args.beam, n_best=args.n_best, max_length=args.max_length,
            length_penalty=args.length_penalty,
            attention_mode=args.attention_mode, forbid_unk=not args.allow_unk, block_trigrams=args.block_trigrams,
        )
        for path, image, out in zip(batch_paths, images, outputs):
            record = {"image": str(path), **{k: v for k, v in out.items() if k != "alphas"}}
            if out_dir:
                record["overlay"] = str(_write_overlay(out_dir, path, image, out, gif=args.gif))
            results.append(record)
            if not args.json:
                captions = [out["caption"]] + [c["caption"] for c in out.get("n_best", [])[1:]]
                for rank, caption in enumerate(captions):
                    prefix = f"{path}" if rank == 0 else f"{'':>{len(str(path))}}"
                    print(f"{prefix}\t{caption}")

    for item, reason in failures:
        print(f"captioner caption: cannot caption {item}: {reason}", file=sys.stderr)
    if args.json:
        print(json.dumps({"results": results, "failed": [{"image": i, "error": r} for i, r in failures]}, indent=2))
    return 1 if failures else 0


def _load(args: argparse.Namespace):
    """The model (an ensemble for several --model), or None after printing why it cannot be loaded."""
    from captioner.api import load_captioner
    from captioner.checkpoint import CheckpointError
    from captioner.models.ensemble import describe_ensemble

    models = args.checkpoint or []
    source = models[0] if len(models) == 1 else (models or None)  # None: the shipped model; several: an ensemble
    try:
        model = load_captioner(source, device=args.device, ensemble_attention=args.ensemble_attention)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"captioner caption: {err}", file=sys.stderr)
        return None
    if len(args.checkpoint or []) > 1:  # stdout keeps one "image<TAB>caption" line per caption
        print(f"captioner caption: {describe_ensemble(**model.ensemble)}", file=sys.stderr)
    return model


def _write_overlay(out_dir: Path, path: Path, image, out: dict, gif: bool = False) -> Path:
    from captioner.models.ensemble import ATTENTION_SHOWN_WORDS
    from captioner.visualize import overlay_attention, save_attention_gif

    target = out_dir / f"{path.stem}_attention.png"
    ensemble = out.get("ensemble")  # only an ensemble's results say which attention they hold
    note = None if ensemble is None else f"attention: {ATTENTION_SHOWN_WORDS[ensemble['attention']]}"
    fig = overlay_attention(image, out["words"], out["alphas"], out["grid_hw"], chosen=out.get("locations"),
                            note=note)
    fig.savefig(target, dpi=80, bbox_inches="tight")
    if gif and out["words"]:
        save_attention_gif(image, out["words"], out["alphas"], out["grid_hw"], out_dir / f"{path.stem}_attention.gif")
    return target
