"""`captioner config list | show [NAME_OR_PATH] [--set KEY=VALUE ...] [--origin]`: the shipped configs, or one
config with every key resolved (captioner/config.py), over its chain of bases (config_files.py); ``--origin``
says beside each value which file set it (``--set``, or ``default`` where none did)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable

import yaml

from captioner.config import (
    ConfigError,
    config_to_dict,
    kinded_family_defaults,
    load_config,
    sections_reset,
    shipped_configs,
    split_override,
)
from captioner.config_files import read_config_file


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner config", description="list the shipped configs, or print "
                                     "one fully resolved (every key, with its default where the file is silent)")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the shipped configs, usable by name with --config")
    show = sub.add_parser("show", help="print a config with every key resolved, as YAML")
    show.add_argument("config", nargs="?", default=None, help="a shipped config's name or a YAML file "
                      "(omitted: the defaults)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--origin", action="store_true", help="one line per key, each with the file that set it "
                      "(its own or a base's), --set, or default")
    return parser


def main(argv: Iterable[str] | None = None) -> int:
    """`captioner config list` | `captioner config show NAME_OR_PATH [--set KEY=VALUE ...]`."""
    args = _parser().parse_args(None if argv is None else list(argv))
    if args.action == "list":
        for name, path in shipped_configs().items():
            first = path.read_text().splitlines()[0].lstrip("# ").strip() if path.read_text() else ""
            print(f"{name:<20} {first}")
        return 0
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"captioner config: {err}", file=sys.stderr)
        return 1
    if not args.origin:
        sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        return 0
    file = None if args.config is None else read_config_file(args.config, kinded_family_defaults())
    origins = {} if file is None else file.origins
    for where in [] if file is None else sections_reset(file.data, args.overrides):  # the file's keys there: gone
        origins = {k: v for k, v in origins.items() if not k.startswith(where + ".")}
    sets = [".".join(split_override(text)[0]) for text in args.overrides]
    for path, value in _leaves(config_to_dict(cfg)):
        where = next(("--set" for s in sets if path == s or path.startswith(s + ".")), None)
        print(f"{path}: {json.dumps(value)}  # {where or origins.get(path, 'default')}")
    return 0


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted path, value) of every leaf of a resolved config."""
    out = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        out += _leaves(value, path) if isinstance(value, dict) else [(path, value)]
    return out
