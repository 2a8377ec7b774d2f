"""The token negative log-likelihood of the losses (training/losses.py), fast: -log softmax(x W^T + b)[target]
per row with the output layer and the cross-entropy as one autograd function (linear_token_nll), or the
cross-entropy alone with a one-pass backward (token_nll).

Both take ``smoothing`` ε, label smoothing as F.cross_entropy's ``label_smoothing`` defines it (the target
distribution (1 - ε) onehot + ε / V): per row lse - (1 - ε) logit[target] - ε mean_v logit_v, whose gradient
is softmax - (1 - ε) onehot - ε / V. The mean logit is x · mean_v W_v + mean_v b_v, so smoothing adds one
matrix-vector product to the fused forward and rank-one terms to its backward, and no (R, V) buffer.

The reference, which runs under the switch (captioner/fast) and wherever the fused function does not apply, is
F.linear + F.cross_entropy in float32 at least; tests/test_fast_paths.py compares values and gradients.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from captioner import fast


def _at_least_float32(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class _TokenNLL(torch.autograd.Function):
    """-log softmax(logits)[target] per row, with a one-pass backward: softmax(logits) - onehot(target).

    F.cross_entropy does the same as log_softmax + nll_loss, whose backward writes a zero (R, V) tensor,
    scatters into it and then runs log_softmax's backward over it (three full passes); here the backward
    is one pass that writes exp(logits - lse) * g and one scatter of -g at the targets. Forward keeps
    only the per-row log-sum-exp. tests/test_fast_paths.py compares values and gradients with F.cross_entropy.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, smoothing: float = 0.0) -> Tensor:
        x = _at_least_float32(logits)  # (R, V); no copy for float32
        lse = torch.logsumexp(x, dim=1)  # (R,)
        nll = lse - (1.0 - smoothing) * x.gather(1, targets.unsqueeze(1)).squeeze(1)  # (R,)
        if smoothing:
            nll = nll - smoothing * x.mean(dim=1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.smoothing = smoothing
        return nll

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, targets, lse = ctx.saved_tensors
        eps = ctx.smoothing
        x = _at_least_float32(logits)
        g = grad.to(x.dtype).unsqueeze(1)  # (R, 1)
        d = torch.sub(x, lse.unsqueeze(1)).exp_().mul_(g)  # softmax * g, (R, V), one fresh buffer
        d.scatter_add_(1, targets.unsqueeze(1), -(1.0 - eps) * g)  # - (1 - ε) onehot * g
        if eps:
            d.sub_(g * (eps / x.shape[1]))  # - ε / V * g
        return d.to(logits.dtype), None, None


def token_nll(logits: Tensor, targets: Tensor, smoothing: float = 0.0) -> Tensor:
    """Negative log-likelihood of each row's target: logits (R, V), targets (R,) -> (R,), in float32 at least;
    with ``smoothing`` ε > 0, the label-smoothed cross-entropy (module docstring).

    Equals F.cross_entropy(logits.float(), targets, reduction="none", label_smoothing=smoothing) (values and
    gradients), which is what runs under the reference switch (captioner/fast)."""
    if not fast.enabled():
        return F.cross_entropy(_at_least_float32(logits), targets, reduction="none", label_smoothing=smoothing)
    return _TokenNLL.apply(logits, targets, smoothing)


class _LinearTokenNLL(torch.autograd.Function):
    """-log softmax(x W^T + b)[target] per row: the output layer and the cross-entropy as one function.

    Unfused, the (R, V) logits go through the bias copy and the matmul, log-sum-exp (max, a fresh x - max,
    exp, sum) and a backward that forms softmax - onehot in another fresh (R, V) buffer before two matmuls.
    Here the logits' buffer becomes E = exp(logits - max) in place (kept for the backward, as the logits
    would be) and the one-hot part is handled on the R target rows only:

        nll = log s + max - logit[target],   s = Σ_v E_v
        dlogits = g (E / s - onehot)  ->  dx = (g/s) E W - g W[target],   dW = E^T (g/s x) - Σ_r onehot_r (g x)_r,
                                          db = E^T (g/s) - Σ_r onehot_r g_r

    So the backward is the two matmuls any linear layer needs, one matrix-vector product for db, and no
    (R, V) temporary; E is never written after the forward, so a second backward (retain_graph) is exact.
    tests/test_fast_paths.py compares values and gradients with F.linear + F.cross_entropy.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                smoothing: float = 0.0) -> Tensor:
        logits = torch.addmm(bias, x, weight.t()) if bias is not None else x.mm(weight.t())  # (R, V)
        target_logit = logits.gather(1, targets.unsqueeze(1))  # (R, 1)
        if smoothing:  # mean_v logit_v = x . mean_v W_v + mean_v b_v, before the buffer becomes E
            mean_logit = x.mv(weight.mean(dim=0)).unsqueeze(1)  # (R, 1)
            if bias is not None:
                mean_logit = mean_logit + bias.mean()
        top = logits.amax(dim=1, keepdim=True)  # (R, 1)
        exp = logits.sub_(top).exp_()  # (R, V): E, in the logits' buffer
        total = exp.sum(dim=1, keepdim=True)  # (R, 1): s
        ctx.save_for_backward(x, weight, targets, exp, total)
        ctx.has_bias, ctx.smoothing = bias is not None, smoothing
        loss = total.log() + top - (1.0 - smoothing) * target_logit  # (R, 1)
        if smoothing:
            loss = loss - smoothing * mean_logit
        return loss.squeeze(1)  # (R,)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, targets, exp, total = ctx.saved_tensors
        keep = 1.0 - ctx.smoothing  # the target's share of the target distribution
        g = grad.unsqueeze(1).to(x.dtype)  # (R, 1)
        g_s = g / total  # (R, 1)
        g_u = g * (ctx.smoothing / weight.shape[0])  # (R, 1): each class's uniform share, ε / V
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            dx = torch.addcmul(exp.mm(weight).mul_(g_s), weight.index_select(0, targets), g, value=-keep)  # (R, E)
            if ctx.smoothing:
                dx.sub_(g_u * weight.sum(dim=0))
        if ctx.needs_input_grad[1]:
            dweight = exp.t().mm(x * g_s).index_add_(0, targets, x * g, alpha=-keep)  # (V, E)
            if ctx.smoothing:
                dweight.sub_((x * g_u).sum(dim=0))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = exp.t().mv(g_s.squeeze(1)).index_add_(0, targets, g.squeeze(1), alpha=-keep)  # (V,)
            if ctx.smoothing:
                dbias.sub_(g_u.sum())
        return dx, dweight, dbias, None, None


def linear_token_nll(x: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                     smoothing: float = 0.0) -> Tensor:
    """token_nll(F.linear(x, weight, bias), targets, smoothing) with the output layer fused in: x (R, E),
    weight (V, E), targets (R,) -> (R,). Falls back to the two separate steps under autocast and for
    reduced-precision inputs, where the matmul's precision is autocast's to choose, and under the reference switch
    (captioner/fast)."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing!r}")
    fused = (fast.enabled() and x.dtype in (torch.float32, torch.float64) and x.dtype == weight.dtype
             and not torch.is_autocast_enabled(x.device.type))
    if not fused:
        return token_nll(F.linear(x, weight, bias), targets, smoothing)
    return _LinearTokenNLL.apply(x, weight, bias, targets, smoothing)
