"""A training run's folder, ``train.run_dir``: every file a run writes and the commands read, named once.

::

    RUN_DIR/
      config.yaml              the resolved config the run trained with (``captioner train --resume`` reads it)
      vocab.json               its vocabulary
      last.pt                  the latest state: what --resume continues from
      best.pt                  the best epoch so far by train.val_metric (what evaluate/caption load)
      metrics.jsonl            one line per epoch
      epochs/epoch-NNN.pt      train.keep_epochs: each epoch's weights (snapshot ensembles, averaging)
      averaged.pt              train.average_last: the mean of the last k of them
      finished.json            `captioner demo`: written once its run is done; with summary.json (its test
                               scores and captions), overlays/ (their attention) and photos/ (the shipped
                               model's captions of scikit-image's photographs)
      tensorboard/, wandb/     the loggers' own folders
      weights-rankR.sha256     distributed runs: each rank's weights hash (they must agree)

A checkpoint path that is a run folder loads ``best.pt``, else ``last.pt`` (``RunDir.checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    """The files of one run folder (``RunDir(cfg.train.run_dir)``); nothing is created or read here."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    def __str__(self) -> str:
        return str(self.root)

    def __fspath__(self) -> str:
        return str(self.root)

    config = property(lambda self: self.root / "config.yaml")
    vocab = property(lambda self: self.root / "vocab.json")
    last = property(lambda self: self.root / "last.pt")
    best = property(lambda self: self.root / "best.pt")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    epochs = property(lambda self: self.root / "epochs")
    averaged = property(lambda self: self.root / "averaged.pt")
    finished = property(lambda self: self.root / "finished.json")
    summary = property(lambda self: self.root / "summary.json")
    overlays = property(lambda self: self.root / "overlays")
    photos = property(lambda self: self.root / "photos")
    tensorboard = property(lambda self: self.root / "tensorboard")

    def epoch(self, number: int) -> Path:
        """train.keep_epochs' weights of epoch ``number`` (1-based)."""
        return self.epochs / f"epoch-{number:03d}.pt"

    def epoch_snapshots(self) -> list[Path]:
        """The kept epochs' weights, oldest first."""
        return sorted(self.epochs.glob("epoch-*.pt"))

    def weights_hash(self, rank: int) -> Path:
        return self.root / f"weights-rank{rank}.sha256"

    def checkpoint(self) -> Path | None:
        """The checkpoint a run folder stands for: best.pt, else last.pt; None when it holds neither."""
        return next((p for p in (self.best, self.last) if p.is_file()), None)

    def names(self) -> tuple[str, ...]:
        """The file names ``checkpoint`` looks for, in order (for messages)."""
        return (self.best.name, self.last.name)
