"""Config files: where one is found (a path, or a shipped config's name) and what it says once its bases are read.

A config file lists only what it changes. It may name a base (``base: flickr8k_soft``, a shipped config's name, or
a path) whose values it starts from, looked for beside the file, then among the shipped names, then from the working
directory (so a shipped name means the shipped config wherever the command runs); the base may have a base of its
own.
The file's mappings merge into its base's, key by key; any other value replaces the base's. One exception keeps a
merge from mixing two kinds' keys: a kinded section (``model.decoder``, ``train.objective``) whose ``kind`` the file
changes is the file's alone, as ``--set`` of a whole section is (config.py). A cycle or a missing base is refused,
naming the chain of files. ``read_config_file`` also says which file set each value (``origins``: what
``captioner config show --origin`` prints).

Torch-free and below config.py, which turns the merged mapping into a typed Config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from captioner.registration import ConfigError

BASE_KEY = "base"
# The configs shipped with the package (``configs/`` in a checkout is a link to this folder).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> dict[str, Path]:
    """Name -> file of every config shipped with the package (e.g. "flickr8k_soft")."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def resolve_config_path(path: str | Path, near: Path | None = None) -> Path:
    """A config file path, or the name of a shipped config (``flickr8k_soft`` or ``flickr8k_soft.yaml``).
    ``near``: the folder of the file that names ``path`` as its base, where a relative path is looked for first,
    then among the shipped names, and only then from the working directory (which came before the shipped names,
    so that a ``flickr8k_soft.yaml`` there changed what a file's ``base: flickr8k_soft.yaml`` meant); a path given
    on its own (``--config``) is the file it names, else a shipped name."""
    candidate = Path(path)
    shipped = shipped_configs()
    name = candidate.stem if candidate.suffix in (".yaml", ".yml") and len(candidate.parts) == 1 else str(path)
    if near is not None and not candidate.is_absolute():
        for found in (near / candidate, near / f"{candidate}.yaml"):
            if found.is_file():
                return found
        if name in shipped:
            return shipped[name]
    if candidate.is_file():
        return candidate
    if name in shipped:
        return shipped[name]
    raise ConfigError(f"config file not found: {path} (shipped configs, usable by name: {', '.join(shipped)})")


@dataclass
class ConfigFile:
    """A config file read with its bases: ``data`` the merged mapping (no ``base`` key), ``origins`` dotted key
    path -> the file that set it, ``chain`` the files from the one read to its last base."""

    data: dict
    origins: dict[str, str]
    chain: list[Path]


def read_config_file(path: str | Path, kinded: Mapping[str, str] = (), _chain: tuple[Path, ...] = (),
                     near: Path | None = None) -> ConfigFile:
    """``path`` (a file or a shipped name) merged over its chain of bases. ``kinded``: the kinded sections' key
    paths -> their default kind (a section that names no kind has it)."""
    file = resolve_config_path(path, near)
    chain = (*_chain, file)
    if file.resolve() in {f.resolve() for f in _chain}:
        raise ConfigError("config bases form a cycle: " + " -> ".join(str(f) for f in chain))
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{file}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping at the top level")
    base = data.pop(BASE_KEY, None)
    own = ConfigFile(data, {key: str(file) for key in _leaves(data)}, [file])
    if base is None:
        return own
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{file}: {BASE_KEY}: expected a config's name or path, got {base!r}")
    try:
        parent = read_config_file(base, kinded, chain, near=file.parent)
    except ConfigError as err:
        if str(err).startswith("config file not found"):
            raise ConfigError(f"{file}: {BASE_KEY} {base!r} not found (chain: "
                                  + " -> ".join(str(f) for f in chain) + f"); {err}") from None
        raise
    merged, origins = merge(parent.data, parent.origins, data, str(file), dict(kinded))
    return ConfigFile(merged, origins, [file, *parent.chain])


def merge(base: dict, base_origins: dict[str, str], child: dict, source: str, kinded: dict[str, str],
          prefix: str = "") -> tuple[dict, dict[str, str]]:
    """``child`` merged over ``base`` (neither changed), and the origins of the result's leaves (``source`` for
    what ``child`` set)."""
    out, origins = dict(base), {k: v for k, v in base_origins.items() if _under(k, prefix)}
    for key, value in child.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and not _kind_changes(path, old, value, kinded):
            out[key], sub = merge(old, origins, value, source, kinded, path)
        else:
            out[key], sub = value, {leaf: source for leaf in _leaves(value, path)}
        origins = {k: v for k, v in origins.items() if not _under(k, path)}
        origins.update(sub)
    return out, origins


def _kind_changes(path: str, old: dict, new: dict, kinded: dict[str, str]) -> bool:
    """Whether ``new`` (a kinded section at ``path``) names another kind than ``old`` has."""
    if path not in kinded or "kind" not in new:
        return False
    return new["kind"] != old.get("kind", kinded[path])


def _under(key: str, prefix: str) -> bool:
    return not prefix or key == prefix or key.startswith(prefix + ".")


def _leaves(value: Any, prefix: str = "") -> list[str]:
    """The dotted paths of a value's leaves (a mapping's, recursively; an empty mapping is a leaf)."""
    if isinstance(value, dict) and value:
        return [leaf for key, sub in value.items() for leaf in _leaves(sub, f"{prefix}.{key}" if prefix else key)]
    return [prefix]
