"""Process set-up for training: device and DDP process group, collective helpers, and the RNG
states of a process as plain tensors (so a checkpoint holding them loads with weights_only=True).

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without it everything runs as rank 0 of 1 and the
collectives are no-ops.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. non-finite losses in a row); the message says why and what to try."""


# --------------------------------------------------------------------------- process / device


def setup_distributed(device_name: str) -> tuple[int, int, torch.device]:
    """(rank, world_size, device). torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; gloo on CPU, nccl on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_name == "auto":
        device_name = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif device_name == "cuda":
        device_name = f"cuda:{local_rank}"
    device = torch.device(device_name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainingError(f"train.device={device_name} but CUDA is not available; use train.device=cpu or auto")
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
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


# --------------------------------------------------------------------------- RNG state as plain data


def rng_state() -> dict:
    """This process's RNG states in a form torch.load(weights_only=True) reads back."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], torch.tensor(py_state[1], dtype=torch.int64), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_rng_states(world: int) -> list[dict]:
    if world == 1:
        return [rng_state()]
    states: list[Any] = [None] * world
    dist.all_gather_object(states, rng_state())
    return states


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
