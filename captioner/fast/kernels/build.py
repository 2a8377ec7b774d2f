"""Building, caching and loading the fused kernels' shared library (fused.c) so that nothing planted can run.

A shared library runs code the moment it is loaded (its constructors), so the cache is trusted only as far
as nobody else can write to it:

- The library is compiled once per source, flags, compiler version and CPU (-march=native) into
  ``$CAPTIONER_KERNEL_CACHE`` (default ``~/.cache/captioner/kernels``), created with mode 0700.
- That directory and the cached file are used only when they belong to this user and are not writable by
  group or others. Otherwise one warning names the path and the library is built into a private temporary
  directory instead (and deleted once loaded: the mapping stays).
- Any failure to load a cached library or to bind its symbols (a corrupt file, a file from elsewhere that
  lacks a function) triggers one rebuild, which replaces the cached file. If the rebuilt library fails too,
  ``KernelUnavailable`` says why and the caller (``kernels.available``) falls back to PyTorch with one warning.
- The compiler runs with a timeout (``$CAPTIONER_KERNEL_BUILD_TIMEOUT`` seconds, default 300), in its own
  process group so its children (cc1, as, ld) are killed with it.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import signal
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Callable

SOURCE = Path(__file__).with_name("fused.c")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC")
_LDFLAGS = ("-shared", "-fopenmp", "-lm")  # no -ffast-math anywhere: it would change the process's float modes
BUILD_TIMEOUT_ENV = "CAPTIONER_KERNEL_BUILD_TIMEOUT"
DEFAULT_BUILD_TIMEOUT_S = 300.0  # a cold build takes seconds; a wedged compiler must not hang the caller
VERSION_TIMEOUT_S = 30.0


class KernelUnavailable(RuntimeError):
    """The fused kernels could not be built or loaded (the message says why)."""


def _cpu_tag() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return platform.machine() + "\n".join(sorted(set(keep)))


def cache_dir() -> Path:
    root = os.environ.get("CAPTIONER_KERNEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "captioner" / "kernels"


def build_timeout() -> float:
    text = os.environ.get(BUILD_TIMEOUT_ENV, "")
    try:
        return float(text) if text else DEFAULT_BUILD_TIMEOUT_S
    except ValueError:
        raise KernelUnavailable(f"{BUILD_TIMEOUT_ENV}={text!r} is not a number of seconds") from None


def run_compiler(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` with captured output, killed with its whole process group after ``timeout`` seconds."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as err:  # not found, not executable
        raise KernelUnavailable(f"cannot run {cmd[0]}: {err}") from err
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the compiler's children hold the pipes open otherwise
        proc.communicate()
        raise KernelUnavailable(f"`{' '.join(cmd)}` timed out after {timeout:g} s (set {BUILD_TIMEOUT_ENV} "
                                "to allow longer)") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def find_compiler() -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on PATH (None: no compiler)."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compiler_version(compiler: str) -> str:
    """``compiler --version``'s output: part of the cache key, so an upgraded compiler builds anew."""
    proc = run_compiler([compiler, "--version"], min(VERSION_TIMEOUT_S, build_timeout()))
    if proc.returncode != 0:
        raise KernelUnavailable(f"`{compiler} --version` failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def library_path(directory: Path, compiler: str, version: str) -> Path:
    """Where the library for this source, flags, compiler (and its version) and CPU lives in ``directory``."""
    material = SOURCE.read_bytes() + repr((compiler, version, CFLAGS, _LDFLAGS)).encode() + _cpu_tag().encode()
    return directory / f"fused-{hashlib.sha256(material).hexdigest()[:16]}.so"


def untrusted(path: Path, directory: bool) -> str | None:
    """Why ``path`` must not be loaded from (None: it may): not this user's, writable by group or others, or
    not a regular file / directory."""
    st = os.stat(path)
    kind = "directory" if directory else "file"
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        return f"{path} is not a regular {kind}"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"the {kind} {path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the {kind} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _compile(compiler: str, out_dir: Path) -> Path:
    """fused.c -> out_dir/fused.so (mode 0755), or KernelUnavailable with the compiler's message."""
    obj, out = out_dir / "fused.o", out_dir / "fused.so"
    timeout = build_timeout()
    for cmd in ([compiler, *CFLAGS, "-c", str(SOURCE), "-o", str(obj)],
                [compiler, str(obj), *_LDFLAGS, "-o", str(out)]):
        proc = run_compiler(cmd, timeout)
        if proc.returncode != 0:
            raise KernelUnavailable(f"`{' '.join(cmd)}` failed:\n{proc.stderr.strip()[-2000:]}")
    out.chmod(0o755)  # whatever the umask: a group-writable file would be refused next time
    return out


def _load(path: Path, bind: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL:
    """dlopen ``path`` and declare its functions; any failure (bad file, missing symbol) is KernelUnavailable."""
    try:
        lib = ctypes.CDLL(str(path))
        bind(lib)
    except Exception as err:  # noqa: BLE001 - OSError from dlopen, AttributeError for a missing symbol, ...
        raise KernelUnavailable(f"{path} does not load: {type(err).__name__}: {err}") from err
    return lib


def _build_and_load(compiler: str, target: Path | None, bind: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL:
    """Compile into a fresh private directory and load from there (a new path, so dlopen cannot hand back an
    earlier, broken library of the same name); then move the file to ``target`` (the cache), if given."""
    parent = target.parent if target is not None else None
    tmp = Path(tempfile.mkdtemp(prefix="captioner-kernels-", dir=parent))  # mode 0700
    try:
        built = _compile(compiler, tmp)
        lib = _load(built, bind)
        if target is not None:
            os.replace(built, target)  # atomic: concurrent builders leave one complete file
        return lib
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _usable_cache(directory: Path) -> str | None:
    """Create the cache directory (0700) if needed; None when it can be trusted, else why not."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return untrusted(directory, directory=True)
    except OSError as err:
        return f"the cache directory {directory} cannot be used ({err.strerror or err})"


def load_library(compiler: str, bind: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL:
    """The fused kernels, bound by ``bind``: from the cache when it is trustworthy and loads, else built
    (once more at most); KernelUnavailable with the reason when they cannot be had."""
    directory = cache_dir()
    target = library_path(directory, compiler, compiler_version(compiler))
    problem = _usable_cache(directory)
    if problem is not None:
        warnings.warn(f"captioner: the fused kernels' cache is not used: {problem}; building them into a private "
                      "temporary directory instead", RuntimeWarning, stacklevel=3)
        return _build_and_load(compiler, None, bind)
    if target.exists():
        problem = untrusted(target, directory=False)
        if problem is None:
            try:
                return _load(target, bind)
            except KernelUnavailable:
                pass  # a corrupt or foreign file: rebuilt below, which replaces it
        else:
            warnings.warn(f"captioner: the cached fused kernels are not loaded: {problem}; rebuilding them",
                          RuntimeWarning, stacklevel=3)
    try:
        return _build_and_load(compiler, target, bind)
    except OSError as err:  # the cache is not writable, the disk is full, ...
        raise KernelUnavailable(f"building with {compiler} into {directory} failed: {err}") from err
