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

from captioner.commands.arguments import (
    add_decode_flags,
    add_device_flag,
    chosen_device,
    decode_options,
    int_at_least,
    use_tf32,
)
from captioner.names import ENSEMBLE_ATTENTIONS

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
                             "at each step, every model reading the same way: as each reads on its own "
                             "(eval.attention_mode) when they agree; models that read differently on their own "
                             "(a soft model beside a hard one reading argmax) need --attention-mode, and then all "
                             "read that way")
    parser.add_argument("--ensemble-attention", choices=ENSEMBLE_ATTENTIONS, default=None,
                        help="with several models, the attention the overlays and --json results show, and the "
                             "cells their one-cell reads (argmax, sample) report: the first model's map and read "
                             "cells, or the mean of all maps and its arg-max cell (default: first)")
    parser.add_argument("--list-models", action="store_true", help="list the shipped pretrained models and exit")
    add_decode_flags(parser)  # --beam, --n-best (captions printed per image), --attention-mode, ..., --allow-unk
    parser.add_argument("--attention-out", default=None, help="write one overlay PNG per image here")
    parser.add_argument("--gif", action="store_true", help="with --attention-out, also write an animated GIF")
    parser.add_argument("--entities", default=None, metavar="DIR",
                        help="with --attention-out, a Flickr30k Entities folder: on each word's panel, draw the boxes "
                             "of the phrase it names (photos named <id>_*.jpg or <id>.jpg) and the share of its "
                             "attention inside them")
    parser.add_argument("--batch-size", type=int_at_least(1), default=16)
    add_device_flag(parser)  # --device, default auto
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner caption IMAGE... [--model DIR | owner/name | CKPT] [--model ...]`: one caption per image (several
    --model: an ensemble's); exit 1 if any failed."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_models:
        from captioner.store.zoo import describe, scan_models

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

    if args.ensemble_attention and len(args.checkpoint or []) < 2:
        parser.error("argument --ensemble-attention: needs two or more --model/--checkpoint")

    from captioner.data.images import ImageLoadError, load_image

    model = _load(args)
    if model is None:
        return 2
    options = decode_options(parser, args, model.caption_options.replace_given)  # for people: no <unk> unless asked

    paths, failures = expand_image_paths(args.images)
    results: list[dict] = []
    out_dir = Path(args.attention_out) if args.attention_out else None
    if args.entities and not out_dir:
        parser.error("argument --entities: draws boxes on the overlays, so it needs --attention-out DIR")
    entities = None
    if args.entities:
        from captioner.data.records import DataError
        from captioner.evaluation.regions import open_entities

        try:
            entities = open_entities(args.entities, [p.stem for p in paths], "the photos captioned")
        except DataError as err:
            print(f"captioner caption: {err}", file=sys.stderr)
            return 2
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
        outputs = model.caption(images, options)
        for path, image, out in zip(batch_paths, images, outputs):
            record = {"image": str(path), **{k: v for k, v in out.items() if k != "alphas"}}
            if out_dir:
                record["overlay"] = str(_write_overlay(out_dir, path, image, out, gif=args.gif, entities=entities))
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
    from captioner.models.ensemble import describe_ensemble
    from captioner.store.checkpoint import CheckpointError

    models = args.checkpoint or []
    source = models[0] if len(models) == 1 else (models or None)  # None: the shipped model; several: an ensemble
    try:
        model = load_captioner(source, device=chosen_device("caption", args.device),
                               ensemble_attention=args.ensemble_attention)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"captioner caption: {err}", file=sys.stderr)
        return None
    use_tf32(model)
    if len(args.checkpoint or []) > 1:  # stdout keeps one "image<TAB>caption" line per caption
        print(f"captioner caption: {describe_ensemble(**model.ensemble)}", file=sys.stderr)
    return model


def _write_overlay(out_dir: Path, path: Path, image, out: dict, gif: bool = False, entities=None) -> Path:
    from captioner.evaluation.grounding import word_boxes
    from captioner.models.ensemble import ATTENTION_SHOWN_WORDS
    from captioner.visualize import save_attention_gif, save_overlay

    ensemble = out.get("ensemble")  # only an ensemble's results say which attention they hold
    note = None if ensemble is None else f"attention: {ATTENTION_SHOWN_WORDS[ensemble['attention']]}"
    boxes = None if entities is None else word_boxes(entities.get(path.stem), out["words"])
    target = save_overlay(image, out, out_dir / f"{path.stem}_attention.png", note, boxes=boxes)
    if gif and out["words"]:
        save_attention_gif(image, out["words"], out["alphas"], out["grid_hw"], out_dir / f"{path.stem}_attention.gif")
    return target
