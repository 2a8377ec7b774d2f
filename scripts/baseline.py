"""A plain per-step Show-Attend-Tell decoder, for same-run speed ratios in scripts/bench.py.

Written here, following the algorithm of the popular PyTorch tutorial port of Xu et al. 2015 as its
documentation describes it (the port itself is not in this repository): an nn.LSTMCell run step by step
over captions sorted by length, the active batch shrinking as captions end; an attention module that
projects the encoder grid and the hidden state at every step and scores with a ReLU MLP; a sigmoid gate
f_beta (H -> D) on the context; the output layer fc(dropout(h)) at every step, written into a padded
(B, T, V) tensor; cross-entropy over the packed real steps plus the doubly stochastic penalty; Adam.
Beam search decodes one image at a time with k beams, the k rows of the grid re-projected at every step,
top-k over the k x V flattened scores, each hypothesis's attention maps kept for the overlays. It is the
reference point "a straightforward implementation" that the issue's ratios are about; bench.py reports the
same-run ratio and this module's own figures.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PlainAttention(nn.Module):
    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.grid_proj = nn.Linear(feature_dim, attention_dim)
        self.hidden_proj = nn.Linear(hidden_dim, attention_dim)
        self.score = nn.Linear(attention_dim, 1)

    def forward(self, grid: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        keys = self.grid_proj(grid)  # (N, L, A): every step, as the port does
        scores = self.score(F.relu(keys + self.hidden_proj(h).unsqueeze(1))).squeeze(2)  # (N, L)
        alpha = F.softmax(scores, dim=1)  # (N, L)
        return (grid * alpha.unsqueeze(2)).sum(dim=1), alpha  # (N, D), (N, L)


class PlainDecoder(nn.Module):
    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512, hidden_dim: int = 512,
                 attention_dim: int = 512, dropout: float = 0.5) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.attention = PlainAttention(feature_dim, hidden_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTMCell(embed_dim + feature_dim, hidden_dim)
        self.init_h = nn.Linear(feature_dim, hidden_dim)
        self.init_c = nn.Linear(feature_dim, hidden_dim)
        self.gate = nn.Linear(hidden_dim, feature_dim)
        self.fc = nn.Linear(hidden_dim, vocab_size)

    def init_state(self, grid: Tensor) -> tuple[Tensor, Tensor]:
        mean = grid.mean(dim=1)  # (N, D)
        return self.init_h(mean), self.init_c(mean)

    def step(self, emb: Tensor, grid: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        context, alpha = self.attention(grid, h)
        context = torch.sigmoid(self.gate(h)) * context  # (N, D)
        h, c = self.lstm(torch.cat([emb, context], dim=1), (h, c))
        return self.fc(self.dropout(h)), alpha, h, c  # (N, V), (N, L)

    def loss(self, grid: Tensor, captions: Tensor, lengths: Tensor, alpha_c: float = 1.0) -> Tensor:
        """Cross-entropy over the real steps + alpha_c x the doubly stochastic penalty."""
        lengths, order = lengths.sort(descending=True)
        grid, captions = grid[order], captions[order]
        steps = (lengths - 1).tolist()  # words to predict per caption
        B, L, T = grid.shape[0], grid.shape[1], max(steps)
        h, c = self.init_state(grid)
        emb = self.embedding(captions)  # (B, T+1, E): all steps at once, as the port does
        predictions = grid.new_zeros(B, T, self.vocab_size)
        alphas = grid.new_zeros(B, T, L)
        for t in range(T):
            n = sum(s > t for s in steps)  # captions still running
            logits, alpha, h, c = self.step(emb[:n, t], grid[:n], h[:n], c[:n])
            predictions[:n, t] = logits
            alphas[:n, t] = alpha
        packed = nn.utils.rnn.pack_padded_sequence(predictions, steps, batch_first=True).data
        targets = nn.utils.rnn.pack_padded_sequence(captions[:, 1:], steps, batch_first=True).data
        return F.cross_entropy(packed, targets) + alpha_c * ((1.0 - alphas.sum(dim=1)) ** 2).mean()

    @torch.no_grad()
    def beam_search(self, grid: Tensor, beam: int, start_id: int, length: int) -> list[list[int]]:
        """Each image on its own, ``beam`` hypotheses for exactly ``length`` words (no early end)."""
        best = []
        for image in grid:  # (L, D)
            k_grid = image.unsqueeze(0).expand(beam, -1, -1)  # (k, L, D)
            words = torch.full((beam,), start_id, dtype=torch.long)
            seqs = words.unsqueeze(1)  # (k, 1)
            scores = torch.zeros(beam, 1)
            maps = torch.ones(beam, 1, image.shape[0])  # (k, 1, L): each hypothesis's attention maps, kept
            h, c = self.init_state(k_grid)
            for t in range(length):
                logits, alpha, h, c = self.step(self.embedding(words), k_grid, h, c)
                total = scores + F.log_softmax(logits, dim=1)  # (k, V)
                top, index = (total[0] if t == 0 else total.view(-1)).topk(beam)
                prev, words = index // self.vocab_size, index % self.vocab_size
                seqs = torch.cat([seqs[prev], words.unsqueeze(1)], dim=1)
                maps = torch.cat([maps[prev], alpha[prev].unsqueeze(1)], dim=1)  # for the overlays, as the port
                h, c, k_grid, scores = h[prev], c[prev], k_grid[prev], top.unsqueeze(1)
            best.append(seqs[scores.argmax()].tolist())
        return best
