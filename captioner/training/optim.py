"""The optimizers training builds, with PyTorch's fused kernels where the installed version has them.

Fused Adam (one kernel per parameter group for the whole update) took 20 ms against 77 ms for the default
multi-tensor ("foreach") Adam on the 18 M parameters of the R7 benchmark decoder, 2 CPU threads (PyTorch
2.14); it exists on the CPU from PyTorch 2.4 and on CUDA. The result differs from the foreach update by
rounding only (at most one float32 ulp per step in a check of five steps).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from captioner import fast
from captioner.names import OPTIMIZERS  # named below the config, which checks train.optimizer


def build_optimizer(name: str, params: Iterable[Any], lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """``name`` in OPTIMIZERS over ``params`` (tensors or parameter-group dicts); Adam is fused when supported
    (and the single-tensor Adam under the reference switch, captioner/fast)."""
    params = list(params)
    if name == "adam" and not fast.enabled():
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=False)
    if name == "adam":
        try:
            return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError, ValueError):  # an older PyTorch, or a device without the fused kernel
            return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
