"""Objectives: the cross-entropy over real tokens, the doubly stochastic penalty (Eq. 14), and the REINFORCE
estimator of hard attention (Eq. 10-12) checked against the exact gradient by enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from captioner.models.decoders.contract import DecoderOutput
from captioner.training.losses import (
    doubly_stochastic_penalty,
    hard_attention_loss,
    loo_hard_attention_loss,
    reward_to_go,
    sequence_cross_entropy,
    soft_attention_loss,
    update_baseline,
)


def _decoder_output(logits, alphas, mask, log_probs=None, entropies=None) -> DecoderOutput:
    """A DecoderOutput whose output layer is the identity: the logits (B, T, V) of the real steps are its
    packed_features, so gradients reach ``logits`` itself."""
    B, T, V = logits.shape
    rows = mask.reshape(-1).nonzero().squeeze(1)  # (R,) real steps, row-major
    return DecoderOutput(packed_features=logits.reshape(B * T, V).index_select(0, rows),
                         output_weight=torch.eye(V, dtype=logits.dtype), output_bias=None, rows=rows,
                         alphas=alphas, log_probs=log_probs, entropies=entropies, mask=mask)


def _output(B=3, T=4, V=5, L=6, seed=0, hard=False):
    """A DecoderOutput, its targets and the logits (B, T, V) it was made from (a leaf, for gradients)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 2, 1])[:B]  # steps per caption (real targets)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    alphas = torch.softmax(torch.randn(B, T, L, generator=g), -1) * mask.unsqueeze(-1)
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    log_probs = entropies = None
    if hard:
        log_probs = (-torch.rand(B, T, generator=g) * mask).requires_grad_()
        entropies = torch.rand(B, T, generator=g) * mask
    targets = torch.randint(0, V, (B, T), generator=g)
    return _decoder_output(logits, alphas, mask, log_probs, entropies), targets, logits


def test_sequence_cross_entropy_ignores_padding_and_averages_real_tokens():
    out, targets, logits = _output()
    nll = F.cross_entropy(logits[out.mask], targets[out.mask])  # mean over real tokens
    assert torch.allclose(sequence_cross_entropy(out, targets), nll)
    # Garbage at padded steps changes nothing.
    garbage = logits.detach().clone()
    garbage[~out.mask] = 1e4
    assert torch.allclose(sequence_cross_entropy(_decoder_output(garbage, out.alphas, out.mask), targets), nll)


def test_doubly_stochastic_penalty_counts_real_steps_only():
    B, T, L = 2, 3, 3
    mask = torch.tensor([[True, True, True], [True, False, False]])
    alphas = torch.full((B, T, L), 1.0 / 3)
    # Image 0 attends each location exactly once in total (1/3 * 3 steps): no penalty. Image 1
    # has one real step: each location gets 1/3, penalty 3 * (2/3)^2; the padded steps must not count.
    expected = (0.0 + 3 * (2 / 3) ** 2) / 2
    assert doubly_stochastic_penalty(alphas, mask).item() == pytest.approx(expected)


