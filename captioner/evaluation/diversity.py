"""How different the n best captions of one image are from each other (what diverse beam search is for,
decoding/diverse.py): ``nbest_diversity``.

Per image, on its n best captions' lower-cased whitespace tokens (the decoded words), then averaged over images:
- ``distinct_captions``: how many of the n differ;
- ``distinct_4grams``: how many distinct 4-grams the n hold together, and ``distinct_4gram_share`` that number
  over all their 4-grams (Li et al. 2016's distinct-n, per image);
- ``self_bleu4``: each caption's BLEU-4 against the other n - 1 as references, averaged (Zhu et al. 2018's
  Self-BLEU; lower is more diverse), by pycocoevalcap's BLEU with its per-caption scores.
"""

from __future__ import annotations

from typing import Any, Sequence


def _four_grams(words: Sequence[str]) -> list[tuple[str, ...]]:
    return [tuple(words[i:i + 4]) for i in range(len(words) - 3)]


def nbest_diversity(nbest: dict[Any, list[str]]) -> dict[str, float]:
    """The figures above for ``nbest``: image id -> its n best captions (n >= 2 each), best first."""
    if not nbest:
        raise ValueError("nbest_diversity needs at least one image")
    short = [key for key, captions in nbest.items() if len(captions) < 2]
    if short:
        raise ValueError(f"nbest_diversity needs at least 2 captions per image; image {short[0]!r} has "
                         f"{len(nbest[short[0]])}")
    from pycocoevalcap.bleu.bleu import Bleu

    distinct, grams, shares = [], [], []
    gts: dict[str, list[str]] = {}
    res: dict[str, list[str]] = {}
    for n_image, captions in enumerate(nbest.values()):
        tokens = [tuple(c.lower().split()) for c in captions]
        distinct.append(len(set(tokens)))
        every = [g for words in tokens for g in _four_grams(words)]
        grams.append(len(set(every)))
        shares.append(len(set(every)) / len(every) if every else 0.0)
        for i, words in enumerate(tokens):  # BLEU's reader wants one string per hypothesis, non-empty references
            others = [" ".join(w) or "<empty>" for j, w in enumerate(tokens) if j != i]
            gts[f"{n_image}.{i}"], res[f"{n_image}.{i}"] = others, [" ".join(words) or "<empty>"]
    _, per_caption = Bleu(4).compute_score(gts, res, verbose=0)
    m = len(nbest)
    return {"images": m, "distinct_captions": sum(distinct) / m, "distinct_4grams": sum(grams) / m,
            "distinct_4gram_share": sum(shares) / m, "self_bleu4": 100.0 * sum(per_caption[3]) / len(per_caption[3])}
