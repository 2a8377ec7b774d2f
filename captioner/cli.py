"""`captioner <command>`: the dispatcher of the command line (also ``python -m captioner <command>``).

Every command is a module of captioner/commands/ with a ``main(argv=None) -> int`` function, so tests can
call it directly; this module maps command names to them and imports only the one asked for, so
``captioner --help`` does not pay for importing torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Sequence

# command -> (module, help line); each module defines main(argv) -> int
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("captioner.commands.train", "train a captioner from a config"),
    "caption": ("captioner.commands.caption", "caption image files, globs or directories"),
    "evaluate": ("captioner.commands.evaluate",
                 "decode a split and score it (BLEU, METEOR, ROUGE-L, CIDEr-D, grounding)"),
    "score": ("captioner.commands.score",
              "score a COCO-format results file against Karpathy, COCO or captions-file references"),
    "extract": ("captioner.commands.extract", "precompute encoder grids into the feature cache"),
    "demo": ("captioner.commands.demo", "the end-to-end run on the built-in shapes data"),
    "export": ("captioner.commands.export",
               "write a trained run as a Hub-style model folder (safetensors, config.json, card)"),
    "average": ("captioner.commands.average", "average the weights of checkpoints (a run's last K epochs)"),
    "config": ("captioner.commands.config", "list the shipped configs, or show one with every key resolved"),
    "shapes": ("captioner.commands.shapes", "write the built-in synthetic shapes data set"),
    "serve": ("captioner.commands.serve", "a local demo page: upload a photo, see its caption, n-best and attention"),
    "recipe": ("captioner.commands.recipe",
               "a model's whole chain of runs: list, show, run (resumable; --dry-run), report its records"),
}

# Commands that run until stopped, serving requests of any size from many threads: malloc keeping every
# thread's freed memory (runtime.keep_freed_memory) would only let their memory grow.
LONG_RUNNING = {"serve"}


def _usage() -> str:
    lines = ["usage: captioner <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`captioner <command> --help` describes each command's options."]
    return "\n".join(lines)


def _command(name: str) -> Callable[[Sequence[str] | None], int]:
    module, _ = COMMANDS[name]
    return importlib.import_module(module).main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from captioner.version import __version__

        print(f"captioner {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"captioner: unknown command {name!r} (valid: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    if name not in LONG_RUNNING:
        from captioner.runtime import keep_freed_memory

        keep_freed_memory()  # every batch command allocates the same large tensors again and again (runtime.py)
    from captioner.atomic import DiskFullError

    try:
        return int(_command(name)(rest) or 0)
    except DiskFullError as err:  # any command's write: the file, the space free (and needed, when known), no trace
        print(f"captioner {name}: error: {err}", file=sys.stderr)
        return 1
