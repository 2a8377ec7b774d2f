"""Weight gradients of a recurrence formed once per sequence instead of once per step.

The decoder's LSTM multiplies the same weight W (out, in) by a small input x_t at every step t:
y_t = base_t + x_t @ W^T. Plain autograd forms dW_t = dy_t^T x_t at each step of the backward pass (a thin
(out, n) @ (n, in) product, n the batch, about 32 rows) and adds it into an (out, in) accumulator: T thin
matmuls and T full-size additions. dW = sum_t dy_t^T x_t = G^T X is one matmul over all steps' rows
stacked, which is what this module computes, after every step's backward has run.

    word, context = step_weights(lstm.weight_ih, splits=(E, Z))    # once per sequence: column blocks
    y_t = context.addmm(base_t, z_t)                                # every step: base_t + z_t @ W[:, E:]^T

How: W enters the graph once, through `_Alias`, which hands out its column blocks as views. Each step's
`_StepMatmul` returns the input gradients (dbase = dy, dx = dy @ W_block) but no weight gradient; it stores
dy_t instead. The autograd engine runs `_Alias`'s backward only after every node that uses its outputs has
run, i.e. after all the steps' backwards; it then writes each block's G^T X straight into its columns of
one fresh (out, in) gradient, in the parameter's own layout (no zero fill, no slice copies, no transposed
copy when the gradient is accumulated). The inputs x_t are kept (detached) in the forward pass, as autograd
would keep them for dW_t anyway. tests/test_fast_paths.py checks the gradients against the plain per-step
computation (``defer=False``), which is also what runs without autograd.

StepWeight also runs the forward matmuls of few-row steps on a weight packed once by MKL (its docstring).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from captioner import fast


class _Record:
    """The steps of one sequence, per column block: inputs x_t (forward order), output gradients dy_t (by step)."""

    def __init__(self, blocks: int) -> None:
        self.inputs: list[list[Tensor]] = [[] for _ in range(blocks)]
        self.grads: list[dict[int, Tensor]] = [{} for _ in range(blocks)]


class _Alias(torch.autograd.Function):
    """Column blocks of the weight (views); the backward forms every block's G^T X once all steps are done."""

    @staticmethod
    def forward(ctx, weight: Tensor, record: _Record, bounds: tuple[int, ...]):
        ctx.record, ctx.bounds = record, bounds
        ctx.shape, ctx.dtype, ctx.device = weight.shape, weight.dtype, weight.device
        ctx.set_materialize_grads(False)
        return tuple(weight[:, a:b] for a, b in zip(bounds[:-1], bounds[1:]))

    @staticmethod
    def backward(ctx, *block_grads: Tensor | None):
        record, bounds = ctx.record, ctx.bounds
        dweight = torch.empty(ctx.shape, dtype=ctx.dtype, device=ctx.device)
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            steps = sorted(record.grads[i])  # steps whose output reached the loss
            out = dweight[:, a:b]  # (out, in_i): a strided view the matmul writes into directly
            if steps:
                x = torch.cat([record.inputs[i][t] for t in steps])  # (rows, in_i)
                g = torch.cat([record.grads[i][t] for t in steps])  # (rows, out)
                if x.dtype == g.dtype == out.dtype:
                    torch.mm(g.t(), x, out=out)  # one matmul instead of len(steps)
                else:  # autocast: inputs in bf16/fp16, the parameter in float32
                    out.copy_(g.t().mm(x.to(g.dtype)))
            else:
                out.zero_()
            if block_grads[i] is not None:  # the block was also used outside the recorded steps
                out.add_(block_grads[i])
            record.grads[i] = {}  # a second backward (retain_graph) starts afresh
        return dweight, None, None


