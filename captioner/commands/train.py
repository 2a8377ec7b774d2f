"""`captioner train --config X.yaml [--set k=v ...] [--init RUN] [--resume RUN]`: the training loop of
captioner/training/loop.py (``train``) from the command line, under torchrun too."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

import torch.distributed as dist

from captioner.atomic import DiskFullError
from captioner.config import ConfigError, add_config_arguments, load_config
from captioner.data.datasets import DataError
from captioner.store.rundir import RunDir
from captioner.store.saved_config import load_run_config
from captioner.training.errors import TrainingError
from captioner.training.loop import train
from captioner.training.resume import nothing_to_resume

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captioner train",
        description="The training loop: epochs, validation by real decoding, checkpoints, exact resume, DDP. A new "
                    "run (no --resume) starts in a clean train.run_dir: what an earlier run left there (checkpoints, "
                    "kept epochs, logs) is moved into RUN_DIR/previous-YYYYMMDD-HHMMSS/ first, with a warning "
                    "naming it. Every run has an id (RUN_DIR/run.json, carried by its checkpoints and kept across "
                    "--resume); train.average_last averages only this run's kept epochs.")
    add_config_arguments(parser)
    parser.add_argument("--init", default=None, metavar="RUN_DIR",
                        help="start from the weights of RUN_DIR's best.pt (or a checkpoint file, a model folder "
                             "or a shipped model's name), e.g. self-critical training after cross-entropy, or a "
                             "hard-attention model from a soft one; sets train.init")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last.pt (its config.yaml is used "
                             "when --config is not given; --set still applies); a run killed at any moment "
                             "continues to the same epochs and weights. A folder without last.pt yet, or one that "
                             "does not exist yet (a path such as runs/x, or a bare name; a job preempted in its "
                             "first epoch, or not started: what a scheduler's requeue passes), starts the run "
                             "there from its first epoch, with --config or the folder's config.yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner train --config X.yaml [--set k=v ...] [--resume RUN_DIR]`."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from captioner.store.checkpoint import CheckpointError
    from captioner.store.hub import ModelFolderError

    try:
        resume = args.resume
        start_over = resume is not None and nothing_to_resume(resume)
        run = RunDir(resume) if resume is not None else None
        if start_over and args.config is None and not run.config.is_file():
            raise TrainingError(f"--resume {resume}: no last.pt there yet and no config.yaml to start the run from: "
                                f"give the config, captioner train --config CONFIG --resume {resume}")
        if args.config is None and resume is not None and Path(resume).is_dir():
            cfg = load_run_config(run.config, args.overrides)  # as the run saved it
        else:
            cfg = load_config(args.config, args.overrides)
        if start_over:  # a requeued job that never reached its first checkpoint: it starts there, from epoch 1
            cfg.train.run_dir = str(run.root)
            log.warning("--resume %s: no last.pt there yet (stopped before its first epoch ended, or never started): "
                        "starting the run there from its first epoch", resume)
            resume = None
        if args.init is not None:
            cfg.train.init = args.init
        run_dir = train(cfg, resume=resume)
    except (ConfigError, DataError, TrainingError, CheckpointError, ModelFolderError, DiskFullError) as err:
        print(f"captioner train: error: {err}", file=sys.stderr)
        return 1
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    print(f"run directory: {run_dir}")
    return 0
