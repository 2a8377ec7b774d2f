"""Diverse beam search (DecodeOptions.beam_groups, diversity; decoding/diverse.py): the group choice by hand, the
batched search against a plain-Python reference of the paper's algorithm, scores that stay plain log-probs,
first words that differ where plain beam search's repeat, and the settings refused."""

import math

import pytest
import torch

from captioner.decoding.diverse import diverse_first, diverse_top
from captioner.decoding.options import DecodeOptionError, DecodeOptions
from captioner.decoding.search import beam_search, map_state
from tests.test_search import END, START, RandomStep, as_logits, batch


def test_a_group_is_penalised_for_the_words_the_groups_before_it_chose():
    # one image, two groups of one beam, three words; beam 0 and beam 1 both like word 2 best
    cand = torch.tensor([[[-3.0, -2.0, -0.5], [-3.0, -1.0, -0.8]]], dtype=torch.float64)  # (B=1, K=2, V=3)
    frozen = torch.zeros(1, 2, dtype=torch.bool)
    scores, index = diverse_top(cand, 2, 0.5, frozen)
    # group 0 takes word 2 (-0.5); group 1 ranks word 2 at -0.8 - 0.5 = -1.3 < word 1's -1.0: it takes word 1,
    # and carries its raw score
    assert index.tolist() == [[2, 3 + 1]] and scores.tolist() == [[-0.5, -1.0]]
    scores, index = diverse_top(cand, 2, 0.1, frozen)  # a small penalty: both keep word 2
    assert index.tolist() == [[2, 3 + 2]] and scores.tolist() == [[-0.5, -0.8]]
    # a finished beam of group 0 (its <end> candidate) neither counts against group 1 nor is penalised itself
    frozen_cand = torch.tensor([[[-math.inf, -math.inf, -0.5], [-3.0, -1.0, -0.8]]], dtype=torch.float64)
    scores, index = diverse_top(frozen_cand, 2, 0.5, torch.tensor([[True, False]]))
    assert index.tolist() == [[2, 3 + 2]] and scores.tolist() == [[-0.5, -0.8]]


def test_the_first_step_splits_the_start_words_between_groups():
    log_probs = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64))
    scores, words = diverse_first(log_probs, 4, 2, 10.0)  # groups of two; a large penalty: no word twice
    assert words.tolist() == [[3, 2, 1, 0]]
    assert scores[0].tolist() == pytest.approx(log_probs[0, [3, 2, 1, 0]].tolist())
    _, words = diverse_first(log_probs, 4, 2, 1e-3)  # a tiny one: both groups take the two best
    assert words.tolist() == [[3, 2, 3, 2]]


def reference_diverse_beam(m, image, K, G, lam, max_length, n_best):
    """The paper's algorithm in plain Python for one image (no early stop): per step, the groups in turn, each
    ranking its candidates by score - lam * (beams of earlier groups that chose the word at this step)."""
    k = K // G
    start = map_state(m.init_state(64), lambda x: x[image: image + 1])
    lp0, _, st0 = m(torch.tensor([START]), start)
    counts = [0] * m.V
    beams = []
    for _ in range(G):  # the first step: one row, each group picks its k words
        ranked = sorted(range(m.V), key=lambda w: -(float(lp0[0, w]) - lam * counts[w]))[:k]
        for w in ranked:
            counts[w] += 1
            beams.append((float(lp0[0, w]), [w], w == END, st0))
    pool = [(s / 1.0, s, [], True) for s, toks, fin, _ in beams if fin]
    beams = [(s, [] if fin else toks, fin, st) for s, toks, fin, st in beams]
    for _t in range(1, max_length):
        counts = [0] * m.V
        chosen = []
        for g in range(G):
            cands = []
            for score, toks, fin, st in beams[g * k:(g + 1) * k]:
                if fin:
                    cands.append((score, score, toks, True, st, False))
                    continue
                lp_t, _, st2 = m(torch.tensor([toks[-1] if toks else START]), st)
                for w in range(m.V):
                    raw = score + float(lp_t[0, w])
                    cands.append((raw - lam * counts[w], raw, toks + [w], False, st2, w == END))
            cands.sort(key=lambda c: -c[0])
            for _, raw, toks, fin, st, ends in cands[:k]:
                if not fin:
                    counts[toks[-1]] += 1
                if ends:
                    pool.append((raw / len(toks), raw, toks[:-1], True))
                chosen.append((raw, toks[:-1] if ends else toks, fin or ends, st))
        beams = chosen
    everything = pool + [(s / len(toks), s, toks, False) for s, toks, fin, _ in beams if not fin]
    everything.sort(key=lambda h: -h[0])
    return everything[:n_best]


