"""The top-down attention decoder of Anderson et al. (CVPR 2018, "Bottom-Up and Top-Down Attention", §3.2),
over the encoder's grid instead of detected regions:

    h1_t = LSTM_att([h2_{t-1}; mean_i v_i; W_e y_{t-1}], h1_{t-1})   Eq. (2): the attention LSTM
    alpha_t, v^_t = attention(h1_t, {v_i})                           Eq. (3)-(5), any scorer and read
    h2_t = LSTM_lang([v^_t; h1_t], h2_{t-1})                         Eq. (6): the language LSTM
    p(y_t) = softmax(W_p dropout(h2_t) + b_p)                        Eq. (7)

Both LSTMs start at zero (the paper gives no initialisation from the image: the mean feature enters every
step; its share of the attention LSTM's gates, W_ih's mean-feature columns times it, is computed once per image and
kept in the state). The attention reads the query of the current step (h1_t), not the previous one as Show-Attend-Tell's
does. Every ``model.attention`` read works (soft, hard and its one-cell modes, key-value, multi-head) through
models/attention.py, so do the searches, SCST, the overlays, the mirror check and the grounding figures
through the decoder contract (contract.py); scheduled sampling feeds back its own words as the LSTM decoder
does. This is the reference: one step at a time over the padded batch, in plain PyTorch; updown_fast.py computes
the same on captions sorted by length, as the LSTM's fast path does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner.models.attention import AttentionOutput, build_attention
from captioner.models.decoders.contract import (
    DecoderOutput,
    GridAttentionDecoder,
    State,
    caption_mask,
    shared_dropout,
)
from captioner.models.decoders.show_attend_tell import by_step, scheduled_input


class UpDownDecoder(GridAttentionDecoder):
    """Args: vocab_size, feature_dim (D of the grid), embed_dim (W_e), hidden_dim (both LSTMs), attention_dim,
    scorer, attention, heads (model.attention's), dropout (before W_p), feature_dropout (on the grid while
    training), pad_id (its embedding stays zero). The state is (h2, c2, h1, c1, the mean feature's share of the
    attention LSTM's gates, *attention memory): h2 first, the language LSTM's output, whose features the output
    layer reads."""

    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512, hidden_dim: int = 512,
                 attention_dim: int = 512, scorer: str = "additive", attention: str = "soft", heads: int = 1,
                 dropout: float = 0.5, feature_dropout: float = 0.0, pad_id: int = 0) -> None:
        super().__init__()
        self.vocab_size, self.pad_id, self.attention_kind = vocab_size, pad_id, attention
        self.hidden_dim, self.feature_dim, self.embed_dim = hidden_dim, feature_dim, embed_dim
        self.attention = build_attention(attention, scorer, key_dim=feature_dim, query_dim=hidden_dim,
                                         attention_dim=attention_dim, heads=heads)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.attention_lstm = nn.LSTMCell(hidden_dim + feature_dim + embed_dim, hidden_dim)
        self.language_lstm = nn.LSTMCell(self.attention.out_dim + hidden_dim, hidden_dim)
        self.dropout = nn.Dropout(dropout)
        self.feature_dropout = nn.Dropout(feature_dropout)
        self.out = nn.Linear(hidden_dim, vocab_size)  # W_p

    def attention_lstm_inputs(self) -> tuple[Tensor, Tensor, Tensor]:
        """The attention LSTM's input weight W_ih split by what its columns read: (h2, mean feature, word)."""
        return self.attention_lstm.weight_ih.split([self.hidden_dim, self.feature_dim, self.embed_dim], dim=1)

    def init_state(self, grid: Tensor) -> State:
        """(h2, c2, h1, c1, W_ih,mean mean_i v_i (B, 4H), *attention memory) for grid (B, L, D), the LSTMs at
        zero."""
        zeros = grid.new_zeros(grid.shape[0], self.hidden_dim)  # (B, H)
        mean_gates = F.linear(grid.mean(dim=1), self.attention_lstm_inputs()[1])  # (B, 4H)
        return (zeros, zeros, zeros, zeros, mean_gates, *self.attention.prepare(grid))

    def recur(self, emb: Tensor, state: State, mode: str, expectation_mask: Tensor | None = None,
              temperature: float = 1.0) -> tuple[State, AttentionOutput]:
        """One step for word embeddings emb (N, E) = W_e y_{t-1}: Eq. (2)-(6). Returns (new state, the read)."""
        h2, c2, h1, c1, mean_gates, *memory = state
        from_h2, _, from_word = self.attention_lstm_inputs()
        lstm = self.attention_lstm
        gates = (mean_gates + F.linear(h2, from_h2) + F.linear(emb, from_word, lstm.bias_ih)
                 + F.linear(h1, lstm.weight_hh, lstm.bias_hh))  # (N, 4H): Eq. (2)'s LSTM on [h2; mean; word]
        h1, c1 = lstm_step(gates, c1)
        read = self.attention(h1, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic,
                              temperature=temperature)  # Eq. (3)-(5): alpha_t, v^_t
        h2, c2 = self.language_lstm(torch.cat([read.context, h1], dim=1), (h2, c2))  # Eq. (6)
        return (h2, c2, h1, c1, mean_gates, *memory), read

    def next_logits(self, tokens: Tensor, state: State, attention_mode: str) -> tuple[Tensor, AttentionOutput, State]:
        state, read = self.recur(self.embedding(tokens), state, attention_mode)
        return self.out(self.dropout(state[0])), read, state  # (N, V)

    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "expectation",
                expectation_mask: Tensor | None = None, dropout_rows: Tensor | None = None,
                temperature: float = 1.0, sample_prob: float = 0.0) -> DecoderOutput:
        """Teacher-forced decoding (contract.CaptionDecoder.forward), one step at a time over the padded batch;
        ``sample_prob`` > 0: scheduled sampling (show_attend_tell.scheduled_input)."""
        mode = self._mode(attention_mode)
        mask = caption_mask(captions, lengths)  # (B, T-1)
        grid = shared_dropout(self.feature_dropout, grid, dropout_rows)  # identity in eval mode
        emb = self.embedding(captions[:, :-1])  # (B, T-1, E)
        state = self.init_state(grid)
        features, reads = [], []
        for t in range(captions.shape[1] - 1):
            word = emb[:, t] if not (sample_prob and t) else scheduled_input(self, captions[:, t], features[-1],
                                                                               sample_prob)
            state, read = self.recur(word, state, mode, expectation_mask, temperature)
            features.append(shared_dropout(self.dropout, state[0], dropout_rows))  # (B, H)
            reads.append(read)
        return DecoderOutput.from_padded(
            features=torch.stack(features, dim=1), alphas=by_step([r.alpha for r in reads]), mask=mask,
            out=self.out, log_probs=by_step([r.log_prob for r in reads]),
            entropies=by_step([r.entropy for r in reads]))


def lstm_step(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """nn.LSTMCell's update from its summed gates (N, 4H), blocks i, f, g, o, and cell state c (N, H): (h, c)."""
    i, f, g, o = gates.chunk(4, dim=1)  # 4 x (N, H)
    c = torch.addcmul(torch.sigmoid(f) * c, torch.sigmoid(i), torch.tanh(g))
    return torch.sigmoid(o) * torch.tanh(c), c
