"""The preemption notice a scheduler sends a training run: SIGTERM (Slurm, Kubernetes, ``kill``) and SIGUSR1 (Slurm's
``--signal``, sent ahead of the time limit). The handler only notes the signal; the training loop
(captioner/training/loop.py) saves ``last.pt`` at the end of the batch in progress, every rank alike, and stops, saying
how to continue (docs/usage.md, "Under a scheduler").
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

from captioner.training.errors import TrainingError


class Preemption:
    """Whether a preemption signal arrived while training (``listening``)."""

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self) -> None:
        self.signal: int | None = None

    @property
    def noted(self) -> bool:
        return self.signal is not None

    def note(self, signum: int, frame: Any) -> None:
        self.signal = signum

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Note the signals while training (main thread only: elsewhere Python cannot install handlers); outside it
        they act as they did before (a SIGTERM during set-up or extraction ends the process at once)."""
        self.signal = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {}
        for name in self.SIGNALS:
            if hasattr(signal, name):
                number = getattr(signal, name)
                previous[number] = signal.signal(number, self.note)
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def stop_if_noted(self, run_dir: Any, where: str) -> None:
        """After a save: a noted signal ends the run here (TrainingError), saying how to continue it."""
        if self.signal is None:
            return
        name = signal.Signals(self.signal).name
        last, root = Path(run_dir.last), Path(run_dir.root)
        raise TrainingError(f"stopped by {name} {where}: {last} holds where it stopped; the same command with "
                            f"--resume {root} continues it exactly")


PREEMPTION = Preemption()  # one per process: signal handlers are process-wide
