"""Training objectives of Xu et al. 2015: soft attention (§4.2) and hard attention (§4.1: REINFORCE, or a
straight-through Gumbel-softmax read).

Soft, Eq. (14), per caption:   L_b = -Σ_t log p(y_t | a) + λ Σ_i (1 - Σ_t α_ti)²
    The paper adds the penalty to the negative log-likelihood *of the caption* (summed over its
    words). The loss here is Σ_b L_b / N, N the number of real (unpadded) target words in the
    batch: the cross-entropy part is the usual per-token mean (so learning rates mean what they
    usually mean) and the penalty keeps the paper's scale relative to it. λ (``train.alpha_c``)
    is therefore the paper's λ. (Adding the batch mean of the penalty to the per-token mean NLL
    instead would weigh λ about T ≈ 12 times more than the paper's; on Flickr8k that pushes
    attention to uniform, the penalty's minimum when a caption has fewer words than the grid
    has cells.) The penalty sums t over real steps only.

Attention sharpness (not in the paper, ``train.alpha_entropy`` = γ, 0 by default): both losses can
add γ · (1/N) Σ_b Σ_t H(α_t) / log L, the mean normalised entropy of each word's attention. On
Flickr8k's 7x7 EfficientNet-Lite0 grid, whose cells each see most of the photo, cross-entropy alone
left soft attention nearly uniform (mean max α 0.049 after two epochs, normalised entropy 0.97): the
model had no reason to choose. γ makes choosing cheap; which cell it chooses is still learned from
the caption loss alone.

Hard, Eq. (10)-(12): the decoder samples one location s̃_t ~ Multinoulli(α_t) per word (attention
mode "sample") and returns log p(s̃_t | a) and the entropy H[α_t]. The surrogate whose gradient is
the paper's Monte-Carlo estimate of ∂L_s/∂W (L_s = Σ_s p(s|a) log p(y|s,a)) is

    loss = -(1/N) Σ_b [ log p(y_b|s̃,a) + λ_r (R_b - b)·Σ_t log p(s̃_t|a) + λ_e Σ_t H[α_t] ]
    R_b  = Σ_t log p(y_t|s̃,a) over real steps (detached),   b = moving average of R (Eq. 12)

The data term and the REINFORCE term share the 1/N scale, so with λ_r = 1 their sum is an unbiased
estimate of -(1/N) ∂L_s/∂W (tested against exact enumeration in tests/test_losses.py). The paper
keeps λ_r as a hyperparameter without giving its value; λ_r < 1 trades that bias for less variance
(R sums a whole caption's log-likelihood, about -10 nats early on, of which the moving baseline removes
only the mean). On the shapes data λ_r = 0.03 beat 1.0 by 16 test BLEU-4 (docs/hard-attention.md).

Images whose context was the expectation (the per-image variance trick of §4.1) carry
log p(s̃) = 0 from the decoder and thus no REINFORCE term; they are also left out of the
baseline's average.

That estimator is kept as the reference (``train.hard.estimator: paper``). On Flickr8k it cannot teach
the scorer where to look: the whole-caption reward minus one moving average is dominated by caption
length and difficulty, and at λ_r = 1 it costs 4.8 val CIDEr-D after one epoch against the estimator
below (docs/hard-attention.md). ``loo_hard_attention_loss`` (``estimator: loo``) samples K location paths per caption
and credits each s_t with the words from t on, against the mean of the caption's other K-1 paths at
the same step (Kool et al. 2019): what the copies share cancels, and with λ_r = 1 the estimate stays
unbiased (exact enumeration in tests/test_losses.py).

``gumbel_attention_loss`` (``estimator: gumbel``) needs no REINFORCE term at all: the decoder reads in attention
mode "gumbel" (models/attention.py, read_context), one cell s_t ~ α_t per word in the forward pass (the Gumbel-max
trick) and, in the backward pass, the gradient of the relaxed sample softmax((log α_t + g_t)/τ) (straight-through
Gumbel-softmax: Jang et al. 2017, arXiv:1611.01144; Maddison et al. 2017, arXiv:1611.00712). The context itself
then carries the caption's gradient to the scorer, one location path per caption, and the loss is Eq. (14)'s
(cross-entropy, λ, γ) on that read. The estimate is biased (it is the gradient of a relaxed model, not of Eq. 10's
bound) with far less variance than REINFORCE; τ trades the two and anneals over training (gumbel_temperature).

Under SCST (``scst_loss``) the location policy also gets λ_e's entropy bonus; the attention terms
(λ, γ) are not defined on sampled captions there, and config.check_read_keys refuses them.

Self-critical sequence training (Rennie et al. 2017, arXiv:1612.00563; ``scst_loss``): the policy is
the decoder itself, a trajectory is a whole sampled caption, and its reward r is CIDEr-D against the
image's references (captioner/training/rewards.py). With k samples per image and a baseline b_i that does not
depend on sample i,

    loss = -(1/N) Σ_i (r_i - b_i) · [ Σ_t log p(w_t | w_<t, a) + Σ_t log p(s_t | a) ]

over the N = B·k samples; its gradient is an unbiased estimate of -∇ E[r] (tested against exact
enumeration in tests/test_scst.py). b_i is either the mean reward of the image's other k-1 samples
(Luo 2020, "a better variant of SCST") or the reward of the greedy caption (Rennie et al.). The
location term exists for hard attention only: there the trajectory is (s_1, w_1, s_2, w_2, ...), the
cells are sampled from α_t exactly as in Eq. (11), and the same advantage weighs both kinds of
actions. This is Eq. (11)-(12) with the reward changed from log p(y | s, a) (the likelihood of the
reference caption under the sampled cells) to the score of the sampled caption, and with the words
sampled too; since the reward is now external, the data term of Eq. (11) has no counterpart.

The paper's hard-attention objective (Eq. 10-12) has no doubly stochastic term; the shapes and COCO
hard configs set ``alpha_c: 0``. The term is equally defined on the α_t a hard model samples from (same
per-caption scale as Eq. 14), and configs/flickr8k_hard.yaml uses it: with γ sharpening each α_t, a
caption that reads one cell for every word pays about (T-1)² for it, so sharp attention has to move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from captioner import fast_paths
from captioner.names import SCST_BASELINES  # named below the config, which checks train.scst.baseline


@dataclass
class LossOutput:
    """The scalar to minimise and its parts (detached, for logging)."""

    loss: Tensor  # scalar, differentiable
    parts: dict[str, Tensor]  # name -> detached scalar
    reward_sum: Tensor | None = None  # hard: Σ R over sampled images (detached), for the baseline
    reward_count: Tensor | None = None  # hard: number of sampled images


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
    def forward(ctx, logits: Tensor, targets: Tensor) -> Tensor:
        x = _at_least_float32(logits)  # (R, V); no copy for float32
        lse = torch.logsumexp(x, dim=1)  # (R,)
        nll = lse - x.gather(1, targets.unsqueeze(1)).squeeze(1)  # (R,)
        ctx.save_for_backward(logits, targets, lse)
        return nll

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, targets, lse = ctx.saved_tensors
        x = _at_least_float32(logits)
        g = grad.to(x.dtype).unsqueeze(1)  # (R, 1)
        d = torch.sub(x, lse.unsqueeze(1)).exp_().mul_(g)  # softmax * g, (R, V), one fresh buffer
        d.scatter_add_(1, targets.unsqueeze(1), -g)  # - onehot * g
        return d.to(logits.dtype), None


def token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """Negative log-likelihood of each row's target: logits (R, V), targets (R,) -> (R,), in float32 at least.

    Equals F.cross_entropy(logits.float(), targets, reduction="none") (values and gradients), which is what runs
    under the reference switch (captioner/fast_paths.py)."""
    if not fast_paths.enabled():
        return F.cross_entropy(_at_least_float32(logits), targets, reduction="none")
    return _TokenNLL.apply(logits, targets)


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
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor) -> Tensor:
        logits = torch.addmm(bias, x, weight.t()) if bias is not None else x.mm(weight.t())  # (R, V)
        target_logit = logits.gather(1, targets.unsqueeze(1))  # (R, 1)
        top = logits.amax(dim=1, keepdim=True)  # (R, 1)
        exp = logits.sub_(top).exp_()  # (R, V): E, in the logits' buffer
        total = exp.sum(dim=1, keepdim=True)  # (R, 1): s
        ctx.save_for_backward(x, weight, targets, exp, total)
        ctx.has_bias = bias is not None
        return (total.log() + top - target_logit).squeeze(1)  # (R,)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, targets, exp, total = ctx.saved_tensors
        g = grad.unsqueeze(1).to(x.dtype)  # (R, 1)
        g_s = g / total  # (R, 1)
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            dx = torch.addcmul(exp.mm(weight).mul_(g_s), weight.index_select(0, targets), g, value=-1)  # (R, E)
        if ctx.needs_input_grad[1]:
            dweight = exp.t().mm(x * g_s).index_add_(0, targets, x * g, alpha=-1)  # (V, E)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = exp.t().mv(g_s.squeeze(1)).index_add_(0, targets, g.squeeze(1), alpha=-1)  # (V,)
        return dx, dweight, dbias, None


def linear_token_nll(x: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor) -> Tensor:
    """token_nll(F.linear(x, weight, bias), targets) with the output layer fused in: x (R, E), weight (V, E),
    targets (R,) -> (R,). Falls back to the two separate steps under autocast and for reduced-precision inputs,
    where the matmul's precision is autocast's to choose, and under the reference switch (captioner/fast_paths.py)."""
    fused = (fast_paths.enabled() and x.dtype in (torch.float32, torch.float64) and x.dtype == weight.dtype
             and not torch.is_autocast_enabled(x.device.type))
    if not fused:
        return token_nll(F.linear(x, weight, bias), targets)
    return _LinearTokenNLL.apply(x, weight, bias, targets)


def real_token_nll(output: Any, targets: Tensor) -> tuple[Tensor, Tensor]:
    """-log p of the real (unpadded) target tokens, packed: (R,) NLL and (R,) caption index.

    ``output`` is a DecoderOutput: it hands over the output layer's inputs on the real steps (``packed_features``)
    and the output layer's parameters, which then run fused with the loss (linear_token_nll).
    """
    nll, rows = _real_token_nll_rows(output, targets)
    return nll, torch.div(rows, targets.shape[1], rounding_mode="floor")


def _real_token_nll_rows(output: Any, targets: Tensor) -> tuple[Tensor, Tensor]:
    """real_token_nll with each value's flat index b * T + t into targets (B, T) instead of its caption."""
    rows = output.rows  # (R,) flat indices b * T + t
    nll = linear_token_nll(output.packed_features, output.output_weight, output.output_bias,
                           targets.reshape(-1).index_select(0, rows))
    return nll, rows


