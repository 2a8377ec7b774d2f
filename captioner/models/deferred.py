"""Weight gradients of a recurrence formed once per sequence instead of once per step.

The decoder's LSTM multiplies the same weight W by a small input x_t at every step t:
y_t = base_t + x_t @ W. Plain autograd forms dW_t = x_t^T dy_t at each step of the backward pass (a thin
(in, n) @ (n, out) product with n the batch, about 32 rows) and adds it into a (in, out) accumulator:
T thin matmuls and T full-size additions. dW = sum_t x_t^T dy_t = X^T G is one matmul over all steps'
rows stacked, which is what this module computes, after every step's backward has run.

    weight = StepWeight(W, defer=True)      # once per sequence
    y_t = weight.addmm(base_t, x_t)          # every step: forward as torch.addmm(base_t, x_t, W)

How: `W` enters the graph once, through `_Alias` (an identity). Each step's `_StepMatmul` returns the input
gradients (dbase = dy, dx = dy @ W^T) but no weight gradient; it stores dy_t instead. The autograd engine
runs `_Alias`'s backward only after every node that uses its output has run, i.e. after all the steps'
backwards, and it then forms X^T G in one matmul. The inputs x_t are kept (detached) in the forward pass,
as autograd would keep them for dW_t anyway. tests/test_fast_paths.py checks the gradients against the
plain per-step computation (``defer=False``), which is what runs without autograd.
"""
from __future__ import annotations

import torch
from torch import Tensor


class _Record:
    """The steps of one sequence: inputs x_t (forward order) and output gradients dy_t (by step)."""

    def __init__(self) -> None:
        self.inputs: list[Tensor] = []
        self.grads: dict[int, Tensor] = {}


class _Alias(torch.autograd.Function):
    """Identity on the weight whose backward forms X^T G from the record once all steps are done."""

    @staticmethod
    def forward(ctx, weight: Tensor, record: _Record) -> Tensor:
        ctx.record, ctx.dtype = record, weight.dtype
        ctx.set_materialize_grads(False)
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor | None):
        record = ctx.record
        steps = sorted(record.grads)  # steps whose output reached the loss
        record_grads, record.grads = record.grads, {}  # a second backward (retain_graph) starts afresh
        if not steps:
            return grad, None
        x = torch.cat([record.inputs[t] for t in steps])  # (sum of rows, in)
        g = torch.cat([record_grads[t] for t in steps])  # (sum of rows, out)
        dweight = x.t().mm(g.to(x.dtype)).to(ctx.dtype)  # (in, out): one matmul instead of len(steps)
        return (dweight if grad is None else dweight + grad), None


class _StepMatmul(torch.autograd.Function):
    """base + x @ weight; backward gives dbase and dx, and leaves dweight to _Alias."""

    @staticmethod
    def forward(ctx, base: Tensor, x: Tensor, weight: Tensor, record: _Record, step: int) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.record, ctx.step = record, step
        return torch.addmm(base, x, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (weight,) = ctx.saved_tensors
        ctx.record.grads[ctx.step] = grad
        dx = grad.mm(weight.t().to(grad.dtype)) if ctx.needs_input_grad[1] else None  # (autocast: grad may be bf16)
        return (grad if ctx.needs_input_grad[0] else None), dx, None, None, None


class StepWeight:
    """A weight W (in, out) applied at every step of one sequence: addmm(base, x) = base + x @ W.

    With ``defer`` (and autograd recording, and W requiring a gradient) W's gradient is formed once after
    the backward pass (module docstring); otherwise each call is a plain torch.addmm.
    """

    def __init__(self, weight: Tensor, defer: bool = True) -> None:
        self._record = None
        self.weight = weight
        if defer and torch.is_grad_enabled() and weight.requires_grad:
            self._record = _Record()
            self.weight = _Alias.apply(weight, self._record)

    def addmm(self, base: Tensor, x: Tensor, inplace: bool = False) -> Tensor:
        """base + x @ W; ``inplace`` lets the plain path accumulate into ``base`` (a fresh tensor that autograd
        does not need, e.g. the previous addmm's output)."""
        if self._record is None:
            return base.addmm_(x, self.weight) if inplace else torch.addmm(base, x, self.weight)
        step = len(self._record.inputs)
        self._record.inputs.append(x.detach())
        return _StepMatmul.apply(base, x, self.weight, self._record, step)
