"""8-bit weights with group-wise scales: how a model folder's ``dtype: int8`` weights are written and read.

Each floating matrix (a tensor of two or more dimensions, viewed as rows of its last dimension) is cut into groups
of ``GROUP`` consecutive entries of a row; each group keeps one scale, its largest magnitude over 127 rounded *up*
to a float16, and its entries as round(x / scale) in int8 (symmetric absmax quantization; the finer the groups, the
less one large weight costs its neighbours: per-row scales changed 11 in 300 captions of the shipped model, as issue
61 reports). Rounded up, no entry divides by its scale to more than 127, so none is clipped; a tensor with a scale
that float16 cannot hold (above 65504, or below its normal range, where a float16 keeps too few bits) keeps float32
scales, all of them. Vectors (biases, gates) stay float16: they are few and a scale per entry would save nothing.
Writing refuses weights that are not finite (one inf made its whole group NaN) and vectors beyond float16's range,
naming the tensor. Reading gives float32: ``q * scale``, and refuses scales that are negative or not finite.

In the safetensors file the int8 tensor keeps its name and shape, and its scales sit beside it under
``NAME + SCALE_SUFFIX`` with shape (rows, groups); no state-dict key contains the suffix's ``#``. The group size
reading needs travels in the file's header (store/hub.py), under the file's SHA-256.
"""

from __future__ import annotations

import math

import torch

GROUP = 64  # entries per scale: 1/32 of a byte per weight on top of its int8 (float16 scales)
SCALE_SUFFIX = "#scale"
LEVELS = 127  # symmetric: -127..127 (-128 unused, so that -x quantizes to -q)
FLOAT16 = torch.finfo(torch.float16)  # a scale in [tiny, max] (or 0: a group of zeros) is held as a float16


def is_scale_key(key: str) -> bool:
    return key.endswith(SCALE_SUFFIX)


def quantizes(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is stored as int8 (a floating matrix) rather than float16 (a vector or a scalar)."""
    return tensor.is_floating_point() and tensor.dim() >= 2


def check_group(group: int) -> int:
    """``group``, refused by name unless it is an integer of at least 1 (the entries that share one scale)."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group size {group!r}: the entries per int8 scale must be an integer of at least 1")
    return group


def _not_finite(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` cannot be stored (some entries inf or NaN), or None."""
    bad = int((~torch.isfinite(tensor)).sum())
    return f"{bad} of its {tensor.numel()} entries are not finite (inf or NaN)" if bad else None


def _next_up_half(h: torch.Tensor) -> torch.Tensor:
    """The next float16 above each of ``h`` (non-negative: the bit pattern counts up; 65504 goes to inf)."""
    return (h.view(torch.int16) + 1).view(torch.float16)


def scales_for(amax: torch.Tensor) -> torch.Tensor:
    """The scale of groups whose largest magnitudes are ``amax`` (R, G): each the smallest float16 at or above
    amax / 127, so that no entry divides to more than 127 (rounded to nearest, a scale could fall short and clip a
    group's largest entries: below float16's normal range by a quarter); float32 (rounded up too) for them all
    when one of them is not a normal float16 (nor 0) or overflows it."""
    exact = amax.double() / LEVELS  # (R, G)
    half = exact.half()
    half = torch.where(half.double() < exact, _next_up_half(half), half)  # rounded up
    if bool(((half == 0) | ((half >= FLOAT16.tiny) & (half <= FLOAT16.max))).all()):
        return half
    single = exact.float()
    return torch.where(single.double() < exact, torch.nextafter(single, torch.tensor(math.inf)), single)


def quantize(tensor: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values of ``tensor``'s shape, scales (rows, groups): float16, or float32 where float16 cannot hold
    them) for a floating matrix. A ValueError when some entry is not finite."""
    group = check_group(group)
    x = tensor.detach().float().reshape(-1, tensor.shape[-1])  # (R, C): rows of the last dimension
    why = _not_finite(x)
    if why:
        raise ValueError(why)
    R, C = x.shape
    G = math.ceil(C / group)
    padded = torch.nn.functional.pad(x, (0, G * group - C))  # (R, G * group): zeros do not raise a group's max
    groups = padded.view(R, G, group)  # (R, G, group)
    # The scale is rounded first, and the entries divided by that rounded scale, so that reading (q * scale) meets
    # exactly the scale the entries were rounded against. (Clipping the largest entry to round the rest finer,
    # tried, never lowered a group's squared error at 8 bits and 64 entries.)
    scale = scales_for(groups.abs().amax(dim=2))  # (R, G)
    divisor = scale.float().unsqueeze(2)  # (R, G, 1)
    q = torch.where(divisor > 0, groups / divisor.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    q = q.round().clamp(-LEVELS, LEVELS).to(torch.int8).view(R, G * group)[:, :C]  # (R, C)
    return q.reshape(tensor.shape).contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """The float32 weights that ``quantize`` stored as ``q`` (int8) and ``scale`` (rows, groups); a ValueError when
    the scales do not fit ``q`` or are negative or not finite (a damaged file)."""
    group = check_group(group)
    rows = q.reshape(-1, q.shape[-1])  # (R, C)
    R, C = rows.shape
    if scale.shape != (R, math.ceil(C / group)):
        raise ValueError(f"scales of shape {tuple(scale.shape)} do not fit int8 weights of shape {tuple(q.shape)} "
                         f"(expected {(R, math.ceil(C / group))} for groups of {group})")
    if not scale.is_floating_point():
        raise ValueError(f"scales of dtype {scale.dtype}, not floating point")
    bad = ~torch.isfinite(scale) | (scale < 0)  # (R, G)
    if bool(bad.any()):
        first = float(scale[bad][0])
        raise ValueError(f"{int(bad.sum())} of its {scale.numel()} scales are negative or not finite "
                         f"(the first: {first}); a scale is a group's largest magnitude over {LEVELS}")
    per_entry = scale.float().repeat_interleave(group, dim=1)[:, :C]  # (R, C)
    return (rows.float() * per_entry).reshape(q.shape)


def pack(tensors: dict[str, torch.Tensor], group: int = GROUP) -> dict[str, torch.Tensor]:
    """A state dict as a model folder's int8 file holds it: matrices as int8 + scales, other floats as float16.
    A ValueError naming the tensor when one holds an entry that is not finite, or a vector one beyond float16."""
    group = check_group(group)
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if quantizes(value):
            try:
                out[key], out[key + SCALE_SUFFIX] = quantize(value, group)
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None
        elif value.is_floating_point():
            why = _not_finite(value)
            if why is None and value.numel() and float(value.abs().max()) > FLOAT16.max:
                why = f"an entry of magnitude {float(value.abs().max()):g}, beyond float16's {FLOAT16.max:g}"
            if why:
                raise ValueError(f"{key}: {why}")
            out[key] = value.half().contiguous()
        else:
            out[key] = value.contiguous()
    return out


def unpack(tensors: dict[str, torch.Tensor], group: int = GROUP) -> dict[str, torch.Tensor]:
    """The state dict that ``pack`` stored: every int8 tensor with its scales read back as float32. Raises a
    ValueError naming the tensor when an int8 tensor lacks its scales, scales lack their tensor, or its scales do
    not fit it or are negative or not finite; naming the group size when it is below 1."""
    group = check_group(group)
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
