"""CIDEr-D on token ids, fast enough to be a per-sample training reward (self-critical training).

The definition is pycocoevalcap's ``CiderScorer`` (the coco-caption CIDEr-D of Vedantam et al. 2015):

    g_n(s)   = tf(n-gram) · (log |I| - log max(1, df(n-gram)))   per n-gram of size n = 1..4
    sim_n    = Σ min(g_n(c), g_n(r)) · g_n(r) / (‖g_n(c)‖ ‖g_n(r)‖) · exp(-(ℓ(c) - ℓ(r))² / 2σ²)
    CIDEr-D  = 10 · mean_n mean_r sim_n(c, r),   σ = 6

with its two conventions kept: a missing norm leaves the numerator undivided (it is 0 then anyway),
and the length ℓ counts *bigrams* (pycocoevalcap's ``if n == 1: length += term_freq``, n being the
0-based size index). Document frequencies count images (an n-gram in three of an image's five
references counts once) and |I| is the number of images whose references were given.

What differs is only the representation: an n-gram of ids is one int64 key, ``Σ_k (id_k + 1)·(V+1)^(n-1-k)``
(so sizes never collide), the references' tf-idf vectors, norms and lengths are built once, and a
batch of candidates is scored with numpy sorts and searches, no Python loop over n-grams.
``tests/test_rewards.py`` checks it against pycocoevalcap to 1e-6.

For self-critical training (Rennie et al. 2017) the document frequencies come from the training
references (as ruotianluo's ``cider_df`` does), and ``<end>`` may be scored as a word: the SCST objective
(training/objectives/self_critical.py, ``reward_end``) keeps it in the references it passes and in the sampled
captions, so a caption cut off mid-phrase is not rewarded like a finished one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_GRAMS = 4
SIGMA = 6.0


def _key_base(vocab_size: int) -> int:
    base = vocab_size + 1
    if float(base) ** N_GRAMS >= 2.0 ** 63:
        raise ValueError(f"vocabulary of {vocab_size} ids is too large for int64 n-gram keys "
                         f"(at most {int(2 ** (63 / N_GRAMS)) - 2})")
    return base


def ngram_keys(ids: np.ndarray, lengths: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All n-grams (n = 1..4) of a padded batch of id rows: (row, key, n-1) arrays, one entry per occurrence.

    ids (R, T) int, lengths (R,) the real tokens per row (entries past them are ignored).
    """
    R, T = ids.shape
    shifted = ids.astype(np.int64) + 1  # (R, T): 0 never occurs in a key digit
    rows, keys, sizes = [], [], []
    for n in range(1, N_GRAMS + 1):
        if T < n:
            break
        key = np.zeros((R, T - n + 1), dtype=np.int64)
        for k in range(n):
            key = key * base + shifted[:, k:T - n + 1 + k]  # (R, T-n+1)
        valid = np.arange(T - n + 1)[None, :] + n <= lengths[:, None]  # (R, T-n+1)
        r, _ = np.nonzero(valid)
        rows.append(r)
        keys.append(key[valid])
        sizes.append(np.full(r.shape, n - 1, dtype=np.int64))
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return np.concatenate(rows), np.concatenate(keys), np.concatenate(sizes)


