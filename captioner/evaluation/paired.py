"""Paired comparison of two captioners on the same photos: each metric's difference (B - A) with a paired bootstrap
95 % interval, the photos resampled with replacement (Efron & Tibshirani 1993; Koehn 2004 for MT metrics). On 1,000
photos a CIDEr-D point can be noise; the interval says how much.

Per photo, what a resample sums:

- CIDEr-D and ROUGE-L: pycocoevalcap's per-photo scores. Their corpus figure is the mean over photos, so the
  resampled figure is the resampled mean (CIDEr-D's document frequencies stay those of the whole set's references,
  which both captioners share).
- BLEU-4: the photo's clipped n-gram matches, its n-gram counts, its length and its closest reference length
  (BLEU is a corpus statistic, not a mean over photos): a resample sums them and takes BLEU of the sums.
- METEOR: the per-photo (segment) scores' mean. METEOR 1.5's corpus figure pools its matches over the corpus, so this
  mean is close to it but not equal; it is labelled as the segment mean.
- Box figures (``captioner evaluate --entities --results-file`` writes them per photo): pointing, the centre
  cell's pointing and the attention inside, each a sum over the photo's boxed words; a resample's figure is the
  ratio of its sums (the words of every photo count once, as in the whole-set figure).

Every resample draws photos with one seeded generator, and both captioners are scored on the same draw.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

BLEU_N = 4
# pycocoevalcap's BLEU adds these to a precision's numerator and denominator (bleu_scorer.py): kept so that the whole
# set's figure here equals its corpus BLEU to float precision
_TINY, _SMALL = 1e-15, 1e-9
BOX_FIGURES = ("pointing", "centre", "inside")


def bleu_statistics(hypothesis: Sequence[str], references: Sequence[Sequence[str]], n: int = BLEU_N) -> np.ndarray:
    """One photo's BLEU counts (2n + 2,): clipped matches of 1..n-grams, the hypothesis' 1..n-gram counts, its length
    and the reference length closest to it (the shorter on a tie), as coco-caption's corpus BLEU sums them."""
    out = np.zeros(2 * n + 2)
    for k in range(1, n + 1):
        grams = Counter(tuple(hypothesis[i:i + k]) for i in range(len(hypothesis) - k + 1))
        most: Counter = Counter()
        for ref in references:
            for gram, count in Counter(tuple(ref[i:i + k]) for i in range(len(ref) - k + 1)).items():
                most[gram] = max(most[gram], count)
        out[k - 1] = sum(min(count, most[gram]) for gram, count in grams.items())
        out[n + k - 1] = max(len(hypothesis) - k + 1, 0)
    out[2 * n] = len(hypothesis)
    out[2 * n + 1] = min((abs(len(r) - len(hypothesis)), len(r)) for r in references)[1]
    return out


def corpus_bleu(stats: np.ndarray, n: int = BLEU_N) -> np.ndarray:
    """BLEU-n (0-1) of summed statistics: stats (..., 2n + 2) -> (...)."""
    correct, guess = stats[..., :n], stats[..., n:2 * n]
    log_precision = np.log((correct + _TINY) / (guess + _SMALL)).mean(-1)
    test_len, ref_len = stats[..., 2 * n], stats[..., 2 * n + 1]
    ratio = (test_len + _TINY) / (ref_len + _SMALL)
    brevity = np.where(ratio < 1, 1 - 1 / np.maximum(ratio, _TINY), 0.0)  # log of exp(1 - r / c) where c < r
    return np.exp(log_precision + brevity)


@dataclass
class PhotoFigures:
    """One captioner's per-photo figures on a list of photos (the order shared with its rival): ``means`` metric ->
    (P,) scores whose mean is the figure; ``bleu`` (P, 2n + 2); ``boxes`` (P, 4): boxed words, pointing hits, centre
    hits, inside sum (None when the results file carries no box figures)."""

    means: dict[str, np.ndarray]
    bleu: np.ndarray
    boxes: np.ndarray | None

    def figures(self, weights: np.ndarray) -> dict[str, np.ndarray]:
        """Every metric (0-100) under resampling weights (R, P) (how often each photo was drawn): (R,) each."""
        out = {"BLEU-4": 100 * corpus_bleu(weights @ self.bleu)}
        total = weights.sum(1)
        for name, values in self.means.items():
            out[name] = 100 * (weights @ values) / total
        if self.boxes is not None:
            sums = weights @ self.boxes  # (R, 4)
            words = np.maximum(sums[:, 0], 1e-12)
            out["pointing"] = 100 * sums[:, 1] / words
            out["pointing - centre"] = 100 * (sums[:, 1] - sums[:, 2]) / words
            out["α inside"] = sums[:, 3] / words
        return out


