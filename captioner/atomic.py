"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

Every file the project writes and later reads again (config.yaml beside a run, the metrics log, a shipped
model's JSON and weights, ``evaluate --out``, the demo's summary, ...) goes through ``atomic_path`` or
``write_text_atomic``: the bytes go to a hidden temp file in the target's directory (``.NAME.tmp-PID-RANDOM``),
are fsync'ed, and ``os.replace`` swaps it onto the target, then the directory is fsync'ed so the rename
survives a power cut. A crash, a kill or a full disk mid-write leaves the previous file intact; a killed
write can leave its temp file behind (a dot file not ending in the target's suffix: safe to delete).
Checkpoints have their own writer with the same steps (captioner/store/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator


def temp_name(path: Path) -> Path:
    """A fresh hidden temp file name beside ``path`` (same directory: os.replace stays a rename)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path`` for a writer that takes a file name (safetensors, savefig, ...);
    when the block ends without an exception, the file written there replaces ``path`` atomically.
    The parent directory is created. On an exception the temp file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the writer may not have fsync'ed: do it before the rename
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring). The file's mode follows the umask,
    as for an ordinary write."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see the module docstring)."""
    write_bytes_atomic(path, text.encode(encoding))
