"""The attention LSTM decoder of Xu et al. 2015 ("Show, Attend and Tell"), §3.1.2 and §4, as plain PyTorch.

    h_0, c_0 = f_init,h(mean_i a_i), f_init,c(mean_i a_i)            §3.1.2
    alpha_t, z_t = attention(h_{t-1}, {a_i})                        Eq. (4)-(6), §4.1 (hard) / §4.2 (soft)
    beta_t = sigmoid(f_beta(h_{t-1}))                                §4.2.1 (the gating scalar)
    h_t, c_t = LSTM([E y_{t-1}; beta_t z_t], (h_{t-1}, c_{t-1}))     Eq. (1)-(3)
    p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z beta_t z_t))          Eq. (7), the deep output

The scene (``scene="mean"``, not in the paper): the context becomes z_t = [read_t; ā], the attended read beside
the whole grid's mean ā = mean_i a_i, at every step, so that a map sharpened onto one object (by supervised
attention) does not starve the LSTM and the deep output of the rest of the photo. Anderson et al. (CVPR 2018) feed
the mean-pooled features to their top-down LSTM the same way. It is carried as the second half of every cell's
value vector, [v_i; ā]: any read of a distribution over the cells (the expectation, one sampled cell, the
Gumbel read) then returns [read; ā] exactly as far as the weights sum to one, so every path (this reference, the
fast path, the compiled step, beam search's grouped memory) carries it without a state of its own. Its weights are
new columns of W_ih and L_z; ``widen_for_scene`` sets them to zero, so a model without the scene starts one with
it computing exactly what it computed.

The visual sentinel (``sentinel=True``; Lu et al., CVPR 2017, "Knowing When to Look", Eq. (9)-(12)): a learned
non-visual slot beside the L cells, so that a word that names nothing need not look at the photo.

    g_t = sigmoid(W_g [E y_{t-1}; h_{t-1}]),  s_t = g_t * tanh(c_{t-1})     the sentinel, from the LSTM's memory
    [alpha_t; beta_t] = softmax([f_att(a_i, h_{t-1}); f_att(W_k s_t, h_{t-1}) + b])       L + 1 slots
    z_t = sum_i alpha_t,i a_i + beta_t W_v s_t

Lu et al. attend after the LSTM step with h_t and its cell m_t; here attention precedes the step (as the paper's),
so the sentinel reads the memory the step starts from, c_{t-1}. The map a word shows (its ``alpha``, (L,)) is the
cells' part, which sums to 1 - beta_t: how much the word looked at the photo. Supervised attention
(train.objective.grounding_weight) reads that map, so it asks the boxed words, and only those, to look. Soft reads
only; the fast path reads it the same way (Sentinel.read takes grouped memory and a projected query).

This module is the reference: the equations one step at a time over the whole padded batch. What training
and decoding run by default is its fast path, ``FastShowAttendTellDecoder`` (show_attend_tell_fast.py): the
same parameters and state_dict, the same results to float rounding, several times faster. The reference
switch (captioner/fast) makes the fast path run this code, and tests/test_fast_paths.py holds the
two together.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from captioner.models.attention import AttentionOutput, build_attention
from captioner.models.decoders.contract import (
    DecoderOutput,
    GridAttentionDecoder,
    State,
    caption_mask,
    shared_dropout,
)
from captioner.models.decoders.show_attend_tell_config import GATES, SCENE_READS, SCENES


class ShowAttendTellDecoder(GridAttentionDecoder):
    """LSTM caption decoder with soft or hard attention over an annotation grid (B, L, D).

    Args:
        vocab_size: V.
        feature_dim: D, size of an annotation vector.
        embed_dim: size of the word embedding E (also the deep-output size, Eq. (7)).
        hidden_dim: LSTM size.
        attention_dim: hidden size of the scorer / size of projected keys.
        scorer: scoring function name (scorers.SCORERS).
        attention: "soft", "hard", "key_value" or "multi_head" (attention.ATTENTIONS).
        heads: heads for "multi_head".
        gate: "scalar" (the paper's beta_t), "vector" (one gate per context channel) or "none".
        dropout: dropout on the deep output before L_o.
        feature_dropout: dropout on the annotation vectors during teacher-forced training (not in the
            paper; a frozen encoder's 6,000 Flickr8k grids are otherwise memorised within a few epochs).
        pad_id: id of <pad> (its embedding stays zero).
        scene: "none" (the paper) or "mean": the grid's mean beside the attended context at every step (the
            module docstring).
        sentinel: the visual sentinel, a non-visual slot beside the cells (the module docstring; soft reads only).
    """

    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512,
                 hidden_dim: int = 512, attention_dim: int = 512, scorer: str = "additive",
                 attention: str = "soft", heads: int = 1, gate: str = "scalar",
                 dropout: float = 0.5, pad_id: int = 0, feature_dropout: float = 0.0, scene: str = "none",
                 sentinel: bool = False) -> None:
        super().__init__()
        if gate not in GATES:
            raise ValueError(f"model.decoder.gate: {gate!r} is not one of {', '.join(GATES)}")
        if scene not in SCENES:
            raise ValueError(f"model.decoder.scene: {scene!r} is not one of {', '.join(SCENES)}")
        if scene != "none" and attention not in SCENE_READS:
            raise ValueError(f"model.decoder.scene: {scene!r} sits beside a read of one value vector per cell "
                             f"({', '.join(SCENE_READS)}), not {attention!r}")
        self.scene = scene
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.attention_kind = attention
        self.attention = build_attention(attention, scorer, key_dim=feature_dim,
                                         query_dim=hidden_dim, attention_dim=attention_dim,
                                         heads=heads)
        context_dim = self.attention.out_dim + (feature_dim if scene != "none" else 0)  # [read; ā] with the scene
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        # f_init,h and f_init,c: one tanh layer each, as in the authors' code.
        self.init_h = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.Tanh())
        self.init_c = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.Tanh())
        self.gate = None if gate == "none" else nn.Linear(hidden_dim, 1 if gate == "scalar" else context_dim)
        self.lstm = nn.LSTMCell(embed_dim + context_dim, hidden_dim)
        self.out_h = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_z = nn.Linear(context_dim, embed_dim, bias=False)  # L_z (L_h carries the bias)
        self.dropout = nn.Dropout(dropout)
        self.feature_dropout = nn.Dropout(feature_dropout)
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        if sentinel and (attention != "soft" or scene != "none"):
            raise ValueError("model.decoder.sentinel: a slot of the soft read's distribution, without the scene")
        self.sentinel = Sentinel(embed_dim, hidden_dim, feature_dim) if sentinel else None

    def init_state(self, grid: Tensor) -> State:
        """(h_0, c_0, *attention memory) for grid (B, L, D): §3.1.2, and the keys projected once per image."""
        mean = grid.mean(dim=1)  # (B, D)
        memory = self.attention.prepare(grid)
        if self.scene != "none":  # each cell's value becomes [v_i; ā] (B, L, Dv + D): every read returns [read; ā]
            values, *rest = memory
            memory = (torch.cat([values, mean.unsqueeze(1).expand(-1, values.shape[1], -1)], dim=2), *rest)
        return (self.init_h(mean), self.init_c(mean), *memory)

    @property
    def one_cell(self) -> bool:
        """With the sentinel no cell-only read exists (the sentinel is no cell): soft reads only."""
        return self.sentinel is None and super().one_cell

    def recur(self, emb: Tensor, state: State, mode: str, expectation_mask: Tensor | None = None,
              temperature: float = 1.0) -> tuple[State, Tensor, AttentionOutput]:
        """One step of Eq. (1)-(6) for word embeddings emb (N, E) = E y_{t-1}. Returns (new state, beta_t z_t, read).
        ``temperature``: τ of the "gumbel" read (no other mode reads it)."""
        h, c, *memory = state
        if self.sentinel is not None:
            read = self.sentinel.read(self.attention.scorer, emb, h, c, memory)
        else:
            read = self.attention(h, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic,
                                  temperature=temperature)
        z = read.context  # (N, Z): z_t, Eq. (6) (soft) or (8) (hard)
        if self.gate is not None:
            z = torch.sigmoid(self.gate(h)) * z  # beta_t z_t, §4.2.1
        h, c = self.lstm(torch.cat([emb, z], dim=1), (h, c))  # Eq. (1)-(3); gates i, f, g, o
        return (h, c, *memory), z, read

    def deep_features(self, emb: Tensor, h: Tensor, z: Tensor, dropout_rows: Tensor | None = None) -> Tensor:
        """Eq. (7) before L_o: dropout(E y_{t-1} + L_h h_t + L_z z_t) (masks shared by ``dropout_rows``)."""
        return shared_dropout(self.dropout, emb + self.out_h(h) + self.out_z(z), dropout_rows)

    def next_logits(self, tokens: Tensor, state: State, attention_mode: str) -> tuple[Tensor, AttentionOutput, State]:
        emb = self.embedding(tokens)  # (N, E)
        state, z, read = self.recur(emb, state, attention_mode)
        return self.out(self.deep_features(emb, state[0], z)), read, state  # (N, V)

    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "expectation",
                expectation_mask: Tensor | None = None, dropout_rows: Tensor | None = None,
                temperature: float = 1.0, sample_prob: float = 0.0) -> DecoderOutput:
        """Teacher-forced decoding (contract.CaptionDecoder.forward), one step at a time over the padded batch.

        ``sample_prob`` p > 0 is scheduled sampling (Bengio et al. 2015): from the second step on, each caption's
        input word is, with probability p (drawn per caption and step), a word sampled from the model's own
        previous output distribution (without gradient) instead of the reference's; the targets stay the
        reference's."""
        mode = self._mode(attention_mode)
        mask = caption_mask(captions, lengths)  # (B, T-1)
        grid = shared_dropout(self.feature_dropout, grid, dropout_rows)  # identity in eval mode
        emb = self.embedding(captions[:, :-1])  # (B, T-1, E): E y_{t-1} for every step
        state = self.init_state(grid)
        features, reads = [], []
        for t in range(captions.shape[1] - 1):
            word = emb[:, t] if not (sample_prob and t) else scheduled_input(self, captions[:, t], features[-1],
                                                                               sample_prob)
            state, z, read = self.recur(word, state, mode, expectation_mask, temperature)
            features.append(self.deep_features(word, state[0], z, dropout_rows))  # (B, E)
            reads.append(read)
        return DecoderOutput.from_padded(
            features=torch.stack(features, dim=1), alphas=by_step([r.alpha for r in reads]), mask=mask,
            out=self.out, log_probs=by_step([r.log_prob for r in reads]),
            entropies=by_step([r.entropy for r in reads]))


class Sentinel(nn.Module):
    """The visual sentinel's weights and its read (the module docstring): W_g (the sentinel gate), W_k (its key, in
    the grid's space, scored by the read's own scorer), W_v (its value) and b (its score's offset)."""

    def __init__(self, embed_dim: int, hidden_dim: int, feature_dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(embed_dim + hidden_dim, hidden_dim)
        self.key = nn.Linear(hidden_dim, feature_dim)
        self.value = nn.Linear(hidden_dim, feature_dim)
        self.offset = nn.Parameter(torch.zeros(()))

    def read(self, scorer: nn.Module, emb: Tensor, h: Tensor, c: Tensor, memory: list[Tensor],
             projected_query: Tensor | None = None) -> AttentionOutput:
        """The soft read over L cells and the sentinel for N query rows: alpha (N, L), the cells' part, sums to
        1 - beta. The memory may hold one row per G consecutive query rows (beam search's beams of an image, as
        attention.read_context reads it); ``projected_query``: h @ the scorer's query weight, when the caller has it."""
        values, prepared = memory  # (M, L, D), (M, L, *); N = M * G
        s = torch.sigmoid(self.gate(torch.cat([emb, h], dim=1))) * torch.tanh(c)  # (N, H): s_t
        if projected_query is not None:
            cells = scorer.score(projected_query, prepared)  # (N, L)
            own = scorer.score(projected_query, scorer.prepare(self.key(s).unsqueeze(1)))  # (N, 1)
        else:
            cells = scorer(h, prepared)  # (N, L)
            own = scorer(h, scorer.prepare(self.key(s).unsqueeze(1)))  # (N, 1): one sentinel row per query row
        both = torch.softmax(torch.cat([cells, own + self.offset], dim=1), dim=1)  # (N, L + 1)
        alpha, beta = both[:, :-1], both[:, -1:]  # (N, L), (N, 1)
        M, L, D = values.shape
        cells_read = torch.bmm(alpha.reshape(M, -1, L), values).reshape(-1, D)  # (M, G, L) @ (M, L, D) -> (N, D)
        context = cells_read + beta * self.value(s)  # (N, D)
        entropy = -(both * torch.log(both.clamp(min=torch.finfo(both.dtype).tiny))).sum(1)  # (N,)
        return AttentionOutput(context, alpha, None, entropy, None)


def with_sentinel(weights: dict[str, Tensor], fresh: dict[str, Tensor], prefix: str = "decoder.") -> dict[str, Tensor]:
    """A decoder's weights without the sentinel made into one with it: the sentinel's gate and key as ``fresh``
    (a newly built model's state dict) has them, its value zero and its offset -2, so the model starts close to what
    it computed (the cells keep all but the sentinel's small share, and the sentinel adds nothing)."""
    out = dict(weights)
    for key, value in fresh.items():
        if key.startswith(f"{prefix}sentinel."):
            out[key] = value.clone()
    out[f"{prefix}sentinel.value.weight"].zero_()
    out[f"{prefix}sentinel.value.bias"].zero_()
    out[f"{prefix}sentinel.offset"].fill_(-2.0)
    return out


def widen_for_scene(weights: dict[str, Tensor], feature_dim: int, prefix: str = "decoder.") -> dict[str, Tensor]:
    """A decoder's weights without the scene made into one with it (``scene="mean"``): W_ih (4H, E + Z) and L_z
    (E, Z) gain ``feature_dim`` zero columns for ā, so the widened model computes exactly what the narrow one did.
    ``weights``: a model's state dict (its decoder's keys under ``prefix``); a new dict, the other tensors shared."""
    out = dict(weights)
    for key in (f"{prefix}lstm.weight_ih", f"{prefix}out_z.weight"):
        w = weights[key]
        out[key] = torch.cat([w, w.new_zeros(w.shape[0], feature_dim)], dim=1)
    return out


def scheduled_input(decoder: nn.Module, reference: Tensor, previous: Tensor, sample_prob: float) -> Tensor:
    """Scheduled sampling's input at one step: (B, E), the embedding (``decoder.embedding``) of each caption's
    reference word ``reference`` (B,) or, with probability ``sample_prob``, of a word drawn from the previous
    step's output (``decoder.out`` of its features ``previous`` (B, E)), without gradient."""
    own = torch.rand(reference.shape[0], device=reference.device) < sample_prob  # (B,)
    if own.any():
        with torch.no_grad():
            probs = torch.softmax(decoder.out(previous).float(), dim=-1)  # (B, V)
            drawn = torch.multinomial(probs, 1).squeeze(1)  # (B,)
        reference = torch.where(own, drawn, reference)
    return decoder.embedding(reference)


def by_step(values: list[Tensor | None]) -> Tensor | None:
    """T-1 per-step tensors (B, *) -> (B, T-1, *); None when the steps have none (soft attention's log p(s_t))."""
    return None if values[0] is None else torch.stack(values, dim=1)