def test_soft_loss_weighs_the_penalty_against_the_captions_summed_nll():
    """Eq. (14) per caption: Σ_t NLL + λ Σ_i (1 - Σ_t α_ti)², summed over captions and divided by
    the number of real words (so the XE part is the per-token mean and λ is the paper's λ)."""
    out, targets, logits = _output()
    res = soft_attention_loss(out, targets, alpha_c=2.0)
    nll = F.cross_entropy(logits.detach().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
    per_caption = []
    for b in range(targets.shape[0]):
        m = out.mask[b]
        coverage = out.alphas[b][m].sum(0)  # (L,)
        per_caption.append(nll[b][m].sum() + 2.0 * ((1 - coverage) ** 2).sum())
    expected = torch.stack(per_caption).sum() / out.mask.sum()
    assert res.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # The logged penalty stays the per-caption mean of Σ_i (1 - Σ_t α_ti)².
    assert res.parts["alpha_penalty"].item() == pytest.approx(doubly_stochastic_penalty(out.alphas, out.mask).item())
    res.loss.backward()
    assert logits.grad[~out.mask].abs().max() == 0  # no gradient reaches padded steps


def test_hard_loss_parts_masking_and_expectation_images():
    out, targets, logits = _output(hard=True)
    sampled = torch.tensor([True, False, True])
    res = hard_attention_loss(out, targets, baseline=-3.0, alpha_c=0.0, entropy_weight=0.0, sampled=sampled)
    log_py = F.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * out.mask
    reward = log_py.sum(1)
    assert res.reward_count.item() == 2
    assert res.reward_sum.item() == pytest.approx(reward[sampled].sum().item(), rel=1e-5)
    res.loss.backward()
    assert out.log_probs.grad[~out.mask].abs().max() == 0
    n = out.mask.sum()
    # d loss / d log p(s_bt) = -(R_b - b) / N at real steps.
    expected = -(reward.detach() + 3.0).unsqueeze(1).expand_as(out.mask) / n
    assert torch.allclose(out.log_probs.grad[out.mask], expected[out.mask], atol=1e-6)


def test_hard_loss_requires_sampled_outputs():
    out, targets, _ = _output(hard=False)
    with pytest.raises(ValueError, match="attention_mode='sample'"):
        hard_attention_loss(out, targets, baseline=0.0)


def test_update_baseline_moving_average():
    assert update_baseline(None, -10.0) == -10.0
    assert update_baseline(-10.0, -20.0, decay=0.9) == pytest.approx(-11.0)


# ----------------------------------------------------------------------------- REINFORCE vs brute force

L_LOC, V_TOK, TARGET = 3, 3, (0, 2)


def _tiny_params(seed=1):
    g = torch.Generator().manual_seed(seed)
    return {
        "w1": torch.randn(L_LOC, generator=g),  # alpha_1 logits
        "w2": torch.randn(L_LOC, L_LOC, generator=g),  # alpha_2 logits given s_1
        "u1": torch.randn(L_LOC, V_TOK, generator=g),  # word-1 logits given s_1
        "u2": torch.randn(L_LOC, V_TOK, generator=g),  # word-2 logits: u2[s_1] + u3[s_2]
        "u3": torch.randn(L_LOC, V_TOK, generator=g),
    }


def _tiny_forward(p, s1, s2):
    """Per-sample params p[k] (N, ...); locations s1, s2 (N,). Returns logits (N, 2, V), alphas (N, 2, L)."""
    N = s1.shape[0]
    rows = torch.arange(N)
    a1 = torch.softmax(p["w1"], -1)  # (N, L)
    a2 = torch.softmax(p["w2"][rows, s1], -1)  # (N, L): alpha_2 depends on theta and s_1
    logits = torch.stack([p["u1"][rows, s1], p["u2"][rows, s1] + p["u3"][rows, s2]], dim=1)  # (N, 2, V)
    return logits, torch.stack([a1, a2], dim=1)


def _exact_gradient(params):
    """∂/∂θ of L_s = Σ_s p(s|a) log p(y|s,a), by enumerating all L^2 = 9 location paths."""
    theta = {k: v.clone().requires_grad_() for k, v in params.items()}
    paths = torch.tensor(list(itertools.product(range(L_LOC), repeat=2)))  # (9, 2)
    rep = {k: v.unsqueeze(0).expand(len(paths), *v.shape) for k, v in theta.items()}
    logits, alphas = _tiny_forward(rep, paths[:, 0], paths[:, 1])
    p_s = alphas[:, 0].gather(1, paths[:, :1]).squeeze(1) * alphas[:, 1].gather(1, paths[:, 1:]).squeeze(1)  # (9,)
    log_py = F.log_softmax(logits, -1)[:, [0, 1], list(TARGET)].sum(1)  # (9,)
    (p_s * log_py).sum().backward()
    return {k: v.grad for k, v in theta.items()}


def _sampled_gradients(params, baseline, n=20000, seed=0, reinforce_weight=1.0):
    """Per-sample estimates g_b (n, ...) of ∂L_s/∂θ from hard_attention_loss's gradient."""
    g = torch.Generator().manual_seed(seed)
    rep = {k: v.unsqueeze(0).repeat(n, *[1] * v.dim()).requires_grad_() for k, v in params.items()}
    with torch.no_grad():
        a1 = torch.softmax(params["w1"], -1)
        s1 = torch.multinomial(a1.expand(n, -1), 1, generator=g).squeeze(1)  # (n,)
        a2 = torch.softmax(params["w2"][s1], -1)  # (n, L)
        s2 = torch.multinomial(a2, 1, generator=g).squeeze(1)
    logits, alphas = _tiny_forward(rep, s1, s2)
    s = torch.stack([s1, s2], 1)  # (n, 2)
    log_ps = torch.log(alphas.gather(2, s.unsqueeze(-1)).squeeze(-1))  # (n, 2): log p(s_t | a)
    entropies = -(alphas * alphas.log()).sum(-1)
    out = _decoder_output(logits, alphas, torch.ones(n, 2, dtype=torch.bool), log_ps, entropies)
    targets = torch.tensor(TARGET).expand(n, 2)
    res = hard_attention_loss(out, targets, baseline=baseline, alpha_c=0.0, reinforce_weight=reinforce_weight,
                              entropy_weight=0.0)
    res.loss.backward()
    n_tokens = 2 * n
    # loss = -(1/N_tok) Σ_b surrogate_b, and sample b only touches row b of the replicated params.
    return {k: -n_tokens * v.grad for k, v in rep.items()}


@pytest.mark.parametrize("baseline", [0.0, -2.5])
def test_reinforce_gradient_matches_enumeration(baseline):
    torch.manual_seed(0)
    params = _tiny_params()
    exact = _exact_gradient(params)
    per_sample = _sampled_gradients(params, baseline)
    for k in params:
        mean = per_sample[k].mean(0)
        se = per_sample[k].std(0) / per_sample[k].shape[0] ** 0.5
        assert torch.all((mean - exact[k]).abs() <= 5 * se + 1e-5), (k, mean, exact[k], se)
    # The check has teeth: without the REINFORCE term the attention parameters get no gradient at all.
    biased = _sampled_gradients(params, baseline, reinforce_weight=0.0)
    se = per_sample["w1"].std(0) / per_sample["w1"].shape[0] ** 0.5
    assert torch.any((biased["w1"].mean(0) - exact["w1"]).abs() > 5 * se)


def _tiny_output(rep, s1, s2):
    """A DecoderOutput of the tiny model on location paths (s1, s2)."""
    logits, alphas = _tiny_forward(rep, s1, s2)
    s = torch.stack([s1, s2], 1)  # (N, 2)
    log_ps = torch.log(alphas.gather(2, s.unsqueeze(-1)).squeeze(-1))  # (N, 2)
    entropies = -(alphas * alphas.log()).sum(-1)
    return _decoder_output(logits, alphas, torch.ones(s1.shape[0], 2, dtype=torch.bool), log_ps, entropies)


def _loo_expected_gradient(params, samples, reinforce_weight=1.0, discount=1.0):
    """E over every K-tuple of location paths (exact, by enumeration) of the gradient that
    loo_hard_attention_loss gives one caption: Σ_tuples p(tuple) ĝ(tuple)."""
    paths = list(itertools.product(range(L_LOC), repeat=2))  # the 9 paths (s1, s2)
    tuples = torch.tensor(list(itertools.product(range(len(paths)), repeat=samples)))  # (9^K, K)
    path = torch.tensor(paths)[tuples.reshape(-1)]  # (9^K * K, 2): K consecutive rows per tuple
    n = path.shape[0]
    rep = {k: v.unsqueeze(0).repeat(n, *[1] * v.dim()).requires_grad_() for k, v in params.items()}
    out = _tiny_output(rep, path[:, 0], path[:, 1])
    targets = torch.tensor(TARGET).expand(n, 2)
    res = loo_hard_attention_loss(out, targets, samples=samples, reinforce_weight=reinforce_weight,
                                  discount=discount)
    res.loss.backward()
    with torch.no_grad():
        p_s = out.alphas.gather(2, path.unsqueeze(-1)).squeeze(-1).prod(1)  # (n,) p(path) per row
        p_tuple = p_s.view(-1, samples).prod(1)  # (9^K,)
    n_tokens = 2 * tuples.shape[0]  # each caption's words counted once
    # loss = -(1/N) Σ_tuples ĝ-surrogate; tuple i only touches its K rows of the replicated params.
    return {k: (-n_tokens * v.grad).view(-1, samples, *v.shape[1:]).sum(1).mul(
        p_tuple.view(-1, *[1] * (v.dim() - 1))).sum(0) for k, v in rep.items()}


@pytest.mark.parametrize("samples", [2, 3])
def test_loo_gradient_equals_exact_gradient_by_enumeration(samples):
    """The leave-one-out estimator, averaged exactly over every K-tuple of location paths, is the exact
    gradient of Σ_s p(s|a) log p(y|s,a): unbiased, with no Monte Carlo error to allow for."""
    params = _tiny_params()
    exact = _exact_gradient(params)
    expected = _loo_expected_gradient(params, samples)
    for k in params:
        assert torch.allclose(expected[k], exact[k], atol=1e-5), (k, expected[k], exact[k])
    # Teeth: without its REINFORCE term, or crediting s_1 only with the next word (δ = 0), it is biased.
    for biased in (_loo_expected_gradient(params, samples, reinforce_weight=0.0),
                   _loo_expected_gradient(params, samples, discount=0.0)):
        assert (biased["w1"] - exact["w1"]).abs().max() > 1e-3


def test_reward_to_go_discounts_later_words():
    r = torch.tensor([[1.0, 2.0, 4.0]])
    assert reward_to_go(r).tolist() == [[7.0, 6.0, 4.0]]
    assert reward_to_go(r, 0.5).tolist() == [[1 + 1 + 1, 2 + 2, 4.0]]
    assert reward_to_go(r, 0.0).tolist() == [[1.0, 2.0, 4.0]]


def test_loo_loss_expectation_rows_and_per_word_baseline():
    """Expectation rows add their words' NLL once and no REINFORCE term; a sampled copy's location
    gradient at step t is -(G_t - mean of the other copies' G_t) / (K N)."""
    g = torch.Generator().manual_seed(3)
    K, T, V = 2, 3, 4
    rows = 1 + K  # one expectation caption, one sampled caption in K copies
    mask = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    logits = torch.randn(rows, T, V, generator=g, requires_grad=True)
    log_probs = (-torch.rand(rows, T, generator=g)).requires_grad_()
    out = _decoder_output(logits, torch.softmax(torch.randn(rows, T, 5, generator=g), -1), mask, log_probs,
                          torch.rand(rows, T, generator=g))
    targets = torch.randint(0, V, (rows, T), generator=g)
    res = loo_hard_attention_loss(out, targets, samples=K, n_expectation=1)
    res.loss.backward()
    ll = F.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).detach() * mask
    n = 2 + 3  # the expectation caption's 2 words + the sampled caption's 3, once
    nll = -(ll[0].sum() + ll[1:].sum() / K)
    assert res.parts["xe"].item() == pytest.approx(nll.item() / n, rel=1e-5)
    G = reward_to_go(ll[1:])  # (K, T)
    expected = -(G - G.flip(0)) / (K * n)  # with K = 2 the other copy is the baseline
    assert torch.allclose(log_probs.grad[1:], expected, atol=1e-6)
    assert log_probs.grad[0].abs().max() == 0
    with pytest.raises(ValueError, match="groups of samples=2"):
        loo_hard_attention_loss(out, targets, samples=K, n_expectation=0)


def test_attention_entropy_term_is_normalised_and_weighted():
    from captioner.training.losses import attention_entropy

    L = 6
    mask = torch.tensor([[True, True, False]])
    uniform = torch.full((1, 3, L), 1.0 / L)
    one_hot = torch.zeros(1, 3, L)
    one_hot[..., 2] = 1.0
    assert attention_entropy(uniform, mask).item() == pytest.approx(1.0)
    assert attention_entropy(one_hot, mask).item() == pytest.approx(0.0, abs=1e-6)
    mixed = torch.cat([uniform[:, :1], one_hot[:, 1:]], dim=1)  # one uniform word, one one-hot word
    assert attention_entropy(mixed, mask).item() == pytest.approx(0.5)

    out, targets, _ = _output()
    base = soft_attention_loss(out, targets, alpha_c=0.0)
    sharp = soft_attention_loss(out, targets, alpha_c=0.0, alpha_entropy=0.3)
    expected = 0.3 * attention_entropy(out.alphas, out.mask).item()
    assert sharp.loss.item() - base.loss.item() == pytest.approx(expected, rel=1e-5)
    assert sharp.parts["alpha_entropy"].item() == pytest.approx(expected / 0.3, rel=1e-6)