def _count(rows: np.ndarray, keys: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Term frequencies: the distinct (row, key) pairs with their size index and count."""
    if rows.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0)
    order = np.lexsort((keys, rows))
    rows, keys, sizes = rows[order], keys[order], sizes[order]
    first = np.ones(rows.shape, dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (keys[1:] != keys[:-1])
    starts = np.flatnonzero(first)
    tf = np.diff(np.append(starts, rows.size)).astype(np.float64)
    return rows[starts], keys[starts], sizes[starts], tf


def _pad(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    ids = np.zeros((len(sequences), max(int(lengths.max(initial=0)), 1)), dtype=np.int64)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = s
    return ids, lengths


class CiderD:
    """CIDEr-D of id sequences against the references of image ``i`` (an index into ``references``).

    Args:
        references: per image, its reference captions as id sequences (no <start>; an <end> only if
            it should count as a word). Also the corpus of document frequencies.
        vocab_size: ids lie in [0, vocab_size).
        sigma: the length penalty's width (6 in CIDEr-D).
    """

    def __init__(self, references: Sequence[Sequence[Sequence[int]]], vocab_size: int, sigma: float = SIGMA) -> None:
        if not references or any(len(refs) == 0 for refs in references):
            raise ValueError("CiderD needs at least one image, each with at least one reference caption")
        self.base = _key_base(vocab_size)
        self.sigma = sigma
        self.n_images = len(references)
        self.ref_len = float(np.log(float(self.n_images)))  # log |I|
        flat = [list(r) for refs in references for r in refs]
        counts = np.array([len(refs) for refs in references], dtype=np.int64)
        self.ref_start = np.concatenate([[0], np.cumsum(counts)[:-1]])  # (I,) first reference of each image
        self.ref_count = counts  # (I,)
        ref_image = np.repeat(np.arange(self.n_images), counts)  # (Rr,)

        ids, lengths = _pad(flat)
        r_rows, r_keys, r_sizes, r_tf = _count(*ngram_keys(ids, lengths, self.base))
        # Document frequency: the number of images whose references hold the n-gram.
        img_keys = np.unique(np.stack([ref_image[r_rows], r_keys], axis=1), axis=0)  # distinct (image, key)
        self.keys, df = np.unique(img_keys[:, 1], return_counts=True)  # sorted n-gram keys, their df
        self.log_df = np.log(np.maximum(1.0, df.astype(np.float64)))
        dense = np.searchsorted(self.keys, r_keys)  # every reference n-gram is in self.keys
        weight = r_tf * (self.ref_len - self.log_df[dense])
        n_refs = len(flat)
        self.ref_norm = np.sqrt(np.bincount(r_rows * N_GRAMS + r_sizes, weights=weight ** 2,
                                            minlength=n_refs * N_GRAMS)).reshape(n_refs, N_GRAMS)
        self.ref_length = np.bincount(r_rows, weights=r_tf * (r_sizes == 1), minlength=n_refs)  # bigrams
        composite = r_rows * len(self.keys) + dense  # sorted by (reference, key) since _count sorted them
        order = np.argsort(composite, kind="stable")
        self.ref_composite, self.ref_weight = composite[order], weight[order]

    def __call__(self, candidates: Sequence[Sequence[int]] | np.ndarray, images: Sequence[int] | np.ndarray,
                 lengths: np.ndarray | None = None) -> np.ndarray:
        """CIDEr-D of each candidate (R,) against its image's references.

        candidates: a list of id sequences, or a padded (R, T) array with ``lengths`` (R,).
        images: (R,) image index of each candidate (several candidates may share one image).
        """
        if lengths is None:
            ids, lengths = _pad(candidates)
        else:
            ids, lengths = np.asarray(candidates), np.asarray(lengths, dtype=np.int64)
        images = np.asarray(images, dtype=np.int64)
        R = ids.shape[0]
        if images.shape != (R,):
            raise ValueError(f"images must have one entry per candidate ({R}), got shape {images.shape}")
        if R and (images.min() < 0 or images.max() >= self.n_images):
            raise ValueError(f"image index out of range 0..{self.n_images - 1}")
        rows, keys, sizes, tf = _count(*ngram_keys(ids, lengths, self.base))
        pos = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        known = self.keys[pos] == keys if len(self.keys) else np.zeros(keys.shape, dtype=bool)
        weight = tf * (self.ref_len - np.where(known, self.log_df[pos], 0.0))  # (E,) candidate tf-idf
        norm = np.sqrt(np.bincount(rows * N_GRAMS + sizes, weights=weight ** 2,
                                   minlength=R * N_GRAMS)).reshape(R, N_GRAMS)
        length = np.bincount(rows, weights=tf * (sizes == 1), minlength=R)

        # Candidate x reference pairs: pair p compares candidate pair_row[p] with reference pair_ref[p].
        per_row = self.ref_count[images]  # (R,)
        pair_offset = np.concatenate([[0], np.cumsum(per_row)[:-1]])  # (R,)
        n_pairs = int(per_row.sum())
        pair_row = np.repeat(np.arange(R), per_row)
        pair_ref = self.ref_start[images][pair_row] + (np.arange(n_pairs) - pair_offset[pair_row])

        # Each known candidate n-gram, once per reference of its image, looked up in that reference.
        k_rows, k_pos, k_sizes, k_weight = rows[known], pos[known], sizes[known], weight[known]
        reps = per_row[k_rows]
        e_row = np.repeat(k_rows, reps)
        e_j = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)  # 0..count-1 per entry
        e_pair = pair_offset[e_row] + e_j
        e_comp = pair_ref[e_pair] * len(self.keys) + np.repeat(k_pos, reps)
        at = np.minimum(np.searchsorted(self.ref_composite, e_comp), max(len(self.ref_composite) - 1, 0))
        ref_w = np.where(self.ref_composite[at] == e_comp, self.ref_weight[at], 0.0)
        hyp_w = np.repeat(k_weight, reps)
        val = np.bincount(e_pair * N_GRAMS + np.repeat(k_sizes, reps), weights=np.minimum(hyp_w, ref_w) * ref_w,
                          minlength=n_pairs * N_GRAMS).reshape(n_pairs, N_GRAMS)
        denom = norm[pair_row] * self.ref_norm[pair_ref]  # (P, 4)
        val = np.where(denom != 0, val / np.where(denom != 0, denom, 1.0), val)
        delta = length[pair_row] - self.ref_length[pair_ref]  # (P,)
        val = val * np.exp(-(delta ** 2) / (2 * self.sigma ** 2))[:, None]
        per_pair = val.mean(axis=1)  # (P,)
        return 10.0 * np.bincount(pair_row, weights=per_pair, minlength=R) / np.maximum(per_row, 1)