def sequence_cross_entropy(output: Any, targets: Tensor) -> Tensor:
    """Mean negative log-likelihood over the real (unpadded) target tokens of a DecoderOutput (real_token_nll)."""
    nll, _ = real_token_nll(output, targets)
    return nll.sum() / max(nll.numel(), 1)


def caption_penalties(alphas: Tensor, mask: Tensor) -> Tensor:
    """Eq. (14)'s term of each caption, Σ_i (1 - Σ_t α_ti)², t over real steps: alphas (B, T, L) -> (B,)."""
    a = _at_least_float32(alphas)
    coverage = (a * mask.unsqueeze(-1).to(a.dtype)).sum(dim=1)  # (B, L)
    return ((1.0 - coverage) ** 2).sum(dim=1)


def doubly_stochastic_penalty(alphas: Tensor, mask: Tensor) -> Tensor:
    """Eq. (14): mean over the batch of Σ_i (1 - Σ_t α_ti)², t over real steps. alphas (B, T, L)."""
    return caption_penalties(alphas, mask).mean()


def penalty_per_token(alphas: Tensor, mask: Tensor) -> Tensor:
    """The doubly stochastic penalty summed over the batch's captions, per real target word: the
    paper's Eq. (14) scale against a per-token mean cross-entropy (see the module docstring)."""
    B = alphas.shape[0]
    return doubly_stochastic_penalty(alphas, mask) * B / mask.to(torch.float32).sum().clamp(min=1.0)


