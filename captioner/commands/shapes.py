"""`captioner shapes --out DIR`: write the built-in synthetic shapes data set (captioner/data/shapes.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.commands.arguments import int_at_least
from captioner.data.shapes import JSON_NAME, REFERENCE_SIZE, SENTENCES_PER_IMAGE, generate_shapes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner shapes", description="Generate the synthetic shapes data set.")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--n-train", type=int_at_least(0), default=3000)
    parser.add_argument("--n-val", type=int_at_least(0), default=200)
    parser.add_argument("--n-test", type=int_at_least(0), default=200)
    parser.add_argument("--image-size", type=int_at_least(32), default=REFERENCE_SIZE)
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`captioner shapes --out DIR [--n-train N] [--n-val N] [--n-test N] [--image-size S] [--seed S]`."""
    args = _parser().parse_args(argv)
    existed = (args.out / JSON_NAME).is_file()
    before = (args.out / JSON_NAME).stat().st_mtime_ns if existed else None
    json_path = generate_shapes(args.out, n_train=args.n_train, n_val=args.n_val, n_test=args.n_test,
                                image_size=args.image_size, seed=args.seed)
    reused = existed and json_path.stat().st_mtime_ns == before
    total = args.n_train + args.n_val + args.n_test
    verb = "reused existing" if reused else "wrote"
    print(f"{verb} shapes data set: {total} images (train {args.n_train}, val {args.n_val}, test {args.n_test}), "
          f"{args.image_size}x{args.image_size}, seed {args.seed}, {SENTENCES_PER_IMAGE} captions each -> {json_path}")
    return 0
