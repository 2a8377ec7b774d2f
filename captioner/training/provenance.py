"""Where and when a figure was measured, as records give it (issue 72): the CPU's model name, the checkout's commit
and the time. Standard library only: the benchmark scripts and the tests read the CPU name here too."""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the checkout the package runs from: its commit


def cpu_model() -> str:
    """The CPU's model name (lscpu's "Model name"), else what the platform says."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                             env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.strip().startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def commit() -> str | None:
    """The checkout's commit (git rev-parse HEAD), with "+changes" when its tracked files differ from it; None
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


def now() -> str:
    """The time now, to the second, with its UTC offset (ISO 8601): a record's date."""
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")
