"""Diverse beam search's choice of each step's beams (Vijayakumar et al., AAAI 2018, "Diverse Beam Search").

The K beams of an image split into G groups of K / G (``DecodeOptions.beam_groups``). At each step the groups
choose in turn: group g ranks its candidates by score minus λ (``DecodeOptions.diversity``) times the number of
beams of the groups before it that chose the same word at this step (the paper's Hamming diversity), and keeps
its K / G best. The penalty only ranks: the scores the beams carry, and that rank the finished captions, stay the
plain log-probabilities, so the n best lists of plain and diverse beam search are ranked alike.

A finished beam's only continuation is <end> at +0 (decoding/search.py): it is not penalised (it must keep its
slot) and its <end> does not count against later groups. search.py's ``_Beams`` calls these when G > 1.
"""

from __future__ import annotations

import torch
from torch import Tensor


def diverse_top(cand: Tensor, groups: int, strength: float, frozen: Tensor) -> tuple[Tensor, Tensor]:
    """Each step's beams: ``cand`` (B, K, V) the raw score of every (beam, word) continuation, ``frozen`` (B, K)
    the finished beams. Returns the chosen continuations' raw scores (B, K) and their indices into each image's
    K * V candidates (B, K), group after group."""
    B, K, V = cand.shape
    k = K // groups
    counts = cand.new_zeros(B, V)  # how many beams of the earlier groups chose each word at this step
    scores, index = [], []
    for g in range(groups):
        part = cand[:, g * k:(g + 1) * k]  # (B, k, V)
        live = ~frozen[:, g * k:(g + 1) * k, None]  # (B, k, 1)
        ranked = torch.where(live, part - strength * counts[:, None, :], part)
        _, idx = ranked.reshape(B, k * V).topk(k, dim=1)  # (B, k)
        raw = part.reshape(B, k * V).gather(1, idx)  # (B, k)
        scores.append(raw)
        # (B, k): the chosen continuation extends a live beam with a real word (not a -inf filler)
        chosen_live = live.squeeze(2).gather(1, idx // V) & torch.isfinite(raw)
        counts.scatter_add_(1, idx % V, chosen_live.to(counts.dtype))
        index.append(idx + g * k * V)
    return torch.cat(scores, dim=1), torch.cat(index, dim=1)


def diverse_first(log_probs: Tensor, K: int, groups: int, strength: float) -> tuple[Tensor, Tensor]:
    """The first step, from one row per image (B, V): each group's K / G words in turn, ranked with the penalty
    for the earlier groups' words. Returns (raw log-probs (B, K), word ids (B, K))."""
    B, V = log_probs.shape
    k = K // groups
    if k > V:  # fewer words than a group's beams: the missing ones at -inf (ids wrapped to valid ones)
        log_probs = torch.cat([log_probs, log_probs.new_full((B, k - V), -float("inf"))], dim=1)
    counts = log_probs.new_zeros(log_probs.shape)
    scores, words = [], []
    for _ in range(groups):
        _, word = (log_probs - strength * counts).topk(k, dim=1)  # (B, k)
        scores.append(log_probs.gather(1, word))
        counts.scatter_add_(1, word, torch.ones_like(word, dtype=counts.dtype))
        words.append(word)
    return torch.cat(scores, dim=1), torch.cat(words, dim=1) % V
