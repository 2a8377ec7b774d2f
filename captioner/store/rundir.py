"""A training run's folder, ``train.run_dir``: every file a run writes and the commands read, named once.

::

    RUN_DIR/
      config.yaml              the resolved config the run trained with (``captioner train --resume`` reads it)
      vocab.json               its vocabulary
      last.pt                  the latest state: what --resume continues from
      best.pt                  the best epoch so far by train.val_metric (what evaluate/caption load)
      metrics.jsonl            one line per epoch
      epochs/epoch-NNN.pt      train.keep_epochs: each epoch's weights (snapshot ensembles, averaging)
      averaged.pt              train.average_last: the mean of the run's last k of them
      run.json                 which run the folder holds: {"run_id": ...}, kept across --resume; every checkpoint
                               and snapshot the run writes carries the same run_id
      stage.json               `captioner recipe run`: the recipe stage the folder holds, its inputs (resolved config,
                               the weights it started from) and, once done, its run id and wall time
                               (captioner/training/recipe_runs.py); not a run output: the recipe writes it before
                               the run starts
      finished.json            `captioner demo`: written once its run is done; with summary.json (its test
                               scores and captions), overlays/ (their attention) and photos/ (the shipped
                               model's captions of scikit-image's photographs)
      tensorboard/, wandb/     the loggers' own folders
      weights-rankR.sha256     distributed runs: each rank's weights hash (they must agree)
      previous-YYYYMMDD-HHMMSS/  what an earlier run left here, moved aside when a new run (not --resume) started

A checkpoint path that is a run folder loads ``best.pt``, else ``last.pt`` (``RunDir.checkpoint``); where the latest
state is wanted (``--resume``), ``last.pt`` alone (``prefer="last"``; captioner/store/locate.py). A new run
starts in a folder of its own: ``run_outputs`` are the entries it would mix with an earlier run's (moved aside by
captioner/training/run_files.py); the demo's ``photos/`` (the shipped model's captions) and W&B's folder (W&B keeps
its runs apart by id) are not among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PREFER = ("best", "last")  # what a run folder may stand for: RunDir.candidates


@dataclass(frozen=True)
class RunDir:
    """The files of one run folder (``RunDir(cfg.train.run_dir)``); nothing is created or written here."""

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
    run_file = property(lambda self: self.root / "run.json")
    stage = property(lambda self: self.root / "stage.json")

    def epoch(self, number: int) -> Path:
        """train.keep_epochs' weights of epoch ``number`` (1-based)."""
        return self.epochs / f"epoch-{number:03d}.pt"

    def epoch_snapshots(self) -> list[Path]:
        """The kept epochs' weights, oldest first."""
        return sorted(self.epochs.glob("epoch-*.pt"))

    def weights_hash(self, rank: int) -> Path:
        return self.root / f"weights-rank{rank}.sha256"

    def previous(self, stamp: str) -> Path:
        """Where a new run moves an earlier run's files (``stamp``: when, e.g. 20261203-111500)."""
        return self.root / f"previous-{stamp}"

    def run_outputs(self) -> list[Path]:
        """The entries a training run (and the demo's evaluation of it) writes here that exist now: a new run
        moves them aside rather than mixing its files with theirs (checkpoints, kept epochs, logs, results)."""
        named = [self.config, self.vocab, self.last, self.best, self.metrics, self.epochs, self.averaged,
                 self.run_file, self.finished, self.summary, self.overlays, self.tensorboard]
        return [p for p in named if p.exists()] + sorted(self.root.glob("weights-rank*.sha256"))

    def candidates(self, prefer: str = "best") -> tuple[Path, ...]:
        """The checkpoints a run folder may stand for, in order: ``prefer="best"``: best.pt, else last.pt (the model
        to caption with or start from; a run stopped before validating has only last.pt); ``"last"``: last.pt alone
        (the latest state, what --resume continues: best.pt may hold an earlier epoch)."""
        if prefer not in PREFER:
            raise ValueError(f"prefer={prefer!r}: a run folder stands for its {' or its '.join(map(repr, PREFER))} "
                             "checkpoint")
        return (self.best, self.last) if prefer == "best" else (self.last,)

    def checkpoint(self, prefer: str = "best") -> Path | None:
        """The checkpoint a run folder stands for (``candidates``): the first that exists; None when none does."""
        return next((p for p in self.candidates(prefer) if p.is_file()), None)

    def names(self, prefer: str = "best") -> tuple[str, ...]:
        """The file names ``checkpoint`` looks for, in order (for messages)."""
        return tuple(p.name for p in self.candidates(prefer))
