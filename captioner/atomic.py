"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

Every file the project writes and later reads again (config.yaml beside a run, the metrics log, a shipped
model's JSON and weights, ``evaluate --out``, the demo's summary, ...) goes through ``atomic_path`` or
``write_text_atomic``: the bytes go to a hidden temp file in the target's directory (``.NAME.tmp-PID-RANDOM``),
are fsync'ed, and ``os.replace`` swaps it onto the target, then the directory is fsync'ed so the rename
survives a power cut. A crash, a kill or a full disk mid-write leaves the previous file intact; a killed
write can leave its temp file behind (a dot file not ending in the target's suffix: safe to delete).
Checkpoints have their own writer with the same steps (captioner/store/checkpoint.py).

A full disk is said as such: ``DiskFullError`` names the file and the free space left, whatever the writer
reported (ENOSPC from the OS, torch's zip writer's "unexpected pos", safetensors' "No space left on device").
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Iterator

# How writers report a full file system: the OS's errnos (EDQUOT: a user's quota, full all the same), and the
# text of writers that wrap them (torch's PytorchStreamWriter: "enforce fail at inline_container.cc:... unexpected
# pos N vs M" when a write came up short; safetensors: "No space left on device" / Rust's "StorageFull").
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_TEXT = re.compile(r"No space left on device|unexpected pos \d+ vs \d+|StorageFull|Disk quota exceeded")


class DiskFullError(OSError):
    """A write failed because the file system holding ``path`` is full; ``free`` is what it had left (bytes,
    None when unknown). The target was left as it was (see the module docstring)."""

    def __init__(self, path: str | Path, free: int | None, cause: BaseException | None = None,
                 action: str = "write", needed: int | None = None) -> None:
        self.path, self.free, self.needed = Path(path), free, needed
        left = "unknown" if free is None else format_bytes(free)
        quota = isinstance(cause, OSError) and cause.errno == errno.EDQUOT or "quota" in str(cause)
        full = "your disk quota is used up" if quota else "the disk is full"
        reason = f"; {type(cause).__name__}: {_first_line(cause)}" if cause is not None else ""
        need = f", {format_bytes(needed)} needed" if needed is not None else ""
        super().__init__(errno.ENOSPC, f"cannot {action} {path}: {full} ({left} free on the file system holding "
                                       f"{self.path.parent}{need}{reason}). Free some space or write elsewhere; the "
                                       f"previous file, if any, is intact and nothing was left half written")

    def __str__(self) -> str:
        return self.strerror


def format_bytes(n: int) -> str:
    """``n`` bytes for people: "0 B", "512 B", "3.2 MB", "1.5 GB"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` says the disk (or the user's quota) ran out of space."""
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return True
    return isinstance(err, Exception) and DISK_FULL_TEXT.search(str(err)) is not None


def disk_free(path: str | Path) -> int | None:
    """Bytes free on the file system holding ``path`` (its nearest existing folder), None when unknown."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def raise_if_disk_full(err: BaseException, path: str | Path, action: str = "write", needed: int | None = None) -> None:
    """Raise ``DiskFullError`` for ``path`` (from ``err``) when ``err`` is a full disk (``needed``: the bytes the
    write wanted, named in the message when known); otherwise return, and the caller re-raises or wraps ``err`` as
    it would."""
    if is_disk_full(err):
        raise DiskFullError(path, disk_free(Path(path).parent), err, action, needed) from err


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
    The parent directory is created. On an exception the temp file is removed and ``path`` is untouched; a full
    disk is raised as ``DiskFullError``, whatever the writer said."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the writer may not have fsync'ed: do it before the rename
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        free = disk_free(path.parent) if is_disk_full(err) else None  # measured while the partial file is there
        tmp.unlink(missing_ok=True)
        if is_disk_full(err) and not isinstance(err, DiskFullError):
            raise DiskFullError(path, free, err) from err
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
