"""The id-level CIDEr-D reward (captioner/training/rewards.py) against pycocoevalcap's scorer."""

from __future__ import annotations

import numpy as np
import pytest
from pycocoevalcap.cider.cider_scorer import CiderScorer

from captioner.training.rewards import CiderD


def _words(ids) -> str:
    return " ".join(f"w{i}" for i in ids)


def _pycoco(candidates, references) -> np.ndarray:
    """pycocoevalcap's CIDEr-D of candidate i against references[i]; its document frequencies
    and log|I| come from exactly these references (one candidate per image)."""
    scorer = CiderScorer(n=4, sigma=6.0)
    for cand, refs in zip(candidates, references):
        scorer += (_words(cand), [_words(r) for r in refs])
    return scorer.compute_score()[1]


def _random_corpus(rng, n_images=25, vocab=9):
    references = [[list(rng.integers(0, vocab, rng.integers(1, 13))) for _ in range(rng.integers(1, 6))]
                  for _ in range(n_images)]
    return references


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_pycocoevalcap(seed):
    rng = np.random.default_rng(seed)
    references = _random_corpus(rng)
    reward = CiderD(references, vocab_size=9)
    for _round in range(3):  # several candidates per image, scored in one batch below
        candidates = []
        for refs in references:
            kind = rng.integers(0, 4)
            if kind == 0:  # a reference itself: large scores, clipping matters
                candidates.append(list(refs[rng.integers(0, len(refs))]))
            elif kind == 1:  # a perturbed reference
                c = list(refs[0]) + list(rng.integers(0, 9, rng.integers(0, 4)))
                candidates.append(c)
            elif kind == 2:
                candidates.append(list(rng.integers(0, 9, rng.integers(1, 15))))
            else:  # very short, including empty
                candidates.append(list(rng.integers(0, 9, rng.integers(0, 2))))
        ours = reward(candidates, np.arange(len(references)))
        theirs = _pycoco(candidates, references)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
        assert ours.max() > 1.0  # not all zero: the comparison has teeth


def test_padded_batch_and_shared_images():
    rng = np.random.default_rng(3)
    references = _random_corpus(rng, n_images=6)
    reward = CiderD(references, vocab_size=9)
    cands = [list(references[i][0]) for i in (0, 0, 5, 2)]
    images = [0, 3, 5, 2]
    lengths = np.array([len(c) for c in cands])
    padded = np.full((4, lengths.max() + 3), 7)  # padding values must be ignored
    for i, c in enumerate(cands):
        padded[i, : len(c)] = c
    from_list = reward(cands, images)
    np.testing.assert_allclose(reward(padded, images, lengths=lengths), from_list, atol=1e-12)
    assert from_list[0] > from_list[1]  # image 0's own reference scores higher on image 0 than on image 3


def test_an_end_in_the_references_is_scored_as_a_word():
    """SCST's reward_end passes references ending in <end> (id 2): a finished caption then beats the same words
    cut off; without it, the words alone match."""
    references = [[[3, 4, 5]], [[6, 7]], [[3, 8]]]
    plain = CiderD(references, vocab_size=10)
    ended = CiderD([[r + [2] for r in refs] for refs in references], vocab_size=10)
    assert ended([[3, 4, 5, 2]], [0])[0] > ended([[3, 4, 5]], [0])[0]  # the finished caption wins
    assert plain([[3, 4, 5]], [0])[0] > plain([[3, 4, 5, 2]], [0])[0] > 0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one"):
        CiderD([], vocab_size=5)
    reward = CiderD([[[1, 2]]], vocab_size=5)
    with pytest.raises(ValueError, match="out of range"):
        reward([[1, 2]], [1])
    with pytest.raises(ValueError, match="too large"):
        CiderD([[[1]]], vocab_size=10 ** 6)
