"""Attention scoring functions s(a_i, h): the f_att of Xu et al. 2015, Eq. (4).

Each scorer splits its work in two so the decoder projects the annotation grid once per
image instead of once per word:
    prepared = scorer.prepare(keys)        keys (B, L, D) -> tensor (B, L, *), run once
    scores   = scorer(query, prepared)     query (B, Q)   -> scores (B, L), run every step
`prepared` is always one tensor whose dim 0 is B, so beam search can reorder it.
A scorer whose query goes through a bias-free linear map first exposes that map's weight as
`query_weight` and the rest as `score(projected, prepared)`: the decoder then applies the weight to
h_{t-1} in the same matmul as its LSTM and gate weights (one matmul per step instead of three).
The query may also hold G >= 1 consecutive rows per prepared row, query (B*G, Q): row n is
scored against prepared row n // G (beam search's K beams of one image share its keys, which
are then neither copied K times nor read K times per step).

additive    v^T tanh(W a + U h)          (Bahdanau et al. 2015; the paper's f_att)
dot         a^T P h                      (P = identity when D == Q, else a learned projection)
scaled_dot  a^T P h / sqrt(D)            (Vaswani et al. 2017)
bilinear    a^T W h                      (Luong et al. 2015; W^T a precomputed in prepare)
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from captioner import fast
from captioner.fast import kernels


class AdditiveScorer(nn.Module):
    """v^T tanh(W a_i + U h): the multilayer-perceptron f_att of Xu et al. 2015, Eq. (4).

    Args:
        key_dim: size D of an annotation vector a_i.
        query_dim: size Q of the query (the decoder state h_{t-1}).
        attention_dim: size A of the hidden layer of the scoring MLP.
    """

    def __init__(self, key_dim: int, query_dim: int, attention_dim: int = 512) -> None:
        super().__init__()
        self.key_proj = nn.Linear(key_dim, attention_dim)
        # No bias on U or v: a bias there shifts every location equally and the softmax
        # cancels it, so it could never learn.
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, L, A)

    # The PyTorch path without autograd builds (B, G, L, A) a few images at a time: each chunk's sum, tanh
    # and v stay in cache instead of streaming a fresh buffer of up to 64 MB (beam 5 at 14x14) per word.
    chunk_bytes = 2 ** 21

    @property
    def query_weight(self) -> Tensor:
        """U (A, Q): the decoder may apply it to h_{t-1} in one matmul with its own weights (score())."""
        return self.query_proj.weight

    def forward(self, query: Tensor, prepared: Tensor) -> Tensor:
        return self.score(self.query_proj(query), prepared)

    # Whether score() may run the fused C kernel (captioner/fast/kernels: float32 on the CPU, outside autocast):
    # one pass over the keys, no (B, G, L, A) hidden layer written or kept for the backward. False: the
    # PyTorch ops below only (the reference that tests/test_kernels.py compares with). The reference switch
    # (captioner/fast) turns the kernel and the chunking off as well.
    fused = True

    def score(self, q: Tensor, prepared: Tensor) -> Tensor:
        """Scores from the projected query q = U h (B*G, A)."""
        use_fast = fast.enabled()
        if use_fast and self.fused and kernels.additive_applies(q, prepared, self.v.weight):
            return kernels.additive_scores(q, prepared, self.v.weight)  # (B*G, L), one pass, nothing stored
        B, L, A = prepared.shape
        q = q.reshape(B, -1, 1, A)  # (B, G, 1, A)
        if not use_fast or (torch.is_grad_enabled() and (q.requires_grad or prepared.requires_grad)):
            # tanh in place on the fresh sum: one (B, G, L, A) buffer instead of two (autograd
            # allows it: the sum's backward does not need its output).
            hidden = torch.tanh_(prepared.unsqueeze(1) + q)  # (B, G, L, A)
            return self.v(hidden).view(-1, L)  # (B*G, L)
        step = max(1, self.chunk_bytes // (q.shape[1] * L * A * prepared.element_size()))  # images per chunk
        scores = [self.v(torch.tanh_(p.unsqueeze(1) + qc)).view(-1, L)  # (b*G, L)
                  for p, qc in zip(prepared.split(step), q.split(step))]
        return torch.cat(scores) if len(scores) > 1 else scores[0]  # (B*G, L)


class DotScorer(nn.Module):
    """a_i^T P h, with P a learned projection Q -> D only when the sizes differ.

    Args:
        key_dim: size D of a key.
        query_dim: size Q of the query.
        attention_dim: unused (kept so every scorer takes the same arguments).
    """

    scale_by_dim = False

    def __init__(self, key_dim: int, query_dim: int, attention_dim: int = 512) -> None:
        super().__init__()
        self.query_proj = (nn.Identity() if key_dim == query_dim
                           else nn.Linear(query_dim, key_dim, bias=False))
        self.scale = 1.0 / math.sqrt(key_dim) if self.scale_by_dim else 1.0

    def prepare(self, keys: Tensor) -> Tensor:
        return keys  # (B, L, D): nothing to precompute

    @property
    def query_weight(self) -> Tensor | None:
        """P (D, Q) when there is one (see AdditiveScorer.query_weight)."""
        return None if isinstance(self.query_proj, nn.Identity) else self.query_proj.weight

    def forward(self, query: Tensor, prepared: Tensor) -> Tensor:
        return self.score(self.query_proj(query), prepared)

    def score(self, q: Tensor, prepared: Tensor) -> Tensor:
        """Scores from the projected query q = P h (B*G, D)."""
        B, L, D = prepared.shape
        q = (q * self.scale).reshape(B, -1, D)  # (B, G, D)
        scores = torch.bmm(prepared, q.transpose(1, 2))  # (B, L, D) @ (B, D, G) -> (B, L, G)
        return scores.transpose(1, 2).reshape(-1, L)  # (B*G, L)


class ScaledDotScorer(DotScorer):
    """a_i^T P h / sqrt(D): the dot product kept at unit variance for large D."""

    scale_by_dim = True


class BilinearScorer(nn.Module):
    """a_i^T W h, with W^T a_i computed once per image in prepare.

    Args:
        key_dim: size D of a key.
        query_dim: size Q of the query.
        attention_dim: unused (kept so every scorer takes the same arguments).
    """

    def __init__(self, key_dim: int, query_dim: int, attention_dim: int = 512) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(key_dim, query_dim))
        # Unit-variance scores at initialisation for unit-variance keys and queries.
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(key_dim * query_dim))

    query_weight = None  # the query enters unprojected

    def prepare(self, keys: Tensor) -> Tensor:
        return keys @ self.weight  # (B, L, D) @ (D, Q) -> (B, L, Q)

    def score(self, q: Tensor, prepared: Tensor) -> Tensor:
        return self.forward(q, prepared)

    def forward(self, query: Tensor, prepared: Tensor) -> Tensor:
        B, L, Q = prepared.shape
        scores = torch.bmm(prepared, query.view(B, -1, Q).transpose(1, 2))  # (B, L, Q) @ (B, Q, G) -> (B, L, G)
        return scores.transpose(1, 2).reshape(-1, L)  # (B*G, L)


def build_scorer(name: str, key_dim: int, query_dim: int, attention_dim: int = 512) -> nn.Module:
    """The scorer called ``name`` (names.SCORERS; ValueError naming the valid ones)."""
    from captioner.names import SCORERS

    return SCORERS.get(name)(key_dim=key_dim, query_dim=query_dim, attention_dim=attention_dim)