def attention_entropy(alphas: Tensor, mask: Tensor, weight: Tensor | None = None) -> Tensor:
    """Mean over real steps of H(α_t) / log L (0: one cell, 1: uniform). alphas (B, T, L), mask (B, T);
    ``weight`` (B,) weighs each caption's steps (default 1)."""
    L = alphas.shape[-1]
    a = _at_least_float32(alphas)
    h = -(a * torch.log(a.clamp(min=1e-12))).sum(-1) / math.log(max(L, 2))  # (B, T)
    m = mask.to(a.dtype) if weight is None else mask.to(a.dtype) * weight.unsqueeze(1)
    return (h * m).sum() / m.sum().clamp(min=1.0)


def soft_attention_loss(output: Any, targets: Tensor, alpha_c: float = 1.0, alpha_entropy: float = 0.0) -> LossOutput:
    """Soft (deterministic) attention, Eq. (14). ``output`` is a DecoderOutput, targets = captions[:, 1:].

    ``parts["alpha_penalty"]`` is the per-caption penalty Σ_i (1 - Σ_t α_ti)² (batch mean), as logged;
    ``parts["alpha_entropy"]`` the mean normalised entropy of α (weighted by ``alpha_entropy`` in the loss).
    """
    xe = sequence_cross_entropy(output, targets)
    penalty = doubly_stochastic_penalty(output.alphas, output.mask)
    sharpness = attention_entropy(output.alphas, output.mask)
    loss = xe + alpha_c * penalty_per_token(output.alphas, output.mask) + alpha_entropy * sharpness
    return LossOutput(loss=loss, parts={"xe": xe.detach(), "alpha_penalty": penalty.detach(),
                                        "alpha_entropy": sharpness.detach()})


