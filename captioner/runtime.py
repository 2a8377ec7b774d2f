"""Process-wide settings: memory reuse on the CPU, the device rule every command shares, TF32 on CUDA.

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
import os
import sys
import warnings
from typing import Any

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


# --------------------------------------------------------------------------- devices

DEVICE_HELP = "auto (CUDA when present, else the CPU), cpu, cuda or cuda:N; default auto"


# Set (e.g. to "cpu"), what "auto" means in this process and its children: the test suite sets cpu, so that a test
# means the CPU on a machine with a GPU too; tests marked ``gpu`` name their device
AUTO_DEVICE_ENV = "CAPTIONER_AUTO_DEVICE"


class DeviceError(ValueError):
    """A device a command or config asks for that this machine cannot give; the message names the setting."""


def resolve_device(name: str, setting: str = "--device", local_rank: int | None = None) -> Any:
    """The one device rule of every command and of ``load_captioner``: ``name`` -> torch.device.

    "auto" is CUDA when present, else the CPU. A CUDA device without CUDA, or past the last GPU, is refused
    naming ``setting`` (the flag or config key it came from). Under torchrun (``local_rank`` given) each process
    owns GPU LOCAL_RANK: "auto" and "cuda" map there, and an explicit "cuda:N" that is not LOCAL_RANK is
    replaced by it, with a warning, rather than putting every rank on one GPU."""
    import torch

    if name == "auto" and os.environ.get(AUTO_DEVICE_ENV):
        name = os.environ[AUTO_DEVICE_ENV]
        setting = f"{AUTO_DEVICE_ENV} (what {setting}=auto means)"
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        device = torch.device("cuda", local_rank or 0)
    else:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise DeviceError(f"{setting}={name!r}: not a device; valid: {DEVICE_HELP}") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise DeviceError(f"{setting}={name}: CUDA is not available on this machine (torch {torch.__version__}, "
                          f"torch.cuda.is_available() is False); use {setting}=cpu or auto")
    index = device.index if device.index is not None else (local_rank or 0)
    if local_rank is not None and index != local_rank:
        warnings.warn(f"{setting}={name} under torchrun: each process uses its own GPU, so this one (LOCAL_RANK "
                      f"{local_rank}) uses cuda:{local_rank}", stacklevel=2)
        index = local_rank
    if index >= torch.cuda.device_count():
        raise DeviceError(f"{setting}={name}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                          f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return torch.device("cuda", index)


def as_device(device: Any, setting: str = "device") -> Any:
    """``device`` as a torch.device, resolved once per call chain: a torch.device is one already chosen (a command
    resolves its --device with ``resolve_device`` and passes the result down; ``api.load_captioner`` passes its own
    to the loaders it calls) and is used as it is; a name ("auto", "cpu", "cuda:1") goes through ``resolve_device``
    here, refused naming ``setting`` when this machine cannot give it."""
    import torch

    if isinstance(device, torch.device):
        cuda_missing = device.type == "cuda" and (
            not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count())
        if not cuda_missing:
            return device
        device = str(device)  # one this machine lacks (a Python caller's): the rule's clear refusal
    return resolve_device(device, setting)


def describe_device(device: Any, requested: str) -> str:
    """What a command prints about the device it chose, e.g. ``device cuda:0 (NVIDIA H100; asked: auto)``."""
    import torch

    if device.type == "cuda":
        return f"device {device} ({torch.cuda.get_device_name(device)}; asked: {requested})"
    if requested == "auto" and os.environ.get(AUTO_DEVICE_ENV):
        return f"device {device} (asked: auto, which {AUTO_DEVICE_ENV}={os.environ[AUTO_DEVICE_ENV]} sets)"
    return f"device {device} (asked: {requested}{'; no CUDA on this machine' if requested == 'auto' else ''})"


def enable_tf32(enabled: bool) -> None:
    """On CUDA, float32 matmuls and convolutions on tensor cores in TF32 (10-bit mantissa; ampere and later), the
    rate those cards are built for, or strict float32 (``enabled`` False). Nothing changes on the CPU."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")
