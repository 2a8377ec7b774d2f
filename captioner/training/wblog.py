"""Weights & Biases logging for training runs (``train.wandb``), for labs that log there: the same records as
TensorBoard (captioner/training/tblog.py), under the same names:

- ``train/<part>`` and ``train/lr`` every ``train.log_every`` steps, against ``global_step``;
- ``epoch/<key>`` once per epoch (every number of the metrics.jsonl entry), against ``epoch``;
- ``val/<image>`` once per epoch: a few validation images with their greedy caption and attention overlay.

``train.wandb``: "off" (the default) never logs; "offline" writes the run under RUN_DIR/wandb, for
``wandb sync`` to upload later; "online" logs to the W&B server (after ``wandb login``, or with
``WANDB_API_KEY``). The ``wandb`` package is an extra (``pip install 'captioner[wandb]'``); asking for W&B
without it is an error that says so. The project is ``WANDB_PROJECT``, else "captioner"; the run is named after
its directory, gets the resolved config, and a resumed run continues the same W&B run (its id is kept in
RUN_DIR/wandb-run-id).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from captioner.atomic import write_text_atomic
from captioner.names import WANDB_MODES as MODES  # named below the config, which checks train.wandb
from captioner.training.errors import TrainingError

INSTALL_HINT = "pip install 'captioner[wandb]' (or pip install wandb)"
RUN_ID_FILE = "wandb-run-id"


class WandbLog:
    """A W&B run with the three kinds of records above."""

    def __init__(self, run: Any) -> None:
        self.run = run
        # Steps and epochs are separate axes: W&B's own step must only grow, so each record names its axis.
        run.define_metric("global_step")
        run.define_metric("train/*", step_metric="global_step")
        run.define_metric("epoch")
        run.define_metric("epoch/*", step_metric="epoch")
        run.define_metric("val/*", step_metric="epoch")

    def step(self, parts: dict[str, Any], lr: float, step: int) -> None:
        record = {f"train/{name}": float(value) for name, value in parts.items()}
        self.run.log({**record, "train/lr": lr, "global_step": step})

    def epoch(self, entry: dict[str, Any], epoch: int) -> None:
        record = {f"epoch/{key}": value for key, value in entry.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("epoch", "step")}
        self.run.log({**record, "epoch": epoch})

    def overlays(self, overlays: Sequence[tuple[str, Any, str]], epoch: int) -> None:
        """(name, rendered overlay (H, W, 3) uint8, caption) per validation image, logged as ``val/<name>``."""
        import wandb

        images = {f"val/{name}": wandb.Image(pixels, caption=caption) for name, pixels, caption in overlays}
        if images:
            self.run.log({**images, "epoch": epoch})

    def close(self) -> None:
        self.run.finish()


def open_wandb(run_dir: Path, mode: str, config: dict, resumed: bool = False) -> WandbLog | None:
    """The run's W&B log per ``mode`` ("off" | "offline" | "online"); None when off. ``resumed``: continue the
    W&B run this run directory logged to before."""
    if mode not in MODES:
        raise ValueError(f"train.wandb: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        return None
    try:
        import wandb
    except ImportError:
        raise TrainingError(f"train.wandb={mode} but the wandb package is not installed: {INSTALL_HINT}; "
                            f"or set train.wandb=off") from None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / RUN_ID_FILE
    run_id = id_file.read_text().strip() if resumed and id_file.is_file() else None
    try:
        run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "captioner", name=run_dir.resolve().name,
                         dir=str(run_dir), mode=mode, config=config, id=run_id, resume="allow" if run_id else None,
                         settings=wandb.Settings(console="off"))  # leave the terminal (and tqdm) alone
    except Exception as err:  # noqa: BLE001 - wandb raises its own errors (no login, no network); name the fix
        raise TrainingError(f"train.wandb={mode}: W&B did not start ({type(err).__name__}: {err}); "
                            + ("log in with `wandb login` or set WANDB_API_KEY, or use train.wandb=offline"
                               if mode == "online" else "or set train.wandb=off")) from None
    write_text_atomic(id_file, run.id + "\n")
    return WandbLog(run)
