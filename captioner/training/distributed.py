"""Process set-up for training: device and DDP process group, collective helpers, and the RNG
states of a process as plain tensors (so a checkpoint holding them loads with weights_only=True).

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without it everything runs as rank 0 of 1 and the
collectives are no-ops.
"""

from __future__ import annotations

import os
import random
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from captioner.training.errors import TrainingError

# --------------------------------------------------------------------------- process / device


def setup_distributed(device_name: str, timeout_min: float = 60.0, backend: str = "auto"
                      ) -> tuple[int, int, torch.device]:
    """(rank, world_size, device). torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; ``backend`` auto is gloo on the CPU,
    nccl on CUDA. The device follows runtime.resolve_device (``train.device``; under torchrun each process takes GPU
    LOCAL_RANK). The process group waits ``timeout_min`` at a collective: the other ranks wait there while rank 0
    validates."""
    from datetime import timedelta

    from captioner.runtime import resolve_device

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        device = resolve_device(device_name, "train.device", local_rank=local_rank if world > 1 else None)
    except ValueError as err:
        raise TrainingError(str(err)) from None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=timeout_min))
    return rank, world, device


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def broadcast_flag(flag: bool, world: int, device: torch.device) -> bool:
    """Rank 0's decision (early stop, time budget) for everyone, so no rank waits forever."""
    if world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def max_over_ranks(values: Sequence[int], world: int, device: torch.device) -> list[int]:
    """Each of ``values`` (small non-negative integers: flags, signal numbers) as its largest over every rank, in one
    all-reduce: what any one process saw (a signal only it received, its own clock) becomes the whole job's decision
    at the same step, where ``broadcast_flag`` would keep rank 0's alone and lose the others'."""
    if world == 1:
        return [int(v) for v in values]
    t = torch.tensor([float(v) for v in values], device=device)  # float: every backend reduces it (exact < 2**24)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


# --------------------------------------------------------------------------- RNG state as plain data


def rng_state(device: torch.device | None = None) -> dict:
    """This process's RNG states in a form torch.load(weights_only=True) reads back: the CPU's, NumPy's, Python's
    and, on CUDA, its own GPU's only (a resume on a machine with fewer GPUs visible restores just as well)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], torch.tensor(py_state[1], dtype=torch.int64), py_state[2]],
    }
    if device is not None and device.type == "cuda":
        state["cuda_device"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))
    if device is None or device.type != "cuda":
        return
    if "cuda_device" in state:
        torch.cuda.set_rng_state(state["cuda_device"], device)
    elif "cuda" in state and device.index < len(state["cuda"]):  # saved before: every visible GPU's, in order
        torch.cuda.set_rng_state(state["cuda"][device.index], device)


def gather_rng_states(world: int, device: torch.device | None = None) -> list[dict]:
    if world == 1:
        return [rng_state(device)]
    states: list[Any] = [None] * world
    dist.all_gather_object(states, rng_state(device))
    return states


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