def hard_attention_loss(output: Any, targets: Tensor, baseline: float | None, alpha_c: float = 1.0,
                        reinforce_weight: float = 1.0, entropy_weight: float = 0.01,
                        sampled: Tensor | None = None, alpha_entropy: float = 0.0) -> LossOutput:
    """Hard (stochastic) attention, Eq. (10)-(12); see the module docstring for the surrogate.

    Args:
        output: DecoderOutput of a forward pass in attention mode "sample" (log_probs and entropies set).
        targets: (B, T-1) = captions[:, 1:].
        baseline: b, the moving average of the reward (a float: the same on every DDP rank); None on
            the very first batch, which then uses its own mean reward (a one-step, negligible bias).
        sampled: (B,) bool, images whose locations were sampled (not expectation-masked); these
            define the reward average that updates b. None = all.
    """
    if output.log_probs is None or output.entropies is None:
        raise ValueError("hard_attention_loss needs a decoder output from attention_mode='sample' "
                         "(log_probs and entropies are None: is the attention kind 'hard'?)")
    mask = output.mask.to(torch.float32)  # (B, T-1)
    n_tokens = mask.sum().clamp(min=1.0)
    nll, caption = real_token_nll(output, targets)  # (R,), (R,)
    log_py = -nll  # (R,) log p(y_t | s̃, a) of the real tokens
    reward = log_py.new_zeros(targets.shape[0]).index_add_(0, caption, log_py.detach())  # (B,): R = log p(y | s̃, a)
    # (B,): Σ_t log p(s̃_t | a); 0 for expectation images
    log_ps = (_at_least_float32(output.log_probs) * mask).sum(dim=1)
    entropy = (_at_least_float32(output.entropies) * mask).sum()  # Σ over real steps and images
    if sampled is None:
        sampled = torch.ones_like(reward, dtype=torch.bool)
    sampled_f = sampled.to(reward.dtype)
    mean_reward = (reward * sampled_f).sum() / sampled_f.sum().clamp(min=1.0)
    if baseline is None:
        baseline = mean_reward

    data_term = -log_py.sum() / n_tokens
    reinforce = -reinforce_weight * ((reward - baseline) * log_ps).sum() / n_tokens
    entropy_term = -entropy_weight * entropy / n_tokens
    penalty = doubly_stochastic_penalty(output.alphas, output.mask)
    sharpness = attention_entropy(output.alphas, output.mask)
    loss = (data_term + reinforce + entropy_term + alpha_c * penalty_per_token(output.alphas, output.mask)
            + alpha_entropy * sharpness)
    return LossOutput(
        loss=loss,
        parts={
            "xe": data_term.detach(),
            "alpha_penalty": penalty.detach(),
            "alpha_entropy": sharpness.detach(),
            "reinforce": reinforce.detach(),
            "entropy": (entropy / n_tokens).detach(),
            "reward": mean_reward,
        },
        reward_sum=(reward * sampled_f).sum(),
        reward_count=sampled_f.sum(),
    )


