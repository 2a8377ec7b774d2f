"""The searches' read of raw logits (``Logits``): each row's k best words and their log-probabilities without
forming the (N, V) log-softmax, with the fused C kernel where it applies (captioner/kernels) and the PyTorch
code it is tested against; ``_row_topk``, an exact top-k for wide rows. A decoder step hands a ``Logits`` to the
search instead of dense log-probabilities (contract.CaptionDecoder.step_with_location, ``dense=False``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from captioner import fast_paths, kernels


def _row_topk(x: Tensor, k: int, width: int = 128) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=1) for wide rows (N, V), exact, in about half the time on the CPU: the row's k best
    values lie in the k chunks of ``width`` columns with the largest maxima (each of them is at most its
    chunk's maximum), so only those chunks (and the < width columns past the last whole chunk) are ranked."""
    N, V = x.shape
    C = V // width
    if C <= k:
        return x.topk(k, dim=1)
    chunks = x.unfold(1, width, width)  # (N, C, width): a view
    best = chunks.amax(dim=2).topk(k, dim=1).indices  # (N, k) chunks holding the row's k best
    cols = (best[:, :, None] * width + torch.arange(width, device=x.device)).view(N, k * width)  # (N, k*width)
    if C * width < V:  # the columns past the last whole chunk are always candidates
        cols = torch.cat([cols, torch.arange(C * width, V, device=x.device).expand(N, -1)], dim=1)
    values, pos = x.gather(1, cols).topk(k, dim=1)  # (N, k)
    return values, cols.gather(1, pos)


class Logits:
    """A step's log-probabilities held as raw logits (N, V), handed over to the search.

    A step function may return this instead of dense log-probs. The searches then ask for each row's
    best words only (best()): their log-probs are taken from the logits (a row's order is the same under
    log-softmax) and one log-sum-exp per row, so no (N, V) log-softmax and no (N, V) sum of beam scores is
    ever written. Beam search is still exact: of an image's K x V candidates, only the K best words of each
    beam can be among its K best. The search may overwrite the logits: best() consumes them.

    ``bias`` (V,), when given, is added to every row (the output layer's bias): the logits are then
    ``logits + bias``, which the fused read forms on the fly instead of in an (N, V) pass of its own.
    """

    # Whether best() may read the logits with the fused C kernel (captioner/kernels, float32 on the CPU); the
    # PyTorch code below is the reference it is tested against (tests/test_kernels.py).
    fused = True

    def __init__(self, logits: Tensor, bias: Tensor | None = None) -> None:
        self.logits, self.bias = logits, bias

    def _with_bias(self) -> Tensor:
        """The (N, V) float32 logits with the bias added, in place and once (self.bias is None afterwards)."""
        self.logits = self.logits.float()  # no copy for float32
        if self.bias is not None:
            self.logits.add_(self.bias)
            self.bias = None
        return self.logits

    def dense(self) -> Tensor:
        """The (N, V) float32 log-probabilities."""
        return torch.log_softmax(self._with_bias(), dim=1)

    def best(self, k: int, banned: Sequence[int] = (), row_bans: Any = None) -> tuple[Tensor, Tensor]:
        """(log-probs (N, k), word ids (N, k)) of each row's k most probable words other than ``banned``
        (and, in each row, other than its ``row_bans``). Banned words still count in the normaliser, as
        when dense log-probs are masked after the log-softmax. Overwrites the logits (call once)."""
        if row_bans is not None:
            return self._best_without(k, banned, row_bans)
        self.logits = self.logits.float()  # (N, V); no copy for float32
        if self.fused and fast_paths.enabled():  # the C kernel's one read per row, the bias added on the fly; or None
            read = kernels.row_best_log_probs(self.logits, k, list(banned), self.bias)
            if read is not None:
                self.logits = None
                return read
        x = self._with_bias()  # (N, V)
        if banned:
            ids = torch.tensor(list(banned), device=x.device)
            kept = x.index_select(1, ids)  # (N, b)
            x.index_fill_(1, ids, -math.inf)
        values, words = _row_topk(x, k)  # (N, k), best first
        top = values[:, :1]  # (N, 1): the row's maximum (no pass of its own), over every word
        if banned:
            top = torch.maximum(top, kept.amax(dim=1, keepdim=True))
        total = x.sub_(top).exp_().sum(dim=1, keepdim=True)  # (N, 1); banned columns add exp(-inf) = 0
        if banned:
            total = total + (kept - top).exp().sum(dim=1, keepdim=True)
        self.logits = None  # consumed
        return values - (top + total.log()), words

    def _best_without(self, k: int, banned: Sequence[int], row_bans: Any) -> tuple[Tensor, Tensor]:
        """best() with per-row bans: a row's k best allowed words lie among its k + (its bans) best words, so
        those are read (the fused read still serves) and the row's banned ones dropped."""
        V = self.logits.size(1)
        wide = k + row_bans.most
        if wide > V:  # fewer words than that: rank them all
            values, words = row_bans.fill(_ban(self.dense(), list(banned)), in_place=True).topk(k, dim=1)
            self.logits = None
            return values, words
        values, words = self.best(wide, banned)  # (N, wide) each, best first
        values = values.masked_fill(row_bans.hits(words), -math.inf)
        values, pos = values.sort(dim=1, descending=True, stable=True)  # stable: ties keep best()'s order
        return values[:, :k].contiguous(), words.gather(1, pos[:, :k])  # the callers view them as (B, K*K)


def _ban(log_probs: Tensor, banned: list[int]) -> Tensor:
    """log_probs (N, V) with the `banned` ids at -inf; out of place: the caller's tensor is never modified."""
    if not banned:
        return log_probs
    return log_probs.index_fill(1, torch.tensor(banned, device=log_probs.device), -math.inf)