@pytest.mark.parametrize("seed,K,G,lam", [(0, 4, 2, 0.5), (1, 4, 4, 2.0), (2, 6, 3, 1.0), (3, 3, 3, 0.3)])
def test_the_batched_search_equals_the_papers_algorithm(seed, K, G, lam):
    m = RandomStep(seed=seed, end_bias=1.0)
    B, max_length = 4, 6
    options = DecodeOptions(beam=K, n_best=K, max_length=max_length, beam_groups=G, diversity=lam)
    out = beam_search(m, m.init_state(B), options, **batch(B))
    for b in range(B):
        ref = reference_diverse_beam(m, b, K, G, lam, max_length, K)
        assert [h.tokens for h in out[b]] == [r[2] for r in ref]
        assert [h.score for h in out[b]] == pytest.approx([r[1] for r in ref], abs=1e-6)  # plain log-probs
        for h in out[b]:
            assert h.score == pytest.approx(m.replay_score(b, h.tokens, h.finished), abs=1e-6)


def test_from_logits_it_equals_dense_log_probs():
    m = RandomStep(seed=4, end_bias=1.0)
    options = DecodeOptions(beam=4, n_best=4, max_length=6, beam_groups=2, diversity=0.7)
    dense = beam_search(m, m.init_state(3), options, **batch(3))
    logits = beam_search(as_logits(m), m.init_state(3), options, **batch(3))
    assert [[h.tokens for h in hyps] for hyps in dense] == [[h.tokens for h in hyps] for hyps in logits]


def test_its_n_best_start_differently_where_plain_beams_share_their_start():
    m = RandomStep(seed=5, end_bias=0.5)
    B = 6
    plain = beam_search(m, m.init_state(B), DecodeOptions(beam=4, n_best=4, max_length=8), **batch(B))
    diverse = beam_search(m, m.init_state(B), DecodeOptions(beam=4, n_best=4, max_length=8, beam_groups=4,
                                                            diversity=5.0), **batch(B))

    def distinct_first_words(out):
        return sum(len({h.tokens[0] for h in hyps if h.tokens}) for hyps in out)

    assert distinct_first_words(diverse) > distinct_first_words(plain)


@pytest.mark.parametrize("settings,setting", [
    (dict(beam=4, beam_groups=3, diversity=0.5), "beam_groups"),  # does not divide the beam
    (dict(beam=4, beam_groups=2, diversity=0.0), "diversity"),  # the groups would search alike
    (dict(beam=4, beam_groups=1, diversity=0.5), "diversity"),  # plain beam search would ignore it
    (dict(beam=4, beam_groups=2, diversity=-1.0), "diversity"),
    (dict(beam=4, beam_groups=0, diversity=0.5), "beam_groups"),
])
def test_settings_that_cannot_work_together_are_refused(settings, setting):
    with pytest.raises(DecodeOptionError, match=f"decoding: {setting} "):
        DecodeOptions(**settings)


def test_nbest_diversity_by_hand():
    from captioner.evaluation.diversity import nbest_diversity

    nbest = {"a": ["a dog runs on grass", "a dog runs on grass", "a dog runs in water"],  # 2 distinct
             "b": ["two men", "three men walk", "two men"]}  # no 4-gram
    got = nbest_diversity(nbest)
    # image a: 4-grams (a dog runs on)x2, (dog runs on grass)x2, (a dog runs in), (dog runs in water): 4 distinct
    # of 6; image b: none
    assert got["images"] == 2 and got["distinct_captions"] == (2 + 2) / 2
    assert got["distinct_4grams"] == (4 + 0) / 2 and got["distinct_4gram_share"] == pytest.approx((4 / 6 + 0) / 2)
    same = nbest_diversity({"a": ["a dog runs on grass"] * 3})
    assert same["self_bleu4"] == pytest.approx(100.0, abs=1e-3)  # identical captions: BLEU-4 1 against each other
    assert got["self_bleu4"] < same["self_bleu4"]
    with pytest.raises(ValueError, match="at least 2 captions per image; image 'c' has 1"):
        nbest_diversity({"c": ["one"]})
