"""The attention LSTM decoder of Xu et al. 2015 ("Show, Attend and Tell"), §3.1.2 and §4.

    h_0, c_0 = f_init,h(mean_i a_i), f_init,c(mean_i a_i)            §3.1.2
    alpha_t, z_t = attention(h_{t-1}, {a_i})                        Eq. (4)-(6), §4.1/§4.2
    beta_t = sigmoid(f_beta(h_{t-1}))                                §4.2.1 (gating scalar)
    h_t, c_t = LSTM([E y_{t-1}; beta_t z_t], (h_{t-1}, c_{t-1}))     Eq. (1)-(3)
    p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z beta_t z_t))          Eq. (7), deep output

Efficiency (this is the training hot loop): the attention keys are projected once per batch
(attention.prepare), the word embeddings of all steps are computed before the loop, and the
deep output is applied after the loop to all steps at once (one big L_o matmul instead of T
small ones). Captions are sorted by length so the recurrence runs only the captions still
going at each step (the active batch shrinks); results are un-sorted before the output layer.

step() runs one word for N (image, partial caption) states for search; it reproduces the
teacher-forced logits exactly in eval mode.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner.models.attention import MODES, build_attention

GATES = ("scalar", "vector", "none")


@dataclass
class DecoderOutput:
    """Teacher-forced decoding of captions (B, T).

    logits: (B, T-1, V) predicting captions[:, 1:] (values at padded steps are meaningless).
    alphas: (B, T-1, L), zero at padded steps.
    log_probs: (B, T-1) log p(s_t) of the attended locations (hard attention in "sample"/"argmax"
        modes; 0 at padded steps and for images under expectation_mask), else None.
    entropies: (B, T-1) entropy of alpha_t (hard attention; 0 at padded steps), else None.
    mask: (B, T-1) bool, True at real steps (t < length - 1).
    """

    logits: Tensor
    alphas: Tensor
    log_probs: Tensor | None
    entropies: Tensor | None
    mask: Tensor


class ShowAttendTellDecoder(nn.Module):
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
        pad_id: id of <pad> (its embedding stays zero).
    """

    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512,
                 hidden_dim: int = 512, attention_dim: int = 512, scorer: str = "additive",
                 attention: str = "soft", heads: int = 1, gate: str = "scalar",
                 dropout: float = 0.5, pad_id: int = 0) -> None:
        super().__init__()
        if gate not in GATES:
            raise ValueError(f"unknown gate {gate!r}; valid gates: {', '.join(GATES)}")
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.attention = build_attention(attention, scorer, key_dim=feature_dim,
                                         query_dim=hidden_dim, attention_dim=attention_dim,
                                         heads=heads)
        context_dim = self.attention.out_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        # f_init,h and f_init,c: one tanh layer each, as in the authors' code.
        self.init_h = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.Tanh())
        self.init_c = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.Tanh())
        self.gate = None if gate == "none" else nn.Linear(hidden_dim, 1 if gate == "scalar" else context_dim)
        self.lstm = nn.LSTMCell(embed_dim + context_dim, hidden_dim)
        self.out_h = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_z = nn.Linear(context_dim, embed_dim, bias=False)  # L_z (L_h carries the bias)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o

    @property
    def stochastic(self) -> bool:
        """True for hard attention: the only kind whose decoding mode matters."""
        return self.attention.stochastic

    def _mode(self, attention_mode: str) -> str:
        if attention_mode not in MODES:
            raise ValueError(f"unknown attention_mode {attention_mode!r}; valid modes: {', '.join(MODES)}")
        return attention_mode if self.stochastic else "soft"

    def init_state(self, grid: Tensor) -> tuple[Tensor, ...]:
        """(h_0, c_0, *attention memory) for grid (B, L, D); every tensor has dim 0 = B."""
        mean = grid.mean(dim=1)  # (B, D)
        return (self.init_h(mean), self.init_c(mean), *self.attention.prepare(grid))

    def _recur(self, emb: Tensor, h: Tensor, c: Tensor, memory: tuple[Tensor, ...], mode: str,
               expectation_mask: Tensor | None = None):
        """One step of Eq. (1)-(6): attend with h_{t-1}, gate, LSTM. Returns (h, c, z, read)."""
        read = self.attention(h, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic)
        z = read.context  # (N, Z)
        if self.gate is not None:
            z = torch.sigmoid(self.gate(h)) * z  # beta_t z_t, §4.2.1
        h, c = self.lstm(torch.cat([emb, z], dim=1), (h, c))  # (N, H)
        return h, c, z, read

    def _deep_output(self, emb: Tensor, h: Tensor, z: Tensor) -> Tensor:
        """Eq. (7): L_o(E y_{t-1} + L_h h_t + L_z z_t), on any leading shape."""
        return self.out(self.dropout(emb + self.out_h(h) + self.out_z(z)))

    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "soft",
                expectation_mask: Tensor | None = None) -> DecoderOutput:
        """Teacher-forced decoding.

        Args:
            grid: (B, L, D) annotation vectors.
            captions: (B, T) ids: <start> w_1 .. w_n <end> <pad> ...
            lengths: (B,) n + 2 (tokens including <start> and <end>).
            attention_mode: "soft"/"expectation"/"sample"/"argmax"; honoured by hard attention only.
            expectation_mask: (B,) bool or None; images where True read the expected (soft)
                context at every step and get log_prob 0 (the variance trick of §4.1).
        """
        mode = self._mode(attention_mode)
        B, T = captions.shape
        steps = lengths.to(captions.device) - 1  # (B,) words to predict per caption
        mask = torch.arange(T - 1, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T-1)
        emb = self.embedding(captions[:, :-1])  # (B, T-1, E): all inputs at once

        # Sort by length (longest first) so that at step t the active captions are a prefix.
        order = torch.argsort(steps, descending=True, stable=True)  # (B,)
        steps_s = steps.index_select(0, order)
        longest, shortest = steps_s[[0, -1]].tolist()
        if longest > T - 1 or shortest < 1:
            raise ValueError(f"lengths must lie in [2, T={T}] (<start> and <end> included); "
                             f"got {shortest + 1}..{longest + 1}")
        active = (steps_s.unsqueeze(0) > torch.arange(T - 1, device=steps.device).unsqueeze(1)).sum(1).tolist()  # (T-1,) active rows per step
        grid_s = grid.index_select(0, order)  # (B, L, D)
        emb_s = emb.index_select(0, order)  # (B, T-1, E)
        mask_s = None if expectation_mask is None else expectation_mask.index_select(0, order)
        h, c, *memory = self.init_state(grid_s)

        # unbind, not emb_s[:, t]: a slice per step would cost a full-size zero gradient per step.
        emb_steps = emb_s.unbind(1)  # T-1 x (B, E)
        # Per-step results are kept packed (time-major, active rows only) and scattered into
        # (B, T-1, *) once after the loop: no per-step padding kernels.
        hs, zs, alphas, log_probs, entropies = [], [], [], [], []
        for t, n in enumerate(active):
            if n == 0:
                break
            if n < h.shape[0]:  # shrink to the n captions still running (slices cost a backward copy)
                h, c = h[:n], c[:n]
                memory = [m[:n] for m in memory]
                if mask_s is not None:
                    mask_s = mask_s[:n]
            emb_t = emb_steps[t] if n == B else emb_steps[t][:n]  # (n, E)
            h, c, z, read = self._recur(emb_t, h, c, memory, mode, mask_s)
            hs.append(h)
            zs.append(z)
            alphas.append(read.alpha)
            if read.log_prob is not None:
                log_probs.append(read.log_prob)
            if read.entropy is not None:
                entropies.append(read.entropy)

        # Destination row (in the un-sorted (B*(T-1)) layout) of every packed row, time-major.
        dest = order.unsqueeze(1) * (T - 1) + torch.arange(T - 1, device=order.device)  # (B, T-1) sorted rows
        live = steps_s.unsqueeze(1) > torch.arange(T - 1, device=order.device)  # (B, T-1) sorted rows
        dest = dest.t()[live.t()]  # (sum of steps,) in the packed order

        def scatter(seq: list[Tensor]) -> Tensor:
            packed = torch.cat(seq, dim=0)  # (sum of steps, *)
            out = packed.new_zeros(B * (T - 1), *packed.shape[1:]).index_copy(0, dest, packed)
            return out.view(B, T - 1, *packed.shape[1:])  # (B, T-1, *), zeros at padded steps

        logits = self._deep_output(emb, scatter(hs), scatter(zs))  # (B, T-1, V): one L_o matmul for all steps
        return DecoderOutput(
            logits=logits,
            alphas=scatter(alphas),
            log_probs=scatter(log_probs) if log_probs else None,
            entropies=scatter(entropies) if entropies else None,
            mask=mask,
        )

    def step(self, tokens: Tensor, state: tuple[Tensor, ...], attention_mode: str = "soft"
             ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """One word for N states: tokens (N,) -> (log_probs (N, V), alpha (N, L), new state)."""
        mode = self._mode(attention_mode)
        h, c, *memory = state
        emb = self.embedding(tokens)  # (N, E)
        h, c, z, read = self._recur(emb, h, c, memory, mode)
        log_probs = F.log_softmax(self._deep_output(emb, h, z), dim=-1)  # (N, V)
        return log_probs, read.alpha, (h, c, *memory)