# How hard attention's location policy is trained under cross-entropy (train.hard.estimator): "paper" is
# hard_attention_loss (Eq. 10-12), "loo" is loo_hard_attention_loss (K samples, leave-one-out baseline), "gumbel"
# is gumbel_attention_loss (the straight-through Gumbel-softmax read, no REINFORCE term). training/estimators.py
# registers them by name (ESTIMATORS); captioner/names.py names them (HARD_ESTIMATORS) for the config.


def gumbel_attention_loss(output: Any, targets: Tensor, alpha_c: float = 0.0,
                          alpha_entropy: float = 0.0) -> LossOutput:
    """Hard attention trained through the straight-through Gumbel-softmax read (``train.hard.estimator: gumbel``).

    ``output``: a DecoderOutput of attention mode "gumbel" (each word read one cell s_t ~ α_t, and the context's
    gradient reaches the scores through the relaxed sample; models/attention.py, read_context). The loss is

        loss = -(1/N) Σ_b [ Σ_t log p(y_t | s̃, a) + λ Σ_i (1 - Σ_t α_ti)² ] + γ · mean normalised H(α_t)

    soft_attention_loss's terms (Eq. 14) on the sampled read: no REINFORCE term and no baseline, since the
    scorer's gradient comes through z_t directly. Rows the decoder read with the expected context (the §4.1
    trick, ``expectation_mask``) are plain soft-attention captions here.
    """
    if output.log_probs is None:
        raise ValueError("gumbel_attention_loss needs a decoder output from attention_mode='gumbel' "
                         "(log_probs is None: is the attention kind 'hard'?)")
    return soft_attention_loss(output, targets, alpha_c=alpha_c, alpha_entropy=alpha_entropy)


def gumbel_temperature(epoch: int, epochs: int, start: float, end: float) -> float:
    """τ of the Gumbel-softmax read in ``epoch`` (0-based) of ``epochs``: annealed geometrically (exponentially in
    the epoch) from ``start`` in the first epoch to ``end`` in the last, τ_e = start · (end / start)^(e / (E-1)),
    the shape of Jang et al.'s schedule (τ = max(τ_min, exp(-r t)) in the training step t) fixed by its two ends;
    a one-epoch run keeps ``start``. It depends on the epoch and the config only, so a resume reproduces it."""
    if epochs <= 1:
        return float(start)
    share = min(max(epoch, 0), epochs - 1) / (epochs - 1)
    return float(start * (end / start) ** share)


def reward_to_go(rewards: Tensor, discount: float = 1.0) -> Tensor:
    """G_t = Σ_{t' >= t} discount^(t'-t) r_t' along the last dim: rewards (..., T) -> (..., T)."""
    T = rewards.shape[-1]
    t = torch.arange(T, device=rewards.device)
    ahead = (t.unsqueeze(1) - t.unsqueeze(0)).to(rewards.dtype)  # (T', T): t' - t
    weights = torch.where(ahead >= 0, torch.tensor(discount, dtype=rewards.dtype).pow(ahead.clamp(min=0)),
                          torch.zeros((), dtype=rewards.dtype))  # (T', T); 0^0 = 1 on the diagonal
    return rewards @ weights


