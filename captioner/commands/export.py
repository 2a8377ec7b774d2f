"""`captioner export --checkpoint RUN DIR`: write a trained run as a Hub-style model folder (captioner/store/hub.py)
through ``api.export_model``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence


def _read_scores(path: Path) -> dict:
    try:
        scores = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err}); give the output of `captioner evaluate --out`") from None
    if not isinstance(scores, dict):
        raise ValueError(f"{path}: expected a JSON object of scores, got {type(scores).__name__}")
    return scores


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner export --checkpoint RUN [--format hub] DIR [--name NAME] [--scores scores.json]`."""
    from captioner.store.hub import CARD_FILE, CONFIG_FILE, DTYPES, WEIGHTS_FILE

    parser = argparse.ArgumentParser(
        prog="captioner export",
        description=f"write a run's model as a Hub-style model folder: {WEIGHTS_FILE}, {CONFIG_FILE} (config, "
                    f"vocabulary, encoder fingerprint, weights SHA-256) and a {CARD_FILE} model card whose "
                    f"metadata a model hub reads; load_captioner(DIR) and `captioner caption --model DIR` read it")
    parser.add_argument("out", metavar="DIR", help="the model folder to write (e.g. to upload to a hub)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint file, run directory or model folder")
    parser.add_argument("--format", choices=("hub",), default="hub",
                        help="the folder layout; hub (the only one): what model hubs hold and the shipped models use")
    parser.add_argument("--name", default=None, help="the model's name (default: the folder's name)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float16",
                        help="the weights' format: float16 (default), float32 (bit-exact) or int8 (a matrix row's "
                             "entries in groups sharing a float16 scale, read back as float32: the shipped models')")
    parser.add_argument("--group", type=int, default=None,
                        help="with --dtype int8: entries per scale (default 64; 32 rounds closer, 3 %% larger)")
    parser.add_argument("--scores", default=None,
                        help="validation scores to record and put on the card: the JSON of `captioner evaluate --out`")
    parser.add_argument("--dataset", default=None, help="the data set's name on the card (default: from the config)")
    args = parser.parse_args(argv)
    from captioner.api import export_model
    from captioner.store.checkpoint import CheckpointError

    try:
        scores = _read_scores(Path(args.scores)) if args.scores else None
        folder = export_model(args.checkpoint, args.out, args.name, args.dtype, scores, args.dataset, args.group)
    except (CheckpointError, OSError, ValueError) as err:
        print(f"captioner export: {err}", file=sys.stderr)
        return 1
    size = (folder / WEIGHTS_FILE).stat().st_size / 1e6
    print(f"wrote {folder}: {WEIGHTS_FILE} ({size:.1f} MB), {CONFIG_FILE}, {CARD_FILE}")
    return 0
