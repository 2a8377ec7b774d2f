"""`captioner config list | show [NAME_OR_PATH] [--set KEY=VALUE ...]`: the shipped configs, or one config
with every key resolved (captioner/config.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable

import yaml

from captioner.config import ConfigError, config_to_dict, load_config, shipped_configs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner config", description="list the shipped configs, or print "
                                     "one fully resolved (every key, with its default where the file is silent)")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the shipped configs, usable by name with --config")
    show = sub.add_parser("show", help="print a config with every key resolved, as YAML")
    show.add_argument("config", nargs="?", default=None, help="a shipped config's name or a YAML file "
                      "(omitted: the defaults)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
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
    sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    return 0
