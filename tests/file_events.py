"""Which files code opens for writing and renames, seen through Python's audit events (shared by the tests of
atomic writes and of the demo server's uploads).

``with file_events() as events:`` records ("write", path) for every open with a write mode or flags (an
O_TMPFILE anonymous temp file records its directory) and ("rename", destination) for os.rename / os.replace,
from every thread of the process, while the block runs."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_recording: list[list[tuple[str, str]]] = []  # the active recorders' event lists


def _audit(event: str, args: tuple) -> None:
    if not _recording:
        return
    if event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in str(mode) for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        if writes and isinstance(path, (str, bytes, os.PathLike)):
            _recording[-1].append(("write", os.path.abspath(os.fsdecode(path))))
    elif event == "os.rename":
        _recording[-1].append(("rename", os.path.abspath(os.fsdecode(args[1]))))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside `file_events`


@contextlib.contextmanager
def file_events() -> Iterator[list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    _recording.append(events)
    try:
        yield events
    finally:
        _recording.remove(events)