def loo_hard_attention_loss(output: Any, targets: Tensor, samples: int, n_expectation: int = 0,
                            reinforce_weight: float = 1.0, entropy_weight: float = 0.0, discount: float = 1.0,
                            alpha_c: float = 0.0, alpha_entropy: float = 0.0) -> LossOutput:
    """Hard attention with K location samples per caption and a leave-one-out, per-word baseline
    (``train.hard.estimator: loo``; Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free").

    Rows of ``output`` / ``targets``: the first ``n_expectation`` are captions read with the expected
    context (the §4.1 trick, one row each); the rest are groups of ``samples`` = K consecutive copies of one
    caption, each with its own sampled cells s^k. Per caption, with ℓ^k_t = log p(y_t | s^k_≤t, a):

        loss = -(1/N) Σ_captions (1/K) Σ_k Σ_t [ ℓ^k_t + λ_r (G^k_t - b^k_t) log p(s^k_t | a) + λ_e H[α^k_t] ]
        G^k_t = Σ_{t' >= t} δ^(t'-t) ℓ^k_t'         (the reward to go: s_t cannot change earlier words)
        b^k_t = mean over the caption's other K-1 copies of G^j_t

    (expectation rows: their ℓ_t and λ_e H once, no REINFORCE term). N counts each caption's words once.
    b^k_t does not depend on s^k, so with δ = 1 and λ_r = 1 the gradient is an unbiased estimate of
    -(1/N) ∂/∂W Σ_captions E_s[log p(y | s, a)], Eq. (10)'s bound, as the paper's estimator is
    (tests/test_losses.py checks it by exact enumeration of every pair of location paths). Against the
    paper's moving average of whole-caption rewards, the baseline removes what the copies share: the
    caption's length and difficulty, the words before t, and the image. δ < 1 credits s_t mostly with the
    words it helps predict next (lower variance, biased). alpha_c and alpha_entropy as hard_attention_loss.
    """
    if output.log_probs is None or output.entropies is None:
        raise ValueError("loo_hard_attention_loss needs a decoder output from attention_mode='sample'")
    K, E = samples, n_expectation
    rows_total, T = targets.shape
    if K < 2 or (rows_total - E) % K:
        raise ValueError(f"loo_hard_attention_loss: {rows_total - E} sampled rows do not form groups of "
                         f"samples={K} (>= 2) copies")
    S = (rows_total - E) // K  # captions with sampled cells
    mask = output.mask.to(torch.float32)  # (rows, T)
    weight = torch.cat([mask.new_ones(E), mask.new_full((S * K,), 1.0 / K)])  # (rows,): each caption counts once
    n_tokens = (mask.sum(dim=1) * weight).sum().clamp(min=1.0)
    nll, flat = _real_token_nll_rows(output, targets)  # (R,), (R,) flat b * T + t
    log_py = -nll  # (R,)
    ll = log_py.new_zeros(rows_total * T).index_copy(0, flat, log_py.detach()).view(rows_total, T)  # (rows, T)
    G = reward_to_go(ll[E:].view(S, K, T), discount)  # (S, K, T)
    b = (G.sum(dim=1, keepdim=True) - G) / (K - 1)  # (S, K, T): the other copies' mean
    m = mask[E:].view(S, K, T)
    advantage = (G - b) * m  # (S, K, T)
    log_ps = _at_least_float32(output.log_probs)[E:].view(S, K, T)
    caption_weight = weight.index_select(0, torch.div(flat, T, rounding_mode="floor"))  # (R,)
    data_term = -(log_py * caption_weight).sum() / n_tokens
    reinforce = -reinforce_weight * (advantage * log_ps).sum() / K / n_tokens
    entropy = (_at_least_float32(output.entropies) * mask * weight.unsqueeze(1)).sum()
    entropy_term = -entropy_weight * entropy / n_tokens
    penalty = caption_penalties(output.alphas, output.mask)  # (rows,)
    sharpness = attention_entropy(output.alphas, output.mask, weight)
    loss = (data_term + reinforce + entropy_term + alpha_c * (penalty * weight).sum() / n_tokens
            + alpha_entropy * sharpness)
    sampled_reward = ll[E:].sum(dim=1)  # (S*K,) log p(y | s, a) per sampled copy
    return LossOutput(loss=loss, parts={
        "xe": data_term.detach(),
        "alpha_penalty": ((penalty * weight).sum() / weight.sum()).detach(),
        "alpha_entropy": sharpness.detach(),
        "reinforce": reinforce.detach(),
        "entropy": (entropy / n_tokens).detach(),
        "reward": sampled_reward.mean() if S else sampled_reward.new_zeros(()),
        "advantage_abs": advantage.abs().sum() / m.sum().clamp(min=1.0),
    })