def photo_figures(predictions: dict[str, str], references: dict[str, list[str]], ids: Sequence[str],
                  tokenizer: str, boxes: dict[str, dict] | None, meteor: bool = True) -> PhotoFigures:
    """The per-photo figures of one captioner's ``predictions`` on the photos ``ids`` (their ``references``),
    tokenized as the scores are (metrics.tokenize_captions); ``boxes``: photo id -> {"words", "pointing", "centre",
    "inside"} sums, or None."""
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    from captioner.evaluation.metrics import meteor_segments, tokenize_captions

    both = tokenize_captions({**{("res", i): [predictions[i]] for i in ids},
                              **{("gts", i): list(references[i]) for i in ids}}, tokenizer)
    res = {i: both[("res", i)] for i in ids}
    gts = {i: both[("gts", i)] for i in ids}
    order = list(ids)  # the scorers return per-photo scores in their dict's key order: passed in ours
    means = {"CIDEr-D": np.asarray(Cider().compute_score(gts, res)[1], dtype=np.float64),
             "ROUGE-L": np.asarray(Rouge().compute_score(gts, res)[1], dtype=np.float64)}
    if meteor:
        segments = meteor_segments(gts, res)
        if segments is not None:
            means["METEOR (segment mean)"] = np.asarray(segments, dtype=np.float64)
    bleu = np.stack([bleu_statistics(res[i][0].split(), [r.split() for r in gts[i]]) for i in order])
    box_rows = None
    if boxes is not None:
        empty = {"words": 0, "pointing": 0, "centre": 0, "inside": 0.0}
        box_rows = np.asarray([[b["words"], b["pointing"], b["centre"], b["inside"]]
                               for b in (boxes.get(i, empty) for i in order)], dtype=np.float64)
    return PhotoFigures(means, bleu, box_rows)


def resample_weights(n_photos: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n_photos): how often each photo is drawn in each resample of n_photos draws with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_photos, np.full(n_photos, 1.0 / n_photos), size=resamples).astype(np.float64)


def paired_intervals(a: PhotoFigures, b: PhotoFigures, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> dict[str, dict[str, float]]:
    """metric -> {"A", "B", "difference" (B - A on the whole set), "low", "high" (the paired bootstrap's percentile
    interval of B - A at ``level``)}, for the metrics both have."""
    n = len(a.bleu)
    whole = np.ones((1, n))
    fa, fb = a.figures(whole), b.figures(whole)
    weights = resample_weights(n, resamples, seed)
    ra, rb = a.figures(weights), b.figures(weights)
    tail = 100 * (1 - level) / 2
    out = {}
    for name in fa:
        if name not in fb:
            continue
        diff = rb[name] - ra[name]
        low, high = np.percentile(diff, [tail, 100 - tail])
        out[name] = {"A": float(fa[name][0]), "B": float(fb[name][0]),
                     "difference": float(fb[name][0] - fa[name][0]), "low": float(low), "high": float(high)}
    return out


def compare_files(a_path: str | Path, b_path: str | Path, references_path: str | Path, split: str | None = None,
                  tokenizer: str = "auto", meteor: bool = True, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The paired comparison of two COCO results files (``captioner evaluate --results-file``) on the same photos."""
    from captioner.evaluation.metrics import resolve_tokenizer
    from captioner.evaluation.results import (
        ResultsError,
        match_references,
        read_photo_boxes,
        read_references,
        read_results,
    )

    if resamples < 1000:
        raise ValueError(f"--resamples {resamples}: at least 1000 resamples make a 95 % interval")
    results = {p: read_results(p) for p in (a_path, b_path)}
    ra, rb = results[a_path], results[b_path]
    if set(ra) != set(rb):
        only_a, only_b = sorted(set(ra) - set(rb))[:3], sorted(set(rb) - set(ra))[:3]
        raise ResultsError(f"{a_path} and {b_path} caption different photos ({len(ra)} and {len(rb)}; only in the "
                           f"first: {only_a}, only in the second: {only_b}, first 3 shown): a paired comparison "
                           f"needs the same photos")
    references = match_references(ra, read_references(references_path, split), whole_split=split is not None,
                                  source=Path(references_path))
    tokenizer = resolve_tokenizer(tokenizer)
    ids = sorted(ra)
    boxes = {p: read_photo_boxes(p) for p in (a_path, b_path)}
    if (boxes[a_path] is None) != (boxes[b_path] is None):
        with_boxes = a_path if boxes[a_path] is not None else b_path
        print(f"captioner score: only {with_boxes} carries box figures; they are left out of the comparison",
              file=sys.stderr)
        boxes = {a_path: None, b_path: None}
    fa = photo_figures(ra, references, ids, tokenizer, boxes[a_path], meteor)
    fb = photo_figures(rb, references, ids, tokenizer, boxes[b_path], meteor)
    return {"A": str(a_path), "B": str(b_path), "references": str(references_path), "split": split,
            "tokenizer": tokenizer, "n_images": len(ids), "resamples": resamples, "seed": seed,
            "metrics": paired_intervals(fa, fb, resamples, seed)}


def format_comparison(result: dict[str, Any]) -> str:
    """The comparison as a table: each metric's A, B, B - A and its paired 95 % interval."""
    head = (f"A={result['A']}  B={result['B']}  images={result['n_images']}  tokenizer={result['tokenizer']}  "
            f"paired bootstrap: {result['resamples']} resamples, seed {result['seed']}")
    columns = f"{'':<24}{'A':>8} {'B':>8} {'B - A':>8}   95 % interval"
    rows = [head, columns, "-" * (len(columns) + 16)]
    for name, m in result["metrics"].items():
        digits = 3 if name == "α inside" else 2
        rows.append(f"{name:<24}{m['A']:8.{digits}f} {m['B']:8.{digits}f} {m['difference']:+8.{digits}f}   "
                    f"[{m['low']:+.{digits}f}, {m['high']:+.{digits}f}]")
    return "\n".join(rows)


def interval_text(m: dict[str, float], digits: int = 2) -> str:
    """'+0.03 [-2.01, +2.08]': a difference with its interval, as the docs' tables give it."""
    return f"{m['difference']:+.{digits}f} [{m['low']:+.{digits}f}, {m['high']:+.{digits}f}]"
