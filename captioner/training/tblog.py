"""TensorBoard logging for training runs (``train.tensorboard``): what a person watches while a run goes.
captioner/training/run_logs.py opens it together with Weights & Biases (``train.wandb``,
captioner/training/wblog.py), which gets the same records.

Written to RUN_DIR/tensorboard (``tensorboard --logdir runs``):

- ``train/<part>`` every ``train.log_every`` steps: the loss and its parts (``xe``, ``alpha_penalty``,
  ``alpha_entropy``; hard attention ``reinforce``, ``entropy``, ``reward``; SCST ``reward``,
  ``baseline``, ``advantage_abs``, ``sample_length``) and ``train/lr``;
- ``epoch/<key>`` once per epoch: every number of the metrics.jsonl entry (validation BLEU-1..4,
  ROUGE-L, CIDEr-D, val_loss, alpha_max, alpha_entropy, lr, throughput ...);
- ``val/<image>`` once per epoch: a few validation images with their greedy caption and per-word
  attention overlay.

``train.tensorboard``: "auto" logs when the ``tensorboard`` package is installed (and says so when it
is not), "on" requires it (a clear error otherwise), "off" never logs. metrics.jsonl is written
either way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from captioner.names import TENSORBOARD_MODES as MODES  # named below the config, which checks train.tensorboard
from captioner.store.rundir import RunDir
from captioner.training.errors import TrainingError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'captioner[tensorboard]' (or pip install tensorboard)"


class TensorBoardLog:
    """A SummaryWriter with the three kinds of records above."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(RunDir(run_dir).tensorboard))

    def step(self, parts: dict[str, Any], lr: float, step: int) -> None:
        for name, value in parts.items():
            self.writer.add_scalar(f"train/{name}", float(value), step)
        self.writer.add_scalar("train/lr", lr, step)

    def epoch(self, entry: dict[str, Any], epoch: int) -> None:
        for key, value in entry.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("epoch", "step"):
                self.writer.add_scalar(f"epoch/{key}", value, epoch)

    def overlays(self, overlays: Sequence[tuple[str, np.ndarray, str]], epoch: int) -> None:
        """(name, rendered overlay (H, W, 3) uint8, caption) per validation image, logged as ``val/<name>``."""
        for name, pixels, _ in overlays:
            self.writer.add_image(f"val/{name}", pixels, epoch, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_tensorboard(run_dir: Path, mode: str) -> TensorBoardLog | None:
    """The run's TensorBoard log per ``mode`` ("auto" | "on" | "off"); None when not logging."""
    if mode not in MODES:
        raise ValueError(f"train.tensorboard: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        return None
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
    except ImportError:
        if mode == "on":
            raise TrainingError(f"train.tensorboard=on but the tensorboard package is not installed: "
                                f"{INSTALL_HINT}; or set train.tensorboard=off") from None
        log.info("TensorBoard logging off: the tensorboard package is not installed (%s); "
                 "metrics.jsonl has every number", INSTALL_HINT)
        return None
    return TensorBoardLog(run_dir)
