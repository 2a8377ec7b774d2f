"""The top-down attention decoder of Anderson et al. (CVPR 2018, "Bottom-Up and Top-Down Attention", §3.2),
over the encoder's grid instead of detected regions:

    h1_t = LSTM_att([h2_{t-1}; mean_i v_i; W_e y_{t-1}], h1_{t-1})   Eq. (2): the attention LSTM
    alpha_t, v^_t = attention(h1_t, {v_i})                           Eq. (3)-(5), any scorer and read
    h2_t = LSTM_lang([v^_t; h1_t], h2_{t-1})                         Eq. (6): the language LSTM
    p(y_t) = softmax(W_p dropout(h2_t) + b_p)                        Eq. (7)

Both LSTMs start at zero (the paper gives no initialisation from the image: the mean feature enters every
step). The attention reads the query of the current step (h1_t), not the previous one as Show-Attend-Tell's
does. Every ``model.attention`` read works (soft, hard and its one-cell modes, key-value, multi-head) through
models/attention.py, so do the searches, SCST, the overlays, the mirror check and the grounding figures
through the decoder contract (contract.py); scheduled sampling feeds back its own words as the LSTM decoder
does. One step at a time over the padded batch, in plain PyTorch (no fast path).
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
from captioner.models.decoders.show_attend_tell import by_step, scheduled_input


class UpDownDecoder(GridAttentionDecoder):
    """Args: vocab_size, feature_dim (D of the grid), embed_dim (W_e), hidden_dim (both LSTMs), attention_dim,
    scorer, attention, heads (model.attention's), dropout (before W_p), feature_dropout (on the grid while
    training), pad_id (its embedding stays zero). The state is (h2, c2, h1, c1, mean feature, *attention memory):
    h2 first, the language LSTM's output, whose features the output layer reads."""

    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512, hidden_dim: int = 512,
                 attention_dim: int = 512, scorer: str = "additive", attention: str = "soft", heads: int = 1,
                 dropout: float = 0.5, feature_dropout: float = 0.0, pad_id: int = 0) -> None:
        super().__init__()
        self.vocab_size, self.pad_id, self.attention_kind = vocab_size, pad_id, attention
        self.hidden_dim = hidden_dim
        self.attention = build_attention(attention, scorer, key_dim=feature_dim, query_dim=hidden_dim,
                                         attention_dim=attention_dim, heads=heads)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.attention_lstm = nn.LSTMCell(hidden_dim + feature_dim + embed_dim, hidden_dim)
        self.language_lstm = nn.LSTMCell(self.attention.out_dim + hidden_dim, hidden_dim)
        self.dropout = nn.Dropout(dropout)
        self.feature_dropout = nn.Dropout(feature_dropout)
        self.out = nn.Linear(hidden_dim, vocab_size)  # W_p

    def init_state(self, grid: Tensor) -> State:
        """(h2, c2, h1, c1, mean_i v_i, *attention memory) for grid (B, L, D), the LSTMs at zero."""
        zeros = grid.new_zeros(grid.shape[0], self.hidden_dim)  # (B, H)
        return (zeros, zeros, zeros, zeros, grid.mean(dim=1), *self.attention.prepare(grid))

    def recur(self, emb: Tensor, state: State, mode: str, expectation_mask: Tensor | None = None,
              temperature: float = 1.0) -> tuple[State, AttentionOutput]:
        """One step for word embeddings emb (N, E) = W_e y_{t-1}: Eq. (2)-(6). Returns (new state, the read)."""
        h2, c2, h1, c1, mean, *memory = state
        h1, c1 = self.attention_lstm(torch.cat([h2, mean, emb], dim=1), (h1, c1))  # Eq. (2)
        read = self.attention(h1, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic,
                              temperature=temperature)  # Eq. (3)-(5): alpha_t, v^_t
        h2, c2 = self.language_lstm(torch.cat([read.context, h1], dim=1), (h2, c2))  # Eq. (6)
        return (h2, c2, h1, c1, mean, *memory), read

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
