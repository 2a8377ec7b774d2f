"""A Transformer caption decoder (Vaswani et al. 2017), the second decoder family beside Show-Attend-Tell's LSTM.

Built from the project's own attention modules (models/attention.py's MultiHeadAttention with the scaled dot
product scorer of models/scorers.py), pre-norm as in GPT-2:

    g_i = W_g a_i                                      the annotation grid at the model width d (grid positions:
                                                       the encoder's model.encoder.position_embedding)
    x_t = E y_{t-1} + P(t)                             word embedding + sinusoidal position of step t
    for each layer:
        x_t += SelfAttention(LN x_t | LN x_{<=t})     masked: a word sees itself and the words before it
        x_t += CrossAttention(LN x_t | g)             alpha_t: (heads, L) per word
        x_t += FFN(LN x_t)                             d -> hidden_dim -> d, GELU
    p(y_t) = softmax(L_o LN x_t)

Decoding keeps each layer's self-attention keys and values of the words so far (a KV cache, one row per caption
or beam) and the grid's projected keys and values (one row per image, read by all its beams). The per-word
attention map for the overlays is the cross-attention of one layer (``overlay_layer``, default the last),
averaged over its heads. Soft attention only: ``stochastic`` is False.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from captioner.models.attention import AttentionOutput, MultiHeadAttention
from captioner.models.decoders.contract import CaptionDecoder, DecoderOutput, State, caption_mask
from captioner.models.decoders.transformer_config import check_overlay_layer, check_width

Memory = tuple[Tensor, Tensor]  # MultiHeadAttention's (values, prepared keys), each (rows, M, positions, d/M)


def word_positions(start: int, count: int, dim: int, device: torch.device) -> Tensor:
    """Sinusoidal positions (Vaswani et al. 2017, §3.5) of steps start .. start+count-1: (count, dim)."""
    steps = torch.arange(start, start + count, device=device, dtype=torch.float32)[:, None]  # (count, 1)
    rates = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = steps * rates  # (count, ceil(dim / 2))
    return torch.stack([angles.sin(), angles.cos()], dim=2).flatten(1)[:, :dim]  # (count, dim)


class DecoderLayer(nn.Module):
    """One pre-norm layer: masked self-attention over the words, cross-attention over the grid, feed-forward.

    Args:
        dim: model width d.
        heads: attention heads M (d divisible by M).
        hidden_dim: feed-forward width.
        dropout: on each sublayer's output before it is added.
    """

    def __init__(self, dim: int, heads: int, hidden_dim: int, dropout: float) -> None:
        super().__init__()
        self.self_norm = nn.LayerNorm(dim)
        self.self_attention = MultiHeadAttention("scaled_dot", dim, dim, dim, heads)
        self.cross_norm = nn.LayerNorm(dim)
        self.cross_attention = MultiHeadAttention("scaled_dot", dim, dim, dim, heads)
        self.ff_norm = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, past: Memory | None, grid: Memory, allowed: Tensor | None = None
                ) -> tuple[Tensor, Memory, AttentionOutput]:
        """x (N, S, d): S new positions per row, after the positions in ``past`` (keys and values (N, M, P, d/M),
        or None); grid: the cross-attention memory (N / G rows). ``allowed`` (S, P + S) hides later words.
        Returns (x, keys and values of all P + S positions, the cross-attention read of the N*S queries)."""
        N, S, d = x.shape
        h = self.self_norm(x)
        values, keys = self.self_attention.prepare(h)  # (N, M, S, d/M) each
        if past is not None:
            values, keys = torch.cat([past[0], values], dim=2), torch.cat([past[1], keys], dim=2)  # (N, M, P+S, d/M)
        words = self.self_attention(h.reshape(N * S, d), (values, keys), "expectation", entropy=False, allowed=allowed)
        x = x + self.dropout(words.context.view(N, S, d))
        cross = self.cross_attention(self.cross_norm(x).reshape(N * S, d), grid, "expectation", entropy=False)
        x = x + self.dropout(cross.context.view(N, S, d))
        x = x + self.dropout(self.feed_forward(self.ff_norm(x)))
        return x, (values, keys), cross


class TransformerDecoder(CaptionDecoder):
    """Transformer caption decoder over an annotation grid (B, L, D) (module docstring).

    Args:
        vocab_size: V.
        feature_dim: D, size of an annotation vector.
        embed_dim: model width d (word embeddings, attention, residual stream).
        hidden_dim: feed-forward width.
        layers: decoder layers.
        heads: attention heads per layer (embed_dim divisible by heads).
        dropout: on the embeddings and on each sublayer's output.
        feature_dropout: dropout on the annotation vectors during teacher-forced training.
        overlay_layer: the layer whose cross-attention (mean over heads) is each word's alpha (-1: the last).
        pad_id: id of <pad> (its embedding stays zero).
    """

    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512, hidden_dim: int = 2048,
                 layers: int = 3, heads: int = 8, dropout: float = 0.1, feature_dropout: float = 0.0,
                 overlay_layer: int = -1, pad_id: int = 0) -> None:
        super().__init__()
        check_width(embed_dim, heads)
        check_overlay_layer(overlay_layer, layers)
        self.vocab_size, self.pad_id = vocab_size, pad_id
        self.attention_kind = "multi_head"
        self.overlay_layer = overlay_layer % layers
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.grid_proj = nn.Linear(feature_dim, embed_dim)  # W_g
        self.layers = nn.ModuleList(DecoderLayer(embed_dim, heads, hidden_dim, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(embed_dim)
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        self.dropout = nn.Dropout(dropout)
        self.feature_dropout = nn.Dropout(feature_dropout)

    def _grid_memory(self, grid: Tensor) -> tuple[Memory, ...]:
        """Each layer's cross-attention keys and values of the grid (B, L, D): (B, M, L, d/M) each, once per image."""
        g = self.grid_proj(grid)  # (B, L, d)
        return tuple(layer.cross_attention.prepare(g) for layer in self.layers)

    def _embed(self, tokens: Tensor, start: int) -> Tensor:
        """tokens (N, S) at steps start.. -> x (N, S, d): word embeddings plus positions."""
        positions = word_positions(start, tokens.shape[1], self.embedding.embedding_dim, tokens.device)
        return self.dropout(self.embedding(tokens) + positions.to(self.embedding.weight.dtype))

    def init_state(self, grid: Tensor) -> State:
        """(grid memory per layer (B rows), word keys and values per layer (B rows, no positions yet))."""
        grid_memory = self._grid_memory(grid)
        values = grid_memory[0][0]
        B, M, _, head_dim = values.shape
        empty = values.new_zeros(B, M, 0, head_dim)
        return grid_memory, tuple((empty, empty) for _ in self.layers)

    def expand_state(self, state: State, beams: int) -> State:
        """The word keys and values repeated per beam; the grid memory stays at one row per image (its
        attention reads it for a group of queries), neither copied nor reordered by beam search."""
        grid_memory, words = state
        return grid_memory, tuple((v.repeat_interleave(beams, dim=0), k.repeat_interleave(beams, dim=0))
                                  for v, k in words)

    def next_logits(self, tokens: Tensor, state: State, attention_mode: str) -> tuple[Tensor, AttentionOutput, State]:
        grid_memory, words = state
        x = self._embed(tokens[:, None], start=words[0][0].shape[2])  # (N, 1, d)
        cached, reads = [], []
        for layer, grid, past in zip(self.layers, grid_memory, words):
            x, memory, read = layer(x, past, grid)
            cached.append(memory)
            reads.append(read)
        logits = self.out(self.norm(x[:, 0]))  # (N, V)
        return logits, reads[self.overlay_layer], (grid_memory, tuple(cached))

    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "expectation",
                expectation_mask: Tensor | None = None, dropout_rows: Tensor | None = None,
                temperature: float = 1.0) -> DecoderOutput:
        """Teacher-forced decoding (contract.CaptionDecoder.forward): every step at once under a causal mask.
        Its attention is soft: there are no sampled copies whose masks ``dropout_rows`` would share, and no
        "gumbel" read whose ``temperature`` it would take."""
        if dropout_rows is not None:
            raise ValueError("the transformer decoder has no hard attention: dropout_rows is for its sampled copies")
        mask = caption_mask(captions, lengths)  # (B, S), S = T-1
        B, S = mask.shape
        grid_memory = self._grid_memory(self.feature_dropout(grid))
        x = self._embed(captions[:, :-1], start=0)  # (B, S, d)
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()  # word t sees words <= t
        reads = []
        for layer, memory in zip(self.layers, grid_memory):
            x, _, read = layer(x, None, memory, allowed=causal)
            reads.append(read)
        alphas = reads[self.overlay_layer].alpha.view(B, S, -1)  # (B, S, L)
        return DecoderOutput.from_padded(self.norm(x), alphas, mask, self.out)
