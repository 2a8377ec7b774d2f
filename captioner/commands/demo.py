"""`captioner demo` (what `make demo` runs): real photographs first, then the whole pipeline on the shapes data.

Captions a few real photographs (scikit-image's bundled ones) with the shipped Flickr8k model and
writes their per-word attention overlays (seconds, no training); then generates the shapes data, extracts
EfficientNet-Lite0 grids into the feature cache, trains the soft-attention model for its config's epochs (an
optional --time-budget caps it, and the summary says when it ended a run early),
evaluates it on the test split (caption metrics and attention grounding), captions a few test images and
writes their attention overlays, then prints where everything is. A second run reuses the data, the cache
and a finished training run. The photographs are captioner/demo.py's; training is training/loop.py's, the
evaluation evaluation/split.py's. Before anything runs it prints its plan: each part and about how long it
takes (``plan``).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import time
from pathlib import Path
from typing import Sequence

from captioner.atomic import write_bytes_atomic, write_text_atomic
from captioner.commands.arguments import float_at_least, int_at_least
from captioner.config import CONFIG_DIR, Config, add_config_arguments, load_config
from captioner.demo import PHOTOS, sample_photo
from captioner.store.rundir import RunDir

DEFAULT_CONFIG = CONFIG_DIR / "shapes.yaml"  # shipped with the package

# About how long the parts take on 2 idle CPU cores, as the docs measure (with a busy loop on one of them the whole
# demo took 18 min 18 s, about twice as long: docs/robustness.md). docs/results.md's shapes row (2026-12-01): the
# shipped shapes config's 12 epochs of 3,000 training images in 7 min 12 s, validation included, and its 3,400 images
# drawn and their grids extracted in 2 min 9 s more (9 min 21 s in all). The five photographs: 19 s with the model's
# loading (2026-12-06, on a busy machine). Evaluation and the test images' overlays are not timed apart: estimated as
# the 200 test images read and encoded at the extraction's 52 images/s, decoded and scored (the smoke config's 6:
# under 2 s), and METEOR's Java on top.
EPOCH_S_PER_TRAINING_IMAGE = 432 / (12 * 3000)
MAKING_S_PER_IMAGE = 129 / 3400
PHOTOS_S = 20.0
EVALUATION_S_PER_IMAGE, METEOR_S, TEST_CAPTIONS_S = 15.0 / 200, 15.0, 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner demo", description=__doc__.splitlines()[0])
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default="runs/demo")
    parser.add_argument("--time-budget", type=float_at_least(0.0), default=0.0,
                        help="seconds of training at most (default 0: none; the config's epochs are the budget, so a "
                             "slow or busy machine takes longer rather than stopping early with a weaker model)")
    parser.add_argument("--n-captions", type=int_at_least(0), default=6, help="test images to caption with overlays")
    parser.add_argument("--retrain", action="store_true", help="train again even if a finished run exists")
    parser.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts a Java process)")
    parser.add_argument("--no-photos", action="store_true",
                        help="skip captioning the real photographs with the shipped model")
    return parser


def caption_photos(out_dir: Path, names: Sequence[str] = PHOTOS) -> list[dict]:
    """Caption scikit-image's photographs with the shipped model, as `captioner caption` does (its config's
    decoding); write each photo and its overlay."""
    from captioner.api import load_captioner
    from captioner.visualize import save_overlay

    model = load_captioner()  # the shipped Flickr8k model
    out_dir.mkdir(parents=True, exist_ok=True)
    images = [sample_photo(n) for n in names]
    results = []
    for name, image, out in zip(names, images, model.caption(images)):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")  # lossless: `captioner caption` on it gives the same caption
        write_bytes_atomic(out_dir / f"{name}.png", buffer.getvalue())  # a full disk is named
        target = save_overlay(image, out, out_dir / f"{name}_attention.png")
        results.append({"photo": name, "caption": out["caption"], "overlay": str(target)})
    return results


def caption_records(model, records: Sequence, overlay_dir: Path) -> list[dict]:
    """Caption data set images (one batched search, the model's config's decoding), write their overlays, print
    each beside its first reference; returns {image, caption, reference, overlay} per image."""
    from captioner.data.images import load_image
    from captioner.visualize import save_overlay

    overlay_dir.mkdir(parents=True, exist_ok=True)
    captions = []
    images = [load_image(record.path) for record in records]
    for record, image, out in zip(records, images, model.caption(images)):
        target = save_overlay(image, out, overlay_dir / f"{Path(record.path).stem}.png")
        captions.append({"image": str(record.path), "caption": out["caption"], "reference": record.raw[0],
                         "overlay": str(target)})
        print(f"      {Path(record.path).name}: {out['caption']!r}  (reference: {record.raw[0]!r})")
    return captions



def stopped_early(run_dir: RunDir, epochs: int) -> str | None:
    """Why the demo's run trained fewer than ``epochs`` epochs ("stopped after epoch 5 of 12: time budget ..."),
    or None when it trained them all: a weak model is then explained, not just shown."""
    from captioner.store.checkpoint import load_checkpoint

    if not run_dir.last.is_file():
        return None
    last = load_checkpoint(run_dir.last)
    done, why = int(last["epoch"]), last.get("stop")
    if done >= epochs:
        return None
    hint = {"time budget": "--time-budget ended it; without one the demo trains every epoch",
            "patience": "validation stopped improving (train.patience)"}.get(why or "", "the run was stopped")
    return f"stopped after epoch {done} of {epochs}: {hint}; the scores are those of a shorter run"


def _about(seconds: float) -> str:
    """"~20 s", "~2 min": a rough duration, rounded as roughly as it is known."""
    if seconds < 90:
        return f"~{max(5, 5 * round(seconds / 5))} s"
    return f"~{round(seconds / 60)} min"


def plan(cfg: Config, photos: bool, reuse: bool, meteor: bool, n_captions: int) -> list[str]:
    """What the demo will do, a line per part with about how long it takes (the constants above), then the total.
    ``reuse``: a finished run is there and will not be trained again."""
    parts: list[tuple[str, float | None]] = []
    if photos:
        parts.append((f"[0/4] caption {len(PHOTOS)} photographs with the shipped model, with overlays", PHOTOS_S))
    epochs = cfg.train.epochs
    if reuse:
        parts.append((f"[1/4] reuse the finished training in {cfg.train.run_dir} (--retrain trains again)", 0.0))
    elif cfg.data.format == "shapes":
        shapes = cfg.data.shapes
        made = (Path(cfg.data.root) / "dataset_shapes.json").exists()
        images = shapes.n_train + shapes.n_val + shapes.n_test
        parts.append((f"[1/4] extract the grids of the shapes data ({images:,} images) unless cached" if made else
                      f"[1/4] draw the shapes data ({images:,} images) and extract their grids",
                      (0.5 if made else 1.0) * MAKING_S_PER_IMAGE * images))  # extraction: about half
        train_s = EPOCH_S_PER_TRAINING_IMAGE * shapes.n_train * epochs
        if cfg.train.time_budget_s:
            train_s = min(train_s, cfg.train.time_budget_s)
        budget = f", at most {cfg.train.time_budget_s:.0f} s" if cfg.train.time_budget_s else ""
        parts.append((f"      train the soft-attention model: {epochs} epochs of {shapes.n_train:,} images{budget}",
                      train_s))
    else:
        parts.append((f"[1/4] train on the {cfg.data.format} data: {epochs} epochs (time: depends on the data)", None))
    test_images = cfg.data.shapes.n_test if cfg.data.format == "shapes" else 200  # another data set's: a guess
    parts.append((f"[2/4] evaluate on the test split (greedy{', METEOR' if meteor else ''})",
                  EVALUATION_S_PER_IMAGE * test_images + (METEOR_S if meteor else 0.0)))
    parts.append((f"[3/4] caption {n_captions} test images with overlays; [4/4] the summary", TEST_CAPTIONS_S))
    width = max(len(text) for text, _ in parts)
    lines = ["captioner demo: what it does, and about how long each part takes on 2 idle CPU cores (one busy: "
             "twice as long)"]
    lines += [f"  {text:<{width}}  {'' if s is None else _about(s) if s else 'seconds'}".rstrip() for text, s in parts]
    known = [s for _, s in parts if s is not None]
    lines.append(f"  about {_about(sum(known))[1:]} in all{'' if len(known) == len(parts) else ' besides training'}"
                 + ("" if reuse else "; stopped midway, the next run continues from the last finished epoch"))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner demo [--config X.yaml] [--run-dir DIR] [--time-budget S] ...`."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from captioner.api import load_captioner
    from captioner.data.datasets import load_records
    from captioner.evaluation.split import PER_PHOTO, evaluate_model, format_table
    from captioner.training.loop import train

    config_path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    overrides = [f"train.run_dir={args.run_dir}", *args.overrides]
    if args.time_budget:
        overrides.insert(1, f"train.time_budget_s={args.time_budget}")
    cfg = load_config(config_path, overrides)
    run_dir = RunDir(cfg.train.run_dir)
    reuse = run_dir.finished.exists() and run_dir.best.exists() and not args.retrain
    print("\n".join(plan(cfg, photos=not args.no_photos, reuse=reuse, meteor=not args.no_meteor,
                         n_captions=args.n_captions)))
    t0 = time.time()

    if not args.no_photos:
        photo_dir = run_dir.photos
        print(f"[0/4] real photographs, shipped Flickr8k model -> {photo_dir}/")
        try:
            for item in caption_photos(photo_dir):
                print(f"      {item['photo']:<16} {item['caption']!r}  ({Path(item['overlay']).name})")
        except (ImportError, ValueError) as err:  # no shipped model / no scikit-image in this installation
            print(f"      skipped: {err}")

    budget = (f"{cfg.train.epochs} epochs" + (f", at most {cfg.train.time_budget_s:.0f} s" if cfg.train.time_budget_s
                                              else "; the bar shows each epoch's time left"))
    print(f"[1/4] data + training ({config_path or 'defaults'}; {budget}) -> {run_dir}")
    done_marker = run_dir.finished
    if reuse:
        print(f"      reusing the finished run in {run_dir} (pass --retrain to train again)")
    else:
        resume = str(run_dir) if run_dir.last.exists() and not args.retrain else None
        train(cfg, resume=resume)
        write_text_atomic(done_marker, json.dumps({"finished_at": time.time()}))

    print("[2/4] evaluating on the test split (greedy)")
    model = load_captioner(run_dir.root)
    records = load_records(cfg.data, "test")
    result = evaluate_model(model, records, model.decode_options.replace_given(beam=1),
                            batch_size=cfg.eval.batch_size, meteor=not args.no_meteor)
    result["split"] = "test"
    print(format_table(result, "test"))

    print(f"[3/4] captioning {args.n_captions} test images with beam {model.decode_options.beam}, writing overlays")
    overlay_dir = run_dir.overlays
    captions = caption_records(model, records[: args.n_captions], overlay_dir)

    print("[4/4] summary")
    summary = {
        "test": {k: v for k, v in result.items() if k not in PER_PHOTO},
        "captions": captions,
        "wall_time_s": round(time.time() - t0, 1),
        "torch_threads": torch.get_num_threads(),
    }
    bleu4 = result["scores"].get("BLEU-4")
    grounding = result["grounding"]
    early = stopped_early(run_dir, cfg.train.epochs)
    summary["stopped_early"] = early
    write_text_atomic(run_dir.summary, json.dumps(summary, indent=2))
    print(f"      test BLEU-4 {bleu4:.2f} | grounding "
          f"{'n/a' if grounding is None else f'{100 * grounding:.1f}%'} | {summary['wall_time_s']:.0f} s"
          + (f" | {early}" if early else ""))
    print(f"      checkpoint: {run_dir.best}\n      overlays:   {overlay_dir}/\n"
          f"      summary:    {run_dir.summary}")
    return 0
