"""Command-line value types that refuse out-of-range numbers, so argparse's message names the flag.

``parser.add_argument("--beam", type=int_at_least(1))`` turns ``--beam 0`` into
``error: argument --beam: must be >= 1, got 0`` (exit status 2) instead of a silent fallback or a slice
that drops images. Every command's numeric options use these.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [low, high] (no upper bound when ``high`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse's fallback message says "invalid integer value"
    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite float >= low."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low:g}, got {text}")
        return value

    parse.__name__ = "number"
    return parse
