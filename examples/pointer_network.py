"""A pointer network (Vinyals, Fortunato & Jaitly 2015, "Pointer Networks", Eq. (3)).

Attention used as the output itself: an LSTM encodes a sequence of inputs x_1..x_n into
e_1..e_n; an LSTM decoder, at every output step i, scores every input position with the same
scoring functions the captioner uses (scorers.py),
    u_i,j = s(e_j, d_i),      p(C_i | C_1..C_{i-1}, x) = softmax_j(u_i,j)
and the output distribution over positions IS the attention distribution. Positions already
pointed at are masked, so a decode is a permutation. The decoder's next input is the embedding of
the input it just pointed at (the teacher's choice during training).

The demo task (examples/pointer_sort.py) is sorting: (20, 5, 10) -> (1, 3, 2), the 1-based
positions of the inputs in decreasing order of value (order="increasing" flips it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner.models.scorers import build_scorer

ORDERS = ("decreasing", "increasing")


def sort_targets(values: Tensor, order: str = "decreasing") -> Tensor:
    """0-based positions of values (B, n) in the given order of value: (B, n) long."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid orders: {', '.join(ORDERS)}")
    return torch.argsort(values, dim=1, descending=order == "decreasing", stable=True)


class PointerNetwork(nn.Module):
    """LSTM encoder + LSTM pointer decoder over input positions.

    Args:
        input_dim: size of one input element (1 for a sequence of numbers).
        hidden_dim: size of the embeddings and of both LSTMs.
        scorer: scoring function name (scorers.SCORERS).
        attention_dim: hidden size of the scorer.
    """

    def __init__(self, input_dim: int = 1, hidden_dim: int = 128, scorer: str = "additive",
                 attention_dim: int = 128) -> None:
        super().__init__()
        self.embed = nn.Linear(input_dim, hidden_dim)
        self.encoder = nn.LSTM(hidden_dim, hidden_dim, batch_first=True)
        self.decoder = nn.LSTMCell(hidden_dim, hidden_dim)
        self.start = nn.Parameter(torch.zeros(hidden_dim))  # decoder input before the first pointer
        self.scorer = build_scorer(scorer, hidden_dim, hidden_dim, attention_dim)

    def forward(self, inputs: Tensor, targets: Tensor | None = None) -> Tensor:
        """Pointer log-distributions (B, n, n): row i is log p(C_i = j).

        inputs: (B, n) numbers or (B, n, input_dim). targets: (B, n) 0-based positions to feed
        back (teacher forcing); None decodes greedily, feeding back the model's own choices.
        """
        if inputs.dim() == 2:
            inputs = inputs.unsqueeze(-1)  # (B, n, 1)
        B, n, _ = inputs.shape
        x = self.embed(inputs)  # (B, n, H)
        enc, (h, c) = self.encoder(x)  # (B, n, H); (1, B, H) each
        h, c = h[0], c[0]  # (B, H)
        prepared = self.scorer.prepare(enc)  # once per sequence, as in the captioner
        rows = torch.arange(B, device=inputs.device)
        pointed = torch.zeros(B, n, dtype=torch.bool, device=inputs.device)
        step_input = self.start.expand(B, -1)  # (B, H)
        out = []
        for i in range(n):
            h, c = self.decoder(step_input, (h, c))  # (B, H)
            scores = self.scorer(h, prepared).masked_fill(pointed, float("-inf"))  # (B, n)
            log_p = F.log_softmax(scores, dim=-1)
            out.append(log_p)
            choice = log_p.argmax(-1) if targets is None else targets[:, i]  # (B,)
            pointed = pointed.clone()
            pointed[rows, choice] = True
            step_input = x[rows, choice]  # (B, H): embedding of the input just pointed at
        return torch.stack(out, dim=1)  # (B, n, n)

    @torch.no_grad()
    def point(self, inputs: Tensor) -> Tensor:
        """Greedy decode: 0-based positions (B, n), a permutation per row."""
        return self(inputs).argmax(-1)


def pointer_loss(log_p: Tensor, targets: Tensor) -> Tensor:
    """Mean negative log-likelihood of the target positions: log_p (B, n, n), targets (B, n)."""
    return F.nll_loss(log_p.flatten(0, 1), targets.flatten())


def train_sorter(length: int = 5, steps: int = 800, order: str = "decreasing", batch_size: int = 128,
                 hidden_dim: int = 64, scorer: str = "additive", lr: float = 5e-3, seed: int = 0,
                 log_every: int = 0) -> PointerNetwork:
    """Train a PointerNetwork to sort random sequences of `length` numbers in U(0, 1)."""
    torch.manual_seed(seed)
    model = PointerNetwork(hidden_dim=hidden_dim, scorer=scorer, attention_dim=hidden_dim)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    # Cosine decay: large steps early, fine pointer margins late (sorting accuracy is all-or-nothing).
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    for step in range(1, steps + 1):
        values = torch.rand(batch_size, length)  # (B, n)
        targets = sort_targets(values, order)
        loss = pointer_loss(model(values, targets), targets)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if log_every and step % log_every == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    return model


def sort_accuracy(model: PointerNetwork, length: int = 5, order: str = "decreasing",
                  n: int = 2000, seed: int = 1) -> float:
    """Exact-match accuracy of greedy decodes on n fresh random sequences."""
    g = torch.Generator().manual_seed(seed)
    values = torch.rand(n, length, generator=g)
    model.eval()
    correct = (model.point(values) == sort_targets(values, order)).all(dim=1)
    model.train()
    return correct.float().mean().item()
