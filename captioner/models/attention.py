"""Attention over the annotation grid: Xu et al. 2015, §4.1 (hard) and §4.2 (soft), Eq. (4)-(6).

    e_t,i = f_att(a_i, h_{t-1})          scores   (a scorer from scorers.py)
    alpha_t = softmax(e_t)                Eq. (5)
    soft (§4.2):  z_t = sum_i alpha_t,i a_i                              (the expectation)
    hard (§4.1):  s_t ~ Multinoulli_L(alpha_t),  z_t = a_{s_t}           Eq. (8)-(9),
                  trained with REINFORCE through log p(s_t) = log alpha_t,s_t  Eq. (12)

Every module reads its context in one of four explicit modes (the first three are names.DECODING_MODES, the
vocabulary every decode speaks; decoding/options.py):
    "expectation"           the expectation sum_i alpha_i v_i: soft attention's read, and hard attention's §4.1 trick
    "sample"                one location drawn from alpha; log_prob = log alpha_s carries the
                            gradient to the scorer (the context itself does not)
    "argmax"                the most probable location (deterministic hard decoding)
    "gumbel"                training only (train.objective.kind: gumbel): one location drawn from alpha by
                            the Gumbel-max trick, read straight through a Gumbel-softmax relaxation, so the
                            context itself carries the gradient to the scorer (``read_context``; Jang et al.
                            2017, arXiv:1611.01144; Maddison et al. 2017, arXiv:1611.00712)
Modules: SoftAttention and HardAttention read the raw grid (they compute the same thing; the
decoder honours the mode only for "hard"), KeyValueAttention (separate key and value projections),
MultiHeadAttention (M heads over subspaces, concatenated and projected; also the Transformer decoder's
self- and cross-attention, models/decoders/transformer.py), and SelfAttentionEncoder (optional
transformer-style refinement of the grid before decoding).

prepare(grid) runs once per image and returns `memory`, a tuple of tensors whose dim 0 is B, so
search can reorder it with index_select; forward(query, memory, mode) runs once per word. Modules
with grouped_queries (all of them) also take G consecutive query rows per memory row (beam search's beams of
one image): query (B*G, Q) against memory (B, ...), without copying the memory G times.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner.models.scorers import build_scorer
from captioner.names import ATTENTIONS, DECODING_MODES, check_heads

# The one definition of the attention modes (module docstring): the decoding modes, named in captioner/names.py
# below the config that checks them (eval.attention_mode, --attention-mode), and the training-only reads.
TRAINING_MODES = ("gumbel",)  # reads that only make sense under a training objective: decoding refuses them
MODES = (*DECODING_MODES, *TRAINING_MODES)
ONE_CELL_MODES = ("sample", "argmax", "gumbel")  # the modes that read a single grid cell per word


def reads_one_cell(mode: str) -> bool:
    """Whether `mode` reads one grid cell per word (hard attention's "sample"/"argmax")."""
    return mode in ONE_CELL_MODES


def check_read(mode: str, stochastic: bool, one_cell: bool = False) -> str:
    """``mode`` once a decoder can read that way (else ValueError). Hard (stochastic) attention makes every
    read. Soft attention is trained on the expectation, but asked for "argmax" or "sample" it reads one cell
    per word when its module can (``one_cell``: the same read_context serves both kinds): the baseline a hard
    model warm-started from it starts from. A module that cannot (the multi-head one, whose heads would each
    pick a cell) refuses the mode rather than ignore it."""
    check_mode(mode)
    if reads_one_cell(mode) and not stochastic and not one_cell:
        raise ValueError(f"attention mode {mode!r} reads one grid cell per word, which this model's attention "
                         f"cannot do; use 'expectation' (its soft read)")
    return mode


@dataclass
class AttentionOutput:
    """One attention read.

    context: (B, out_dim). alpha: (B, L), sums to one (multi-head: mean over heads).
    log_prob: (B,) log p(s) of the chosen location(s) in the one-cell modes ("sample"/"argmax"/"gumbel"; summed
        over heads), 0 for rows under expectation_mask; None in "expectation" mode.
    entropy: (B,) entropy of alpha (summed over heads); None when called with entropy=False.
    index: (B,) chosen location in the one-cell modes ((B, M) for multi-head; -1 for rows
        under expectation_mask); None otherwise.
    head_alpha: (B, M, L) per-head distributions (multi-head only).
    """

    context: Tensor
    alpha: Tensor
    log_prob: Tensor | None
    entropy: Tensor | None
    index: Tensor | None
    head_alpha: Tensor | None = None


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown attention mode {mode!r}; valid modes: {', '.join(MODES)}")


def gumbel_noise(like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Standard Gumbel noise g = -log(-log u), u ~ U(0, 1), of ``like``'s shape (float32 at least)."""
    dtype = like.dtype if like.dtype == torch.float64 else torch.float32
    u = torch.rand(like.shape, dtype=dtype, device=like.device, generator=generator)
    return -torch.log(-torch.log(u.clamp_(min=torch.finfo(dtype).tiny)))  # u = 0 would give -inf


def draw_index(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One index per row of probs (N, C), drawn by torch.multinomial, for any row: non-finite and negative entries
    count as 0, and a row without a positive entry draws uniformly over its C entries. A row that is a distribution
    draws exactly what multinomial draws from it.

    multinomial itself refuses a row holding a NaN or an inf (a RuntimeError; on CUDA a device-side assert that
    kills the process in some versions), so under fp16 one bad row would end training before
    train.max_nonfinite_steps could skip the step. Here it draws, and its log-probability stays non-finite, so the
    loss does too: the callers read it from the log-softmax the probabilities came from, which for a row holding a
    NaN or an inf is NaN or -inf in every entry (its log-sum-exp is not finite). The clean-up reads nothing back to
    the host."""
    p = torch.nan_to_num(probs.detach(), nan=0.0, posinf=0.0, neginf=0.0).clamp_(min=0.0)  # (N, C)
    p.add_(p.amax(dim=-1, keepdim=True) <= 0)  # (N, 1): +1 on every entry of a row without mass (uniform), else +0
    return torch.multinomial(p, 1, generator=generator).squeeze(1)  # (N,)


def read_context(scores: Tensor, values: Tensor, mode: str,
                 expectation_mask: Tensor | None = None,
                 generator: torch.Generator | None = None,
                 entropy: bool = True, temperature: float = 1.0) -> AttentionOutput:
    """Read a context from `values` (N, L, Dv) under alpha = softmax(scores (N, L)) in `mode`.

    `values` may also be (N / G, L, Dv): G consecutive score rows share one values row (beam
    search's K beams of an image), read once per step by one (G, L) @ (L, Dv) matmul.

    expectation_mask (N,) bool, only used by the one-cell modes: rows where True read the
    expectation instead and get log_prob 0 (the variance-reduction trick of §4.1, where with
    probability 0.5 the expected context replaces the sampled one).
    entropy=False skips the entropy (the soft decoder's hot loop does not need it).

    "gumbel" (the only mode that reads ``temperature``, τ > 0), the straight-through Gumbel-softmax estimator
    (Jang et al. 2017; Maddison et al. 2017): with g_i standard Gumbel noise,

        s = argmax_i (log alpha_i + g_i)              a sample of alpha (the Gumbel-max trick, Jang et al. Eq. 1)
        y~ = softmax((log alpha + g) / τ)             the relaxed sample (Eq. 2; straight through: §2.2)
        y = onehot(s) - stopgrad(y~) + y~,   z = sum_i y_i v_i

    The forward pass reads exactly v_s (z is written v_s + sum_i (y~_i - stopgrad(y~_i)) stopgrad(v_i), whose
    second term is exactly zero: the same value and the same gradients as the line above, without the rounding
    of onehot - y~ + y~); the backward pass sends dL/dz · v_i to each y~_i, through the softmax to the scores.
    """
    check_mode(mode)
    hard = reads_one_cell(mode)
    if hard or entropy:
        log_alpha = F.log_softmax(scores, dim=-1)  # (N, L)
        alpha = log_alpha.exp()
    else:
        log_alpha, alpha = None, F.softmax(scores, dim=-1)  # one kernel in the soft hot loop
    ent = None
    if entropy:
        # Clamp keeps 0 * log 0 at 0 should a score be -inf.
        ent = -(alpha * log_alpha.clamp(min=torch.finfo(log_alpha.dtype).min)).sum(-1)  # (N,)
    M, L, Dv = values.shape
    if not hard:
        context = torch.bmm(alpha.view(M, -1, L), values).view(-1, Dv)  # (M, G, L) @ (M, L, Dv) -> (N, Dv)
        return AttentionOutput(context, alpha, None, ent, None)
    relaxed = None
    if mode == "sample":
        index = draw_index(alpha, generator)  # (N,); a row of NaNs draws too, its log_prob stays non-finite
    elif mode == "gumbel":
        perturbed = log_alpha + gumbel_noise(log_alpha, generator).to(log_alpha.dtype)  # (N, L): log alpha + g
        index = perturbed.detach().argmax(dim=-1)  # (N,): s ~ alpha
        relaxed = F.softmax(perturbed / temperature, dim=-1)  # (N, L): y~
    else:
        index = log_alpha.argmax(dim=-1)  # (N,)
    rows = torch.arange(alpha.shape[0], device=values.device) // (alpha.shape[0] // M)  # (N,) values row
    context = values[rows, index]  # (N, Dv)
    if relaxed is not None:  # + a zero that carries the relaxed sample's gradient (straight through)
        through = (relaxed - relaxed.detach()).view(M, -1, L)  # (M, G, L), all zeros
        context = context + torch.bmm(through, values.detach()).view(-1, Dv)  # (N, Dv)
    log_prob = log_alpha.gather(1, index.unsqueeze(1)).squeeze(1)  # (N,)
    if expectation_mask is not None:
        soft = torch.bmm(alpha.view(M, -1, L), values).view(-1, Dv)  # (N, Dv)
        context = torch.where(expectation_mask.unsqueeze(1), soft, context)
        log_prob = log_prob.masked_fill(expectation_mask, 0.0)
        index = index.masked_fill(expectation_mask, -1)
    return AttentionOutput(context, alpha, log_prob, ent, index)


class SoftAttention(nn.Module):
    """Deterministic soft attention over the raw grid, §4.2: z = sum_i alpha_i a_i.

    Args:
        scorer: name of the scoring function (a key of names.SCORERS).
        key_dim: size D of an annotation vector (also the context size).
        query_dim: size Q of the query h_{t-1}.
        attention_dim: hidden size A of the scorer.

    ``forward``'s ``temperature``: τ of the "gumbel" read (read_context), the objective's schedule for this epoch
    (training/objectives/location.py, Gumbel); no other mode reads it.
    """

    # Whether the decoder should honour stochastic modes (only "hard" is trained that way).
    stochastic = False
    # Whether forward accepts G queries per memory row (query (B*G, Q), memory (B, ...)).
    grouped_queries = True
    # Whether it can read one cell per word ("argmax"/"sample") when asked, though trained softly (check_read).
    one_cell = True

    def __init__(self, scorer: str, key_dim: int, query_dim: int, attention_dim: int = 512) -> None:
        super().__init__()
        self.scorer = build_scorer(scorer, key_dim, query_dim, attention_dim)
        self.out_dim = key_dim

    @classmethod
    def build(cls, scorer: str, key_dim: int, query_dim: int, attention_dim: int, heads: int) -> nn.Module:
        """What build_attention calls for every read: one head (``heads`` is the multi-head read's)."""
        return cls(scorer, key_dim, query_dim, attention_dim)

    def prepare(self, grid: Tensor) -> tuple[Tensor, ...]:
        return (grid, self.scorer.prepare(grid))  # values (B, L, D), prepared keys (B, L, *)

    @property
    def query_weight(self) -> Tensor | None:
        """The scorer's bias-free query projection (A, Q), or None (scorers.py)."""
        return self.scorer.query_weight

    def forward(self, query: Tensor, memory: tuple[Tensor, ...], mode: str,
                expectation_mask: Tensor | None = None,
                generator: torch.Generator | None = None, entropy: bool = True,
                projected_query: Tensor | None = None, temperature: float = 1.0) -> AttentionOutput:
        """``projected_query``: query @ query_weight^T, already computed by the caller (then ``query`` is unused)."""
        values, prepared = memory
        if projected_query is not None:
            scores = self.scorer.score(projected_query, prepared)  # (B, L)
        else:
            scores = self.scorer(query, prepared)  # (B, L)
        return read_context(scores, values, mode, expectation_mask, generator, entropy, temperature)


class HardAttention(SoftAttention):
    """Stochastic hard attention over the raw grid, §4.1: z = a_s, s ~ Multinoulli(alpha).

    Same computation as SoftAttention; the decoder honours its mode ("sample" for REINFORCE
    training, "gumbel" for straight-through Gumbel-softmax training at ``temperature``, "argmax",
    "sample" or "expectation" for decoding). Args as SoftAttention.
    """

    stochastic = True


class KeyValueAttention(SoftAttention):
    """Keys score, values are averaged: separate linear projections of the grid.

    alpha = softmax(f_att(W_k a_i, h)), z = sum_i alpha_i W_v a_i. With identity projections it
    is SoftAttention (it reads its memory the same way; only prepare differs).

    Args:
        scorer: name of the scoring function.
        key_dim: size D of an annotation vector.
        query_dim: size Q of the query.
        attention_dim: size of the projected keys (and hidden size of the scorer).
        value_dim: size of the projected values = the context size (default D).
    """

    def __init__(self, scorer: str, key_dim: int, query_dim: int, attention_dim: int = 512,
                 value_dim: int | None = None) -> None:
        super().__init__(scorer, attention_dim, query_dim, attention_dim)  # the scorer sees projected keys
        value_dim = value_dim or key_dim
        self.key_proj = nn.Linear(key_dim, attention_dim)
        self.value_proj = nn.Linear(key_dim, value_dim)
        self.out_dim = value_dim

    def prepare(self, grid: Tensor) -> tuple[Tensor, ...]:
        keys = self.key_proj(grid)  # (B, L, A)
        return (self.value_proj(grid), self.scorer.prepare(keys))  # (B, L, Dv), (B, L, *)


class MultiHeadAttention(nn.Module):
    """M heads attend in parallel to subspaces of projected keys/values; concat + output projection.

    Head m scores its key subspace (size A/M) against its own projection of the query with a
    scorer shared by all heads (folded into the batch, so all heads cost one scorer call), reads
    its value subspace, and the M reads are concatenated and projected. In "sample"/"argmax" modes
    every head picks its own location; log_prob and entropy are summed over heads.

    The "gumbel" read is not offered (one_cell is False: check_read refuses every one-cell mode here).

    Queries come G >= 1 per memory row (grouped_queries): beam search's beams of one image, or the
    Transformer decoder's T words of one caption. ``allowed`` (G, L) bool, when given, hides the
    positions a query may not see (the Transformer's masked self-attention over words).

    Args:
        scorer: name of the scoring function (applied per head, size A/M).
        key_dim: size D of an annotation vector.
        query_dim: size Q of the query.
        attention_dim: total size A of keys, values and context (divisible by heads).
        heads: number of heads M.
    """

    stochastic = False
    grouped_queries = True
    one_cell = False  # every head would pick its own cell: no single cell per word to read or show
    query_weight = None  # its query projection has a bias and feeds the heads: not stacked by the decoder

    def __init__(self, scorer: str, key_dim: int, query_dim: int, attention_dim: int = 512,
                 heads: int = 8) -> None:
        super().__init__()
        check_heads(attention_dim, heads, "attention_dim")
        self.heads = heads
        self.head_dim = attention_dim // heads
        self.key_proj = nn.Linear(key_dim, attention_dim)
        self.value_proj = nn.Linear(key_dim, attention_dim)
        self.query_proj = nn.Linear(query_dim, attention_dim)
        self.scorer = build_scorer(scorer, self.head_dim, self.head_dim, self.head_dim)
        self.out_proj = nn.Linear(attention_dim, attention_dim)
        self.out_dim = attention_dim

    @classmethod
    def build(cls, scorer: str, key_dim: int, query_dim: int, attention_dim: int, heads: int) -> nn.Module:
        return cls(scorer, key_dim, query_dim, attention_dim, heads=heads)

    def _split(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.heads, self.head_dim).transpose(1, 2)  # (B, M, L, A/M)

    def prepare(self, grid: Tensor) -> tuple[Tensor, ...]:
        B, L, _ = grid.shape
        keys = self._split(self.key_proj(grid)).reshape(B * self.heads, L, self.head_dim)  # (B*M, L, A/M)
        prepared = self.scorer.prepare(keys)  # (B*M, L, X)
        prepared = prepared.reshape(B, self.heads, L, -1)  # (B, M, L, X): dim 0 = B for search
        values = self._split(self.value_proj(grid)).contiguous()  # (B, M, L, A/M)
        return (values, prepared)

    def forward(self, query: Tensor, memory: tuple[Tensor, ...], mode: str,
                expectation_mask: Tensor | None = None,
                generator: torch.Generator | None = None, entropy: bool = True,
                allowed: Tensor | None = None, temperature: float = 1.0) -> AttentionOutput:
        values, prepared = memory
        B, M, L, _ = values.shape
        G = query.shape[0] // B  # queries per memory row
        if G * B != query.shape[0]:
            raise ValueError(f"{query.shape[0]} queries do not come in equal groups for {B} memory rows")
        # (B*G, A) -> (B, M, G, A/M) -> (B*M*G, A/M): head m of image b scores its G queries against its keys
        q = self.query_proj(query).view(B, G, M, self.head_dim).transpose(1, 2).reshape(B * M * G, self.head_dim)
        scores = self.scorer(q, prepared.flatten(0, 1))  # (B*M*G, L)
        if allowed is not None:
            scores = scores.view(B * M, G, L).masked_fill(~allowed, float("-inf")).view(-1, L)
        if expectation_mask is not None:
            expectation_mask = expectation_mask.view(B, 1, G).expand(B, M, G).reshape(-1)  # (B*M*G,)
        read = read_context(scores, values.flatten(0, 1), mode, expectation_mask, generator, entropy, temperature)

        def per_query(x: Tensor) -> Tensor:  # (B*M*G, *) -> (B*G, M, *)
            return x.view(B, M, G, *x.shape[1:]).transpose(1, 2).reshape(B * G, M, *x.shape[1:])

        context = self.out_proj(per_query(read.context).flatten(1))  # (B*G, A)
        head_alpha = per_query(read.alpha)  # (B*G, M, L)
        return AttentionOutput(
            context=context,
            alpha=head_alpha.mean(1),  # (B*G, L): what a single map can show
            log_prob=None if read.log_prob is None else per_query(read.log_prob).sum(1),
            entropy=None if read.entropy is None else per_query(read.entropy).sum(1),
            index=None if read.index is None else per_query(read.index),
            head_alpha=head_alpha,
        )


def build_attention(kind: str, scorer: str, key_dim: int, query_dim: int,
                    attention_dim: int = 512, heads: int = 1) -> nn.Module:
    """The attention read ``kind`` (names.ATTENTIONS: soft, hard, key_value, multi_head) with scoring function
    ``scorer``, built by its class's ``build``; ``heads`` is read by "multi_head" only (the config shares it with
    the grid's self-attention)."""
    return ATTENTIONS.get(kind).build(scorer, key_dim, query_dim, attention_dim, heads)


class SelfAttentionLayer(nn.Module):
    """One post-norm self-attention layer: x <- LayerNorm(x + W_o Attn(W_q x, W_k x, W_v x))."""

    def __init__(self, dim: int, heads: int = 1) -> None:
        super().__init__()
        check_heads(dim, heads, "dim")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, M, L, D/M)
        mixed = F.scaled_dot_product_attention(q, k, v)  # (B, M, L, D/M)
        mixed = mixed.transpose(1, 2).reshape(B, L, D)  # (B, L, D)
        return self.norm(x + self.out(mixed))


class SelfAttentionEncoder(nn.Module):
    """Optional refinement of the grid by N self-attention layers (0, the default, is the identity).

    Lets every annotation vector see the whole image before the decoder attends to it.

    Args:
        dim: feature size D.
        layers: number of layers N.
        heads: heads per layer.
    """

    def __init__(self, dim: int, layers: int = 0, heads: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SelfAttentionLayer(dim, heads) for _ in range(layers))

    def forward(self, grid: Tensor) -> Tensor:
        for layer in self.layers:
            grid = layer(grid)  # (B, L, D)
        return grid
