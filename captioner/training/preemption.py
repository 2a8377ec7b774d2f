"""The preemption notice a scheduler sends a training run: SIGTERM (Slurm, Kubernetes, ``kill``) and SIGUSR1 (Slurm's
``--signal``, sent ahead of the time limit). The handler only notes the signal; the training loop
(captioner/training/loop.py) takes the stop as a decision of the whole job at the end of the batch in progress (the
ranks' notes all-reduced: a signal that reached one rank stops them all, whichever it was), saves ``last.pt`` and
stops every rank, saying how to continue (docs/usage.md, "Under a scheduler").
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

    @property
    def number(self) -> int:
        """The noted signal's number, 0 for none: what the loop reduces over the ranks (the largest wins)."""
        return 0 if self.signal is None else int(self.signal)

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

    def stop_if_noted(self, run_dir: Any, where: str, job_signal: int) -> None:
        """After a save: a signal noted by any rank of the job (``job_signal``: the largest ``number`` over the
        ranks, 0 for none) ends the run here on every rank (TrainingError), saying how to continue it. The message
        names this process's own signal, or says that another rank received one: each rank stops by itself rather
        than waiting for the process group's timeout at its next collective."""
        if not job_signal:
            return
        last, root = Path(run_dir.last), Path(run_dir.root)
        if self.signal is not None:
            why = f"stopped by {signal.Signals(self.signal).name} {where}"
        else:
            why = f"stopped {where}: another rank of the job received {_signal_name(job_signal)}"
        raise TrainingError(f"{why}: {last} holds where it stopped; the same command with --resume {root} "
                            "continues it exactly")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a number this platform does not name
        return f"signal {number}"


PREEMPTION = Preemption()  # one per process: signal handlers are process-wide
