"""Self-critical training (losses.scst_loss + FastShowAttendTellDecoder.sample): the Monte-Carlo
gradient equals the exact gradient of the expected reward, found by enumerating every caption
(and, for hard attention, every sequence of attended cells) of a tiny decoder."""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import pytest
import torch

from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.training.losses import scst_baseline, scst_loss

PAD, START, END = 0, 1, 2
WORDS = (END, 3, 4)  # what a step may emit
MAX_LEN = 2
CELLS = 2


def _mode(dec) -> str:
    """What SCST samples with (SelfCritical.sample_mode): cells and words for hard attention, words for soft."""
    return "sample" if dec.stochastic else "expectation"


def _decoder(kind: str) -> FastShowAttendTellDecoder:
    torch.manual_seed(0)
    dec = FastShowAttendTellDecoder(vocab_size=5, feature_dim=3, embed_dim=4, hidden_dim=4, attention_dim=4,
                                attention=kind, dropout=0.0)
    return dec.double()


def _reward_table():
    g = torch.Generator().manual_seed(1)
    captions = [(END,)] + [(a, b) for a in (3, 4) for b in WORDS]
    return {c: float(torch.rand((), generator=g)) for c in captions}


def _trajectories(hard: bool):
    for caption in _reward_table():
        cells = itertools.product(range(CELLS), repeat=len(caption)) if hard else [()]
        for cell_seq in cells:
            yield caption, cell_seq


@contextmanager
def _forced_draws(draws):
    """torch.multinomial returns the scripted choices in call order (per step: the cell, then the word)."""
    queue = list(draws)
    original = torch.multinomial

    def scripted(probs, num_samples, *args, **kwargs):
        return torch.full((probs.shape[0], 1), queue.pop(0), dtype=torch.long)

    torch.multinomial = scripted
    try:
        yield
    finally:
        torch.multinomial = original
    assert not queue


def _exact_gradient(dec, grid, hard: bool):
    """∇ E[r] = ∇ Σ_τ p(τ) r(τ), τ running over every caption (and cell sequence)."""
    rewards = _reward_table()
    dec.zero_grad()
    total = 0.0
    for caption, cells in _trajectories(hard):
        draws = [x for pair in zip(cells, caption) for x in pair] if hard else list(caption)
        with _forced_draws(draws):
            out = dec.sample(grid, 1, START, END, MAX_LEN, attention_mode=_mode(dec))
        assert tuple(out.tokens[0, : int(out.lengths[0])].tolist()) == caption
        log_p = out.word_log_probs.sum() + (out.location_log_probs.sum() if hard else 0.0)
        total = total + log_p.exp() * rewards[caption]
    total.backward()
    return [p.grad.clone() for p in dec.parameters()], float(total.detach())


def _estimated_gradient(dec, grid, baseline: str, k: int):
    rewards = _reward_table()
    dec.zero_grad()
    out = dec.sample(grid, k, START, END, MAX_LEN, attention_mode=_mode(dec))
    caps = [tuple(row[: int(n)].tolist()) for row, n in zip(out.tokens, out.lengths)]
    r = torch.tensor([rewards[c] for c in caps], dtype=torch.float64)
    greedy = None
    if baseline == "greedy":
        with torch.no_grad():
            g = dec.sample(grid, 1, START, END, MAX_LEN, greedy=True,
                           attention_mode="argmax" if dec.stochastic else "expectation")
        greedy = torch.tensor([rewards[tuple(g.tokens[0, : int(g.lengths[0])].tolist())]], dtype=torch.float64)
    b = scst_baseline(r.view(1, k), baseline, greedy).reshape(-1)
    res = scst_loss(out, r, b)
    res.loss.backward()
    return [-p.grad.clone() for p in dec.parameters()]  # the loss descends -E[r]


