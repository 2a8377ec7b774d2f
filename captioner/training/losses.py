"""Training objectives of Xu et al. 2015: soft attention (Eq. 14, with the doubly stochastic penalty and an optional
sharpness term), hard attention (Eq. 10-12: the paper's REINFORCE, a leave-one-out baseline, or a straight-through
Gumbel-softmax read), and self-critical sequence training (Rennie et al. 2017).

docs/losses.md derives each surrogate, its scale (per real target word) and how it is tested. The token
negative log-likelihood runs fused with the output layer (captioner/fast/token_nll.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captioner.fast.token_nll import linear_token_nll
from captioner.names import SCST_BASELINES  # named below the config, which checks train.objective.baseline


@dataclass
class LossOutput:
    """The scalar to minimise and its parts (detached, for logging)."""

    loss: Tensor  # scalar, differentiable
    parts: dict[str, Tensor]  # name -> detached scalar
    reward_sum: Tensor | None = None  # hard: Σ R over sampled images (detached), for the baseline
    reward_count: Tensor | None = None  # hard: number of sampled images


def _at_least_float32(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def real_token_nll(output: Any, targets: Tensor, smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """-log p of the real (unpadded) target tokens, packed: (R,) NLL and (R,) caption index; with ``smoothing``
    ε > 0 the label-smoothed cross-entropy instead (fast/token_nll.py).

    ``output`` is a DecoderOutput: it hands over the output layer's inputs on the real steps (``packed_features``)
    and the output layer's parameters, which then run fused with the loss (linear_token_nll).
    """
    nll, rows = _real_token_nll_rows(output, targets, smoothing)
    return nll, torch.div(rows, targets.shape[1], rounding_mode="floor")


def _real_token_nll_rows(output: Any, targets: Tensor, smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """real_token_nll with each value's flat index b * T + t into targets (B, T) instead of its caption."""
    rows = output.rows  # (R,) flat indices b * T + t
    nll = linear_token_nll(output.packed_features, output.output_weight, output.output_bias,
                           targets.reshape(-1).index_select(0, rows), smoothing)
    return nll, rows


def sequence_cross_entropy(output: Any, targets: Tensor, smoothing: float = 0.0) -> Tensor:
    """Mean negative log-likelihood over the real (unpadded) target tokens of a DecoderOutput (real_token_nll);
    with ``smoothing`` ε > 0, the mean label-smoothed cross-entropy (Szegedy et al. 2016)."""
    nll, _ = real_token_nll(output, targets, smoothing)
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
    paper's Eq. (14) scale against a per-token mean cross-entropy (docs/losses.md)."""
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


def attention_supervision_loss(alphas: Tensor, target_maps: Tensor, supervised: Tensor) -> tuple[Tensor, Tensor]:
    """Liu et al. (AAAI 2017)'s strong supervision of attention: at every supervised step, the cross-entropy
    -Σ_l p_l log α_l between the word's box map p (its boxes' cell fractions, normalised over the grid) and α.

    Args:
        alphas: (N, T, L) the maps of the steps (for hard attention, the location distribution it samples from).
        target_maps: (N, T, L) p, each supervised row summing to 1 (others ignored).
        supervised: (N, T) bool: the steps whose word lies in a boxed phrase (and is a real step).

    Returns:
        (the sum of the cross-entropies, the number of supervised steps): the caller divides by its real target
        words, the per-word scale of every term here (docs/losses.md).
    """
    a = _at_least_float32(alphas)
    ce = -(target_maps.to(a.dtype) * torch.log(a.clamp(min=1e-12))).sum(-1)  # (N, T)
    m = supervised.to(a.dtype)
    return (ce * m).sum(), m.sum()


def attention_mass_loss(alphas: Tensor, shares: Tensor, supervised: Tensor) -> tuple[Tensor, Tensor]:
    """The mass form of supervised attention: at every supervised step, -log Σ_l f_l α_l, where f_l is the share
    of cell l's area inside the word's boxes. Σ_l f_l α_l is α's mass inside the boxes (the "α inside" figure of
    evaluation.regions.inside, on the grid); any map inside them reaches the minimum 0, so it asks for
    the mass, not for Liu et al.'s spread over the whole box.

    Args:
        alphas: (N, T, L) the maps of the steps.
        shares: (N, T, L) f, in [0, 1], some f_l > 0 on each supervised row.
        supervised: (N, T) bool: the steps whose word lies in a boxed phrase (and is a real step).

    Returns:
        (the sum of the terms, the number of supervised steps), as attention_supervision_loss.
    """
    a = _at_least_float32(alphas)
    inside = (shares.to(a.dtype) * a).sum(-1)  # (N, T)
    m = supervised.to(a.dtype)
    return (-torch.log(inside.clamp(min=1e-12)) * m).sum(), m.sum()


def soft_attention_loss(output: Any, targets: Tensor, alpha_c: float = 1.0, alpha_entropy: float = 0.0,
                        label_smoothing: float = 0.0) -> LossOutput:
    """Soft (deterministic) attention, Eq. (14). ``output`` is a DecoderOutput, targets = captions[:, 1:].
    ``label_smoothing`` ε > 0 replaces the word cross-entropy by its label-smoothed form (``parts["xe"]`` is then
    that, as the loss reads it).

    ``parts["alpha_penalty"]`` is the per-caption penalty Σ_i (1 - Σ_t α_ti)² (batch mean), as logged;
    ``parts["alpha_entropy"]`` the mean normalised entropy of α (weighted by ``alpha_entropy`` in the loss).
    """
    xe = sequence_cross_entropy(output, targets, label_smoothing)
    penalty = doubly_stochastic_penalty(output.alphas, output.mask)
    sharpness = attention_entropy(output.alphas, output.mask)
    loss = xe + alpha_c * penalty_per_token(output.alphas, output.mask) + alpha_entropy * sharpness
    return LossOutput(loss=loss, parts={"xe": xe.detach(), "alpha_penalty": penalty.detach(),
                                        "alpha_entropy": sharpness.detach()})


def hard_attention_loss(output: Any, targets: Tensor, baseline: float | None, alpha_c: float = 1.0,
                        reinforce_weight: float = 1.0, entropy_weight: float = 0.01,
                        sampled: Tensor | None = None, alpha_entropy: float = 0.0) -> LossOutput:
    """Hard (stochastic) attention, Eq. (10)-(12); docs/losses.md derives the surrogate.

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


# How hard attention's location policy is trained under cross-entropy (train.objective.kind, the objectives of
# training/objectives/location.py): "reinforce" is hard_attention_loss (Eq. 10-12), "loo" is loo_hard_attention_loss
# (K samples, leave-one-out baseline), "gumbel" is gumbel_attention_loss (the straight-through Gumbel-softmax read,
# no REINFORCE term).


def gumbel_attention_loss(output: Any, targets: Tensor, alpha_c: float = 0.0,
                          alpha_entropy: float = 0.0) -> LossOutput:
    """Hard attention trained through the straight-through Gumbel-softmax read (``train.objective.kind: gumbel``).

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
    (``train.objective.kind: loo``; Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free").

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
    """Self-critical REINFORCE on whole captions (docs/losses.md).

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