class _StepMatmul(torch.autograd.Function):
    """base + x @ block^T; backward gives dbase and dx, and leaves dblock to _Alias."""

    @staticmethod
    def forward(ctx, base: Tensor, x: Tensor, block: Tensor, weight: "StepWeight", index: int, step: int) -> Tensor:
        ctx.save_for_backward(block)
        ctx.record, ctx.index, ctx.step = weight._record, index, step
        return weight._matmul(base, x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (block,) = ctx.saved_tensors
        ctx.record.grads[ctx.index][ctx.step] = grad
        dx = grad.mm(block.to(grad.dtype)) if ctx.needs_input_grad[1] else None  # (autocast: grad may be bf16)
        return (grad if ctx.needs_input_grad[0] else None), dx, None, None, None, None


# The most rows a step may have for its matmul to run on an MKL-packed weight (StepWeight): beyond that a
# plain matmul's own packing is a small share of its work (672 rows measured no faster packed).
PACKED_ROWS_MAX = 256


def _mkl_packs(x: Tensor, weight: Tensor) -> bool:
    """Whether x @ weight^T may run on an MKL-packed weight: float32 CPU tensors, no autocast, an MKL build."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.dim() == 2
            and x.shape[0] <= PACKED_ROWS_MAX and not torch.is_autocast_enabled("cpu")
            and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


class StepWeight:
    """One column block W_b (out, in_b) of a weight, applied at the steps of one sequence:
    addmm(base, x) = base + x @ W_b^T (base may broadcast, e.g. a bias).

    A recurrence multiplies the same W_b by a few rows at every step. A plain matmul re-packs W_b into
    MKL's internal layout at each call, which for 32 rows costs about as much as the arithmetic; here W_b is
    packed once for the current row count (MKL's packed GEMM, torch.ops.mkl._mkl_linear) and the following
    steps with that many rows reuse it (scripts/bench.py's shapes, 2 threads, 32 rows: the stacked h_{t-1}
    weights 1.2 -> 0.56 ms, the LSTM's context block 1.26 -> 0.86 ms; in-process A/B of whole decodes: greedy
    1.11x, beam 5 1.07x; training steps, forward only, R7 1.02-1.04x, R14 1.15x). One packing is kept at a
    time. The backward and every other case (other devices, dtypes, autocast, no MKL) use torch.addmm.
    """

    def __init__(self, block: Tensor, record: _Record | None = None, index: int = 0) -> None:
        self.block, self._record, self._index = block, record, index
        self._contiguous: Tensor | None = None  # W_b detached, row-major: what MKL packs
        self._packed: tuple[int, Tensor] | None = None  # (rows, MKL's packing of W_b for that many rows)
        self._rows, self._calls = 0, 0  # the latest call's row count and how many calls in a row had it
        self.packing = True  # a caller that knows its row counts may switch packing off (see PACK_AFTER)

    # A packing pays from about its second reuse: pack on the third call in a row with the same row count.
    # (Packing whenever the count changed made training on Flickr8k's caption lengths 10 % slower.)
    PACK_AFTER = 2
    # A sequence whose longest run of equal row counts is shorter gains nothing from packing and would
    # keep the packed copies (about 100 MB of peak RSS at Flickr8k's shape): FastShowAttendTellDecoder.forward
    # switches packing off then.
    PACK_MIN_RUN = 6

    def _matmul(self, base: Tensor | None, x: Tensor) -> Tensor:
        """base + x @ W_b^T without autograd (the forward of a recorded step, or a plain one); x @ W_b^T when
        base is None."""
        rows = x.shape[0]
        self._calls = self._calls + 1 if rows == self._rows else 1
        self._rows = rows
        # a packing kept for this row count serves at once (a decoder's packings outlive one search)
        have = self._packed is not None and self._packed[0] == rows
        if (not self.packing or (self._calls <= self.PACK_AFTER and not have) or not _mkl_packs(x, self.block)
                or not fast.enabled()):
            return torch.mm(x, self.block.t()) if base is None else torch.addmm(base, x, self.block.t())
        if self._contiguous is None:
            self._contiguous = self.block.detach().contiguous()
        if not have:
            self._packed = (rows, torch.ops.mkl._mkl_reorder_linear_weight(self._contiguous, rows))
        out = torch.ops.mkl._mkl_linear(x, self._packed[1], self._contiguous, None, rows)
        return out if base is None else out.add_(base)

    def mm(self, x: Tensor) -> Tensor:
        """x @ W_b^T, outside autograd (inference: e.g. logits whose bias the search adds, search.Logits)."""
        if torch.is_grad_enabled() and (x.requires_grad or self.block.requires_grad):
            raise RuntimeError("StepWeight.mm is for inference; use addmm under autograd")
        return self._matmul(None, x)

    def addmm(self, base: Tensor, x: Tensor) -> Tensor:
        """base + x @ W_b^T."""
        if self._record is None:
            if torch.is_grad_enabled() and (x.requires_grad or base.requires_grad or self.block.requires_grad):
                return torch.addmm(base, x, self.block.t())  # autograd's own matmul (per-step weight gradients)
            return self._matmul(base, x)
        inputs = self._record.inputs[self._index]
        inputs.append(x.detach())
        return _StepMatmul.apply(base, x, self.block, self, self._index, len(inputs) - 1)


def step_weights(weight: Tensor, splits: Sequence[int] | None = None, defer: bool = True) -> tuple[StepWeight, ...]:
    """The column blocks of ``weight`` (out, in) of widths ``splits`` (default: one block), as StepWeights.

    With ``defer`` (and autograd recording, and the weight requiring a gradient, and no reference switch,
    captioner/fast) the weight's gradient is formed once after the backward pass (module docstring);
    otherwise every addmm is a plain torch.addmm.
    """
    widths = tuple(splits) if splits is not None else (weight.shape[1],)
    if sum(widths) != weight.shape[1]:
        raise ValueError(f"splits {widths} do not add up to the weight's {weight.shape[1]} input columns")
    bounds = (0, *itertools.accumulate(widths))
    if not (defer and torch.is_grad_enabled() and weight.requires_grad and fast.enabled()):
        return tuple(StepWeight(weight[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
    record = _Record(len(widths))
    blocks = _Alias.apply(weight, record, bounds)
    return tuple(StepWeight(block, record, i) for i, block in enumerate(blocks))


class _Accumulator:
    """The gradient of a tensor whose row prefixes the steps read, summed in place as the steps' backwards run."""

    def __init__(self) -> None:
        self.total: Tensor | None = None


class _RowsAlias(torch.autograd.Function):
    """Identity whose backward returns what the prefixes accumulated (plus any direct gradient)."""

    @staticmethod
    def forward(ctx, x: Tensor, acc: _Accumulator) -> Tensor:
        ctx.acc = acc
        ctx.set_materialize_grads(False)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor | None):
        total, ctx.acc.total = ctx.acc.total, None
        if total is None:
            return grad, None
        return (total if grad is None else total.add_(grad)), None


class _Prefix(torch.autograd.Function):
    """x[:n]; the backward adds its gradient into the accumulator's first n rows (no full-size zero tensor per
    step, as the plain slice's backward makes)."""

    @staticmethod
    def forward(ctx, x: Tensor, n: int, acc: _Accumulator) -> Tensor:
        ctx.n, ctx.acc, ctx.shape = n, acc, x.shape
        return x[:n]

    @staticmethod
    def backward(ctx, grad: Tensor):
        acc = ctx.acc
        if acc.total is None:
            acc.total = grad.new_zeros(ctx.shape)
        acc.total[:ctx.n].add_(grad)
        return None, None, None


class SharedRows:
    """A tensor that every step of a recurrence reads through a shrinking prefix of its rows, x[:n_t] (the
    decoder's attention memory as captions end). With autograd, the prefixes' gradients are summed in place
    into one buffer instead of each step's slice backward building a zero tensor of the full size."""

    def __init__(self, x: Tensor) -> None:
        summed = fast.enabled() and torch.is_grad_enabled() and x.requires_grad
        self._acc = _Accumulator() if summed else None
        self.x = _RowsAlias.apply(x, self._acc) if self._acc is not None else x

    def prefix(self, n: int) -> Tensor:
        if n == self.x.shape[0] or self._acc is None:
            return self.x if n == self.x.shape[0] else self.x[:n]
        return _Prefix.apply(self.x, n, self._acc)