@pytest.mark.parametrize("kind", ["soft", "hard"])
@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_scst_gradient_matches_enumeration(kind, baseline):
    hard = kind == "hard"
    dec = _decoder(kind)
    # Large, distinct cells: the words depend on which cell is read, so the scorer's gradient is not tiny.
    grid = 6.0 * torch.randn(1, CELLS, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact, expected_reward = _exact_gradient(dec, grid, hard)
    torch.manual_seed(3)
    rounds = [_estimated_gradient(dec, grid, baseline, k=20000) for _ in range(5)]
    estimate = [torch.stack(parts).mean(0) for parts in zip(*rounds)]
    flat_exact = torch.cat([g.flatten() for g in exact])
    flat_est = torch.cat([g.flatten() for g in estimate])
    assert flat_exact.norm() > 1e-2  # a gradient worth matching
    rel = (flat_est - flat_exact).norm() / flat_exact.norm()
    assert rel < 0.1, f"relative error {rel:.3f}"
    assert torch.nn.functional.cosine_similarity(flat_est, flat_exact, dim=0) > 0.99
    # The scorer's gradient, separately: under hard attention it flows through log p(s_t) only, so a
    # loss that dropped the location term would leave it at zero.
    names = [n for n, _ in dec.named_parameters()]
    scorer = [i for i, n in enumerate(names) if n.startswith("attention.scorer")]
    ex = torch.cat([exact[i].flatten() for i in scorer])
    es = torch.cat([estimate[i].flatten() for i in scorer])
    assert ex.norm() > 1e-2
    assert (es - ex).norm() / ex.norm() < 0.2, f"scorer gradient off by {(es - ex).norm() / ex.norm():.3f}"
    assert 0.0 < expected_reward < 1.0


def test_sample_masks_after_end_and_forbids_ids():
    dec = _decoder("soft")
    grid = torch.randn(2, CELLS, 3, dtype=torch.float64)
    out = dec.sample(grid, 50, START, END, max_length=4, forbid_ids=(3,), attention_mode="expectation")
    assert out.tokens.shape[0] == 100
    assert not (out.tokens == 3).any() and not (out.tokens == START).any()
    for row, n, lp in zip(out.tokens, out.lengths, out.word_log_probs):
        n = int(n)
        assert (row[n:] == PAD).all() and (row[:n] != PAD).all()
        assert (lp[n:] == 0).all() and (lp[:n] < 0).all()
        if n < out.tokens.shape[1]:
            assert row[n - 1] == END  # a short row ended with <end>
    assert out.location_log_probs is None


def test_baselines():
    r = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
    assert torch.allclose(scst_baseline(r, "mean"), torch.tensor([[2.5, 2.0, 1.5], [3.0, 3.0, 0.0]]))
    assert torch.allclose(scst_baseline(r, "greedy", torch.tensor([1.0, 2.0])),
                          torch.tensor([[1.0] * 3, [2.0] * 3]))
    with pytest.raises(ValueError, match="at least 2"):
        scst_baseline(r[:, :1], "mean")
    with pytest.raises(ValueError, match="unknown"):
        scst_baseline(r, "median")


def test_hard_scst_gives_the_location_policy_its_entropy_bonus():
    """Under SCST the hard model's cells get λ_e's bonus: -λ_e times the mean of H[α_t] over sampled words,
    with a gradient that raises α's entropy; soft samples carry no location entropies."""
    dec = _decoder("hard")
    grid = torch.randn(2, CELLS, 3, dtype=torch.float64)
    out = dec.sample(grid, 4, START, END, max_length=3)
    H = out.location_entropies  # (N, T)
    assert H.shape == out.word_log_probs.shape and H.requires_grad
    ran = torch.arange(H.shape[1]).unsqueeze(0) < out.lengths.unsqueeze(1)
    assert (H[~ran] == 0).all() and (H[ran] > 0).all()
    rewards, baselines = torch.rand(8, dtype=torch.float64), torch.rand(8, dtype=torch.float64)
    plain = scst_loss(out, rewards, baselines)
    bonus = scst_loss(out, rewards, baselines, entropy_weight=0.5)
    mean_h = H.sum() / out.lengths.sum()
    assert bonus.loss.item() == pytest.approx(plain.loss.item() - 0.5 * mean_h.item())
    assert bonus.parts["entropy"].item() == pytest.approx(mean_h.item())
    assert dec.sample(grid, 2, START, END, max_length=3).location_entropies is not None
    soft = _decoder("soft").sample(grid, 2, START, END, max_length=3, attention_mode="expectation")
    assert soft.location_entropies is None
    with pytest.raises(ValueError, match="entropy bonus"):
        scst_loss(soft, rewards[:4], baselines[:4], entropy_weight=0.5)