def update_baseline(baseline: float | None, batch_mean_reward: float, decay: float = 0.9) -> float:
    """Eq. (12)'s moving average: b <- decay·b + (1 - decay)·mean R; the first batch sets b outright
    (starting at 0 would make the early REINFORCE terms huge: R is a sum of log-probabilities)."""
    if baseline is None:
        return float(batch_mean_reward)
    return decay * baseline + (1.0 - decay) * float(batch_mean_reward)




def scst_baseline(rewards: Tensor, kind: str = "mean", greedy_rewards: Tensor | None = None) -> Tensor:
    """Baselines b for sample rewards (B, k): "mean" = mean reward of the image's other k-1 samples
    (needs k >= 2), "greedy" = the greedy caption's reward ``greedy_rewards`` (B,). Returns (B, k)."""
    if kind == "mean":
        k = rewards.shape[1]
        if k < 2:
            raise ValueError("the 'mean' SCST baseline needs at least 2 samples per image")
        return (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
    if kind == "greedy":
        if greedy_rewards is None:
            raise ValueError("the 'greedy' SCST baseline needs the greedy captions' rewards")
        return greedy_rewards.unsqueeze(1).expand_as(rewards)
    raise ValueError(f"unknown SCST baseline {kind!r}; valid: {', '.join(SCST_BASELINES)}")


def scst_loss(sample: Any, rewards: Tensor, baselines: Tensor, entropy_weight: float = 0.0) -> LossOutput:
    """Self-critical REINFORCE on whole captions (module docstring).

    sample: a decoder SampleOutput of N = B·k rows (word and, for hard attention, location
        log-probabilities, 0 after each caption's end); rewards and baselines: (N,), detached.
    entropy_weight: λ_e, hard attention's entropy bonus on the location policy (Eq. 12's term, here
        -λ_e times the mean of H[α_t] over the sampled words, which keeps the location policy exploring).
        Needs ``sample.location_entropies`` when nonzero.
    """
    advantage = (rewards - baselines).detach().float()  # (N,)
    log_p = sample.word_log_probs.sum(dim=1)  # (N,)
    if sample.location_log_probs is not None:
        log_p = log_p + sample.location_log_probs.sum(dim=1)
    loss = -(advantage * log_p).mean()
    parts = {
        "reward": rewards.float().mean().detach(),
        "baseline": baselines.float().mean().detach(),
        "advantage_abs": advantage.abs().mean(),
        "sample_length": sample.lengths.float().mean(),
    }
    entropies = sample.location_entropies
    if entropy_weight:
        if entropies is None:
            raise ValueError("scst_loss: an entropy bonus needs the location entropies of hard attention")
        entropy = entropies.sum() / sample.lengths.float().sum().clamp(min=1.0)  # per sampled word
        loss = loss - entropy_weight * entropy
        parts["entropy"] = entropy.detach()
    return LossOutput(loss=loss, parts=parts)
