"""Inference-time caches of tensors built from a module's weights (for the fast decoders' decoding steps).

A decoding step reads the same stacked, transposed or packed copies of the weights at every word; they are
built once per set of weights and kept until a weight changes. A tensor's ``_version`` counts in-place updates
(load_state_dict, p.add_()), but fused optimizer kernels (Adam(fused=True)) do not bump it, so the count of
optimizer steps taken in this process is part of the key too. That count comes from a process-wide optimizer
post-step hook, installed explicitly (``count_optimizer_steps``: the fast decoders call it when built), never
on import.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

_OPTIMIZER_STEPS = [0]  # optimizer steps taken in this process (any optimizer), once count_optimizer_steps ran
_HOOK: list[Any] = []  # the installed hook's handle


def _count(optimizer, args, kwargs) -> None:
    _OPTIMIZER_STEPS[0] += 1


def count_optimizer_steps() -> None:
    """Install the process-wide optimizer post-step hook that invalidates every InferenceCache (idempotent)."""
    if not _HOOK:
        _HOOK.append(register_optimizer_step_post_hook(_count))


def column_major(weight: Tensor) -> Tensor:
    """For inference: a copy of ``weight`` (out, in) with its values stored column by column (strides (1, out)).
    x @ weight.t() is then a matmul of two row-major operands, which MKL runs faster for the few rows of a
    decoding step where its packed GEMM does not serve (StepWeight; scripts/bench.py's shapes, 2 threads: L_o
    for 32 rows 3.5 -> 1.8 ms, the stacked h_{t-1} weights 0.84 -> 0.58 ms; no gain from 160 rows on)."""
    return weight.t().contiguous().t()


class InferenceCache:
    """Named values built from tensors, rebuilt when one of the tensors is replaced or changed in place, or an
    optimizer steps (module docstring). For inference only: nothing here is differentiable."""

    def __init__(self) -> None:
        count_optimizer_steps()
        self._entries: dict[str, tuple[tuple, Any]] = {}

    def get(self, name: str, tensors: list[Tensor], build: Callable[[], Any]) -> Any:
        """build() cached under ``name`` for the current versions of ``tensors``."""
        key = (_OPTIMIZER_STEPS[0], *((t.data_ptr(), t._version) for t in tensors))
        entry = self._entries.get(name)
        if entry is None or entry[0] != key:
            entry = self._entries[name] = (key, build())
        return entry[1]


def module_cache(module: Any) -> InferenceCache:
    """``module``'s InferenceCache (weights restacked for decoding steps, not in its state_dict), made at first
    use."""
    cache = module.__dict__.get("_inference_cache")
    if cache is None:
        cache = module.__dict__["_inference_cache"] = InferenceCache()
    return cache
