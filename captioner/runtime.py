"""Process-wide settings for speed on the CPU.

keep_freed_memory(): glibc's malloc serves large blocks with mmap and returns them to the kernel when they
are freed, and frees the top of its heap past a trim threshold. A training step allocates and frees the
same large tensors every step (the R7 benchmark's (672, 10,000) logits and their gradient are 27 MB each),
so each step faulted those pages in afresh: the profiler charged 135 ms of a 0.9 s step (2 threads, shared
machine) to the first pass over one fresh 27 MB buffer. Serving blocks of up to 32 MB (glibc's largest
mmap threshold) from the heap and keeping the freed heap lets the next step reuse the same pages; peak RSS
is unchanged in the benchmark (scripts/bench.py reports it). It changes nothing but where memory comes from.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_applied = False


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (module docstring); True when applied. A no-op
    returning False outside Linux/glibc. Idempotent."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    return _applied
