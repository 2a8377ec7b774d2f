"""The searches' read of raw logits (``Logits``): each row's k best words and their log-probabilities without
forming the (N, V) log-softmax, with the fused C kernel where it applies (captioner/fast/kernels) and the PyTorch
code it is tested against; ``_row_topk``, an exact top-k for wide rows. A decoder step hands a ``Logits`` to the
search instead of dense log-probabilities (contract.CaptionDecoder.step_with_location, ``dense=False``).
What a search bans: ``BannedIds``, the ids banned in every row, whose index tensor is built once per device, not at
every step (on an accelerator ``torch.tensor(ids, device=...)`` is a host-to-device copy that waits for the device);
``_RowBans``, words banned in some rows only (the trigram rule, decoding/search.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from captioner import fast
from captioner.fast import kernels


class BannedIds:
    """Word ids banned in every row (a sequence of ints), with their index tensor made once per device: a search
    bans the same ids at every step."""

    def __init__(self, ids: Sequence[int] = ()) -> None:
        self.ids = tuple(int(i) for i in ids)
        self._index: dict[torch.device, Tensor] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self):
        return iter(self.ids)

    def index(self, device: torch.device) -> Tensor:
        """The ids as a long tensor (b,) on ``device``, built at the first request for that device."""
        index = self._index.get(device)
        if index is None:
            index = self._index[device] = torch.tensor(self.ids, dtype=torch.long, device=device)
        return index


def ban_index(banned: "Sequence[int] | BannedIds", device: torch.device) -> Tensor:
    """``banned`` as a long tensor on ``device``: BannedIds' own, made once; any other sequence, made now."""
    if isinstance(banned, BannedIds):
        return banned.index(device)
    return torch.tensor(list(banned), dtype=torch.long, device=device)


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

    # Whether best() may read the logits with the fused C kernel (captioner/fast/kernels, float32 on the CPU); the
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

    def best(self, k: int, banned: "Sequence[int] | BannedIds" = (), row_bans: Any = None) -> tuple[Tensor, Tensor]:
        """(log-probs (N, k), word ids (N, k)) of each row's k most probable words other than ``banned``
        (and, in each row, other than its ``row_bans``). Banned words still count in the normaliser, as
        when dense log-probs are masked after the log-softmax. Overwrites the logits (call once)."""
        if row_bans is not None:
            return self._best_without(k, banned, row_bans)
        self.logits = self.logits.float()  # (N, V); no copy for float32
        if self.fused and fast.enabled():  # the C kernel's one read per row, the bias added on the fly; or None
            read = kernels.row_best_log_probs(self.logits, k, list(banned), self.bias)
            if read is not None:
                self.logits = None
                return read
        x = self._with_bias()  # (N, V)
        if banned:
            ids = ban_index(banned, x.device)
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

    def _best_without(self, k: int, banned: "Sequence[int] | BannedIds", row_bans: Any) -> tuple[Tensor, Tensor]:
        """best() with per-row bans: a row's k best allowed words lie among its k + (its bans) best words, so
        those are read (the fused read still serves) and the row's banned ones dropped."""
        V = self.logits.size(1)
        wide = k + row_bans.most
        if wide > V:  # fewer words than that: rank them all
            values, words = row_bans.fill(_ban(self.dense(), banned), in_place=True).topk(k, dim=1)
            self.logits = None
            return values, words
        values, words = self.best(wide, banned)  # (N, wide) each, best first
        values = values.masked_fill(row_bans.hits(words), -math.inf)
        values, pos = values.sort(dim=1, descending=True, stable=True)  # stable: ties keep best()'s order
        return values[:, :k].contiguous(), words.gather(1, pos[:, :k])  # the callers view them as (B, K*K)


def _ban(log_probs: Tensor, banned: "Sequence[int] | BannedIds") -> Tensor:
    """log_probs (N, V) with the `banned` ids at -inf; out of place: the caller's tensor is never modified."""
    if not banned:
        return log_probs
    return log_probs.index_fill(1, ban_index(banned, log_probs.device), -math.inf)


class _RowBans:
    """Words banned in some rows only, for one step: (row, id) pairs, sorted and distinct.

    Made by ``repeats`` (the trigram rule); ``fill`` bans them in dense log-probs, ``hits`` finds them
    among a row's candidate words (Logits.best reads a few more words per row and drops these).
    """

    def __init__(self, rows: Tensor, ids: Tensor, n_rows: int) -> None:
        self.rows, self.ids = rows, ids  # (n,) each
        counts = torch.bincount(rows, minlength=n_rows)  # (N,)
        self.most = int(counts.max())  # the most words banned in one row
        # (N, most): row r's banned ids, then -1 (no word id)
        self.table = torch.full((n_rows, self.most), -1, dtype=torch.long, device=rows.device)
        first = torch.cumsum(counts, 0) - counts  # (N,): each row's first pair
        self.table[rows, torch.arange(rows.numel(), device=rows.device) - first[rows]] = ids

    @classmethod
    def repeats(cls, words: Tensor, live: Tensor, end_id: int) -> "_RowBans | None":
        """The trigram rule's bans for the next word of each live row, or None when there are none.
        words: (N, t) each row's words so far; live: (N,) bool, the rows still writing."""
        N, t = words.shape
        if t < 3:  # a trigram needs an earlier one and two words after its first
            return None
        # (N, t-2): position j holds an earlier (a, b) equal to the row's last two words, followed by words[j+2]
        earlier = (words[:, :-2] == words[:, -2:-1]) & (words[:, 1:-1] == words[:, -1:]) & live[:, None]
        earlier &= words[:, 2:] != end_id  # the way out is never banned
        rows, pos = earlier.nonzero(as_tuple=True)  # (n,) each
        if not rows.numel():
            return None
        pairs = torch.unique(torch.stack([rows, words[:, 2:][rows, pos]]), dim=1)  # (2, n'): sorted by row, then id
        return cls(pairs[0], pairs[1], N)

    def fill(self, log_probs: Tensor, in_place: bool = False) -> Tensor:
        """log_probs (N, V) with each row's banned ids at -inf (out of place unless ``in_place``)."""
        minus_inf = log_probs.new_full((), -math.inf)  # made on the device: no copy from the host
        index = (self.rows.to(log_probs.device), self.ids.to(log_probs.device))
        return log_probs.index_put_(index, minus_inf) if in_place else log_probs.index_put(index, minus_inf)

    def hits(self, words: Tensor) -> Tensor:
        """(N, k) bool: whether words[r, j] is banned in row r."""
        table = self.table.to(words.device)
        return (words[:, :, None] == table[:, None, :]).any(dim=2)  # (N, k, most) -> (N, k)
