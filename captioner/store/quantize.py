"""8-bit weights with group-wise scales: how a model folder's ``dtype: int8`` weights are written and read.

Each floating matrix (a tensor of two or more dimensions, viewed as rows of its last dimension) is cut into groups
of ``GROUP`` consecutive entries of a row; each group keeps one float16 scale, its largest magnitude over 127, and
its entries as round(x / scale) in int8 (symmetric absmax quantization; the finer the groups, the less one large
weight costs its neighbours: per-row scales changed 11 in 300 captions of the shipped model, as issue 61
reports). Vectors (biases, gates) stay float16: they are few and a scale per entry would save nothing. Reading
gives float32: ``q * scale``.

In the safetensors file the int8 tensor keeps its name and shape, and its scales sit beside it under
``NAME + SCALE_SUFFIX`` with shape (rows, groups); no state-dict key contains the suffix's ``#``.
"""

from __future__ import annotations

import math

import torch

GROUP = 64  # entries per scale: 1/32 of a byte per weight on top of its int8 (float16 scales)
SCALE_SUFFIX = "#scale"
LEVELS = 127  # symmetric: -127..127 (-128 unused, so that -x quantizes to -q)


def is_scale_key(key: str) -> bool:
    return key.endswith(SCALE_SUFFIX)


def quantizes(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is stored as int8 (a floating matrix) rather than float16 (a vector or a scalar)."""
    return tensor.is_floating_point() and tensor.dim() >= 2


def quantize(tensor: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values of ``tensor``'s shape, float16 scales (rows, groups)) for a floating matrix."""
    x = tensor.detach().float().reshape(-1, tensor.shape[-1])  # (R, C): rows of the last dimension
    R, C = x.shape
    G = math.ceil(C / group)
    padded = torch.nn.functional.pad(x, (0, G * group - C))  # (R, G * group): zeros do not raise a group's max
    groups = padded.view(R, G, group)  # (R, G, group)
    # The scale is rounded to float16 first, and the entries divided by that rounded scale, so that reading
    # (q * scale) meets exactly the scale the entries were rounded against. (Clipping the largest entry to round
    # the rest finer, tried, never lowered a group's squared error at 8 bits and 64 entries.)
    scale = (groups.abs().amax(dim=2) / LEVELS).half()  # (R, G)
    divisor = scale.float().unsqueeze(2)  # (R, G, 1)
    q = torch.where(divisor > 0, groups / divisor.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    q = q.round().clamp(-LEVELS, LEVELS).to(torch.int8).view(R, G * group)[:, :C]  # (R, C)
    return q.reshape(tensor.shape).contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """The float32 weights that ``quantize`` stored as ``q`` (int8) and ``scale`` (rows, groups)."""
    rows = q.reshape(-1, q.shape[-1])  # (R, C)
    R, C = rows.shape
    if scale.shape != (R, math.ceil(C / group)):
        raise ValueError(f"scales of shape {tuple(scale.shape)} do not fit int8 weights of shape {tuple(q.shape)} "
                         f"(expected {(R, math.ceil(C / group))} for groups of {group})")
    per_entry = scale.float().repeat_interleave(group, dim=1)[:, :C]  # (R, C)
    return (rows.float() * per_entry).reshape(q.shape)


def pack(tensors: dict[str, torch.Tensor], group: int = GROUP) -> dict[str, torch.Tensor]:
    """A state dict as a model folder's int8 file holds it: matrices as int8 + scales, other floats as float16."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if quantizes(value):
            out[key], out[key + SCALE_SUFFIX] = quantize(value, group)
        else:
            out[key] = (value.half() if value.is_floating_point() else value).contiguous()
    return out


def unpack(tensors: dict[str, torch.Tensor], group: int = GROUP) -> dict[str, torch.Tensor]:
    """The state dict that ``pack`` stored: every int8 tensor with its scales read back as float32. Raises a
    ValueError naming the tensor when an int8 tensor lacks its scales or scales lack their tensor."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if is_scale_key(key):
            owner = key.removesuffix(SCALE_SUFFIX)
            if owner not in tensors or tensors[owner].dtype != torch.int8:
                raise ValueError(f"{key}: scales without an int8 tensor {owner!r}")
            continue
        if value.dtype == torch.int8:
            scale = tensors.get(key + SCALE_SUFFIX)
            if scale is None:
                raise ValueError(f"{key}: int8 weights without their scales ({key + SCALE_SUFFIX})")
            try:
                out[key] = dequantize(value, scale, group)
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None
        else:
            out[key] = value
    return out
