"""`captioner average`: checkpoint averaging, the mean of several checkpoints' weights
(``checkpoint.average_checkpoints``), written as one weights-only checkpoint that every command loads
(caption, evaluate, export)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captioner average",
        description="average the weights of several checkpoints of one model: given files, or the last K epochs "
                    "a run kept (train.keep_epochs); the result loads like any checkpoint. With --run, only the "
                    "epochs of the run the folder holds (its run id, up to its last.pt's epoch); fewer than K is "
                    "refused, naming the files")
    parser.add_argument("checkpoints", nargs="*", metavar="CKPT", help="checkpoint files to average")
    parser.add_argument("--run", default=None, help="a run directory whose kept epochs (RUN/epochs/) to average")
    parser.add_argument("--last", type=int, default=0, metavar="K",
                        help="with --run: the run's last K kept epochs (default: all of them)")
    parser.add_argument("--out", required=True, help="the checkpoint file to write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner average (CKPT ... | --run RUN [--last K]) --out FILE`."""
    args = _parser().parse_args(argv)
    from captioner.store.checkpoint import CheckpointError, average_checkpoints, save_checkpoint

    try:
        paths = _chosen(args)
        save_checkpoint(args.out, average_checkpoints(paths))
    except (CheckpointError, OSError, ValueError) as err:
        print(f"captioner average: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: the mean of {len(paths)} checkpoints ({', '.join(str(p) for p in paths)})")
    return 0


def _chosen(args: argparse.Namespace) -> list:
    """The files to average: the CKPT arguments, or the run's last K kept epochs (never both)."""
    if bool(args.checkpoints) == bool(args.run):
        raise ValueError("give checkpoint files or --run RUN, not both and not neither")
    if args.last < 0:
        raise ValueError(f"--last must be >= 0, got {args.last}")
    if args.checkpoints:
        if args.last:
            raise ValueError("--last counts a run's kept epochs: use it with --run")
        return list(args.checkpoints)
    from captioner.store.checkpoint import last_snapshots, run_identity

    run_id, latest_epoch = run_identity(args.run)  # another run's epochs left in the folder are not this run's
    return last_snapshots(args.run, args.last, run_id, latest_epoch, what=f"--last {args.last}" if args.last
                          else "--run")
