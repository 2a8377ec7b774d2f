"""The attention LSTM decoder of Xu et al. 2015 ("Show, Attend and Tell"), §3.1.2 and §4.

    h_0, c_0 = f_init,h(mean_i a_i), f_init,c(mean_i a_i)            §3.1.2
    alpha_t, z_t = attention(h_{t-1}, {a_i})                        Eq. (4)-(6), §4.1/§4.2
    beta_t = sigmoid(f_beta(h_{t-1}))                                §4.2.1 (gating scalar)
    h_t, c_t = LSTM([E y_{t-1}; beta_t z_t], (h_{t-1}, c_{t-1}))     Eq. (1)-(3)
    p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z beta_t z_t))          Eq. (7), deep output

Efficiency (this is the training hot loop): the attention keys are projected once per batch
(attention.prepare), the word embeddings of all steps are computed before the loop, and the
deep output is applied after the loop to all steps at once (one big L_o matmul instead of T
small ones). The LSTM's input matmul is split the same way: its word-embedding part (plus both
biases) runs for all steps in one matmul before the loop. Each step then makes one matmul of
h_{t-1} with every weight that reads it (weight_hh, the scorer's query projection, the gate: see
_hidden_weight), attends, adds beta_t z_t times its weights and does the cell's elementwise math
(nn.LSTMCell's parameters and gate order i, f, g, o; step() runs the same code). Under autograd the
per-step weights' gradients are formed once per sequence (models/deferred.py).
Captions are sorted by length so the recurrence runs only the captions still
going at each step (the active batch shrinks); the output layer and the loss then run on the real
steps only (DecoderOutput.packed_features), never on padding, as one fused function
(losses.linear_token_nll: no (R, V) temporaries beyond the one buffer the logits need).

step() runs one word for N (image, partial caption) states for search; it reproduces the
teacher-forced logits in eval mode (to float rounding: without autograd it gathers each word's share
of the gates from a cached table, and beam search may read projected values, see expand_state).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from captioner import kernels
from captioner.models.attention import SoftAttention, build_attention, resolve_mode
from captioner.models.deferred import SharedRows, StepWeight, step_weights
from captioner.search import Logits

GATES = ("scalar", "vector", "none")

# Optimizer steps taken in this process (any optimizer): part of the inference caches' key (_cached).
_OPTIMIZER_STEPS = [0]


def _count_optimizer_step(optimizer, args, kwargs) -> None:
    _OPTIMIZER_STEPS[0] += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def _column_major(weight: Tensor) -> Tensor:
    """For inference: a copy of ``weight`` (out, in) with its values stored column by column (strides (1, out)).
    x @ weight.t() is then a matmul of two row-major operands, which MKL runs faster for the few rows of a
    decoding step where its packed GEMM does not serve (StepWeight; scripts/bench.py's shapes, 2 threads: L_o
    for 32 rows 3.5 -> 1.8 ms, the stacked h_{t-1} weights 0.84 -> 0.58 ms; no gain from 160 rows on)."""
    return weight.t().contiguous().t()


@dataclass
class DecoderOutput:
    """Teacher-forced decoding of captions (B, T).

    packed_features: (R, E) the output layer's input (Eq. (7) before L_o, dropout applied) at the R real
        steps only (the output layer never runs on padding), row r predicting the flat target rows[r] of
        captions[:, 1:] (b * (T-1) + t).
    output_weight, output_bias: L_o's parameters (V, E) and (V,), seen through a view made in the forward pass,
        so that DistributedDataParallel, which looks for the parameters a forward used by walking back
        from its outputs, finds them. The losses apply L_o fused with the cross-entropy (losses.real_token_nll).
    rows: (R,) those flat indices.
    packed_logits: (R, V) L_o(packed_features): a property, computed on first use.
    logits: (B, T-1, V) predicting captions[:, 1:], zero at padded steps: a property, scattered from
        packed_logits on first use (the losses need neither).
    alphas: (B, T-1, L), zero at padded steps.
    log_probs: (B, T-1) log p(s_t) of the attended locations (hard attention in "sample"/"argmax"
        modes; 0 at padded steps and for images under expectation_mask), else None.
    entropies: (B, T-1) entropy of alpha_t (hard attention; 0 at padded steps), else None.
    mask: (B, T-1) bool, True at real steps (t < length - 1).
    """

    packed_features: Tensor
    output_weight: Tensor
    output_bias: Tensor | None
    rows: Tensor
    alphas: Tensor
    log_probs: Tensor | None
    entropies: Tensor | None
    mask: Tensor
    _packed_logits: Tensor | None = field(default=None, repr=False)
    _logits: Tensor | None = field(default=None, repr=False)

    @property
    def packed_logits(self) -> Tensor:
        if self._packed_logits is None:
            self._packed_logits = F.linear(self.packed_features, self.output_weight, self.output_bias)  # (R, V)
        return self._packed_logits

    @property
    def logits(self) -> Tensor:
        if self._logits is None:
            B, S = self.mask.shape
            packed = self.packed_logits
            full = packed.new_zeros(B * S, packed.shape[1]).index_copy(0, self.rows, packed)
            self._logits = full.view(B, S, -1)  # (B, T-1, V)
        return self._logits


class ProjectedState(tuple):
    """A decoder state (h, c, projected values, prepared keys) whose values were multiplied by the weights
    that read the context (ShowAttendTellDecoder.expand_state). A tuple: search reorders it like any state."""


@dataclass
class _LoopWeights:
    """The per-step weights of one sequence: LSTM word and context blocks of weight_ih, and the stack of
    every weight reading h_{t-1} (ShowAttendTellDecoder._hidden_weight) with its bias and query size."""

    word: StepWeight
    context: StepWeight
    hidden: StepWeight
    hidden_bias: Tensor | None
    query_size: int


@dataclass
class SampleOutput:
    """Captions drawn from the decoder with their log-probabilities (for sequence-level REINFORCE).

    tokens: (N, T) sampled ids w_1 .. w_n <end> <pad> ... (no <start>); a caption still running after
        T steps has no <end>.
    lengths: (N,) tokens per row, <end> included when there is one.
    word_log_probs: (N, T) log p(w_t | w_<t, a), 0 after the caption's end; differentiable.
    location_log_probs: (N, T) log p(s_t | a) of the attended cells (hard attention, "sample"/"argmax"),
        0 after the end; else None.
    alphas: (N, T, L) attention maps (detached).
    location_entropies: (N, T) H[alpha_t] (hard attention; differentiable, 0 after the end), else None.
    """

    tokens: Tensor
    lengths: Tensor
    word_log_probs: Tensor
    location_log_probs: Tensor | None
    alphas: Tensor
    location_entropies: Tensor | None = None


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
        feature_dropout: dropout on the annotation vectors during teacher-forced training (not in the
            paper; a frozen encoder's 6,000 Flickr8k grids are otherwise memorised within a few epochs).
        pad_id: id of <pad> (its embedding stays zero).
    """

    # Whether a step without autograd runs its LSTM cell (and, with projected values, the gate and the gate sums)
    # as one fused C kernel (captioner/kernels, float32 on the CPU); the PyTorch code in _recur is the reference
    # it is tested against (tests/test_kernels.py).
    fused_cell = True

    def __init__(self, vocab_size: int, feature_dim: int, embed_dim: int = 512,
                 hidden_dim: int = 512, attention_dim: int = 512, scorer: str = "additive",
                 attention: str = "soft", heads: int = 1, gate: str = "scalar",
                 dropout: float = 0.5, pad_id: int = 0, feature_dropout: float = 0.0) -> None:
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
        self.feature_dropout = nn.Dropout(feature_dropout)
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o

    @property
    def stochastic(self) -> bool:
        """True for hard attention: the only kind whose decoding mode matters."""
        return self.attention.stochastic

    def _mode(self, attention_mode: str) -> str:
        return resolve_mode(attention_mode, self.stochastic)

    def init_state(self, grid: Tensor) -> tuple[Tensor, ...]:
        """(h_0, c_0, *attention memory) for grid (B, L, D); every tensor has dim 0 = B."""
        mean = grid.mean(dim=1)  # (B, D)
        return (self.init_h(mean), self.init_c(mean), *self.attention.prepare(grid))

    # Beam search decodes from projected values (expand_state) when it pays: multiplying each image's L
    # annotation vectors once by the weights that read the context costs 2·L·Z·(4H + E) FLOPs and saves
    # 2·Z·(4H + E) per beam and word, so it pays when beams x words > L. With captions of about
    # `project_values_words` words and a 1.5x margin: from 4 beams on a 7x7 grid, 15 on a 14x14 one.
    project_values_words = 20

    def _projects_values(self, beams: int, locations: int) -> bool:
        return beams * self.project_values_words >= 1.5 * locations

    def expand_state(self, state: tuple[Tensor, ...], beams: int) -> tuple[Tensor, ...]:
        """`beams` consecutive rows per image for beam search (its `expand`): h and c are repeated;
        the attention memory stays at one row per image when the attention reads it for a group of
        queries (then it is neither copied nor reordered: beams never leave their image).

        Without autograd and with enough beams (_projects_values), the values are replaced by
        values @ [W_ih,z; L_z]^T (B, L, 4H + E): the context z = sum_i alpha_i a_i (or a_s) only ever enters
        the LSTM and the deep output linearly, and beta_t is a scalar, so (beta sum_i alpha_i a_i) W =
        beta sum_i alpha_i (a_i W). The state is then a ProjectedState; step() reads it the same way.
        """
        h, c, *memory = state
        if not self.attention.grouped_queries:
            memory = [m.repeat_interleave(beams, dim=0) for m in memory]  # (B*K, ...)
        expanded = (h.repeat_interleave(beams, dim=0), c.repeat_interleave(beams, dim=0), *memory)
        if (not torch.is_grad_enabled() and not isinstance(state, ProjectedState)
                and self._reads_context_linearly() and self._projects_values(beams, memory[0].shape[1])):
            values, prepared = memory
            E = self.embedding.embedding_dim
            weight = torch.cat([self.lstm.weight_ih[:, E:], self.out_z.weight])  # (4H + E, Z)
            return ProjectedState((*expanded[:2], values @ weight.t(), prepared))  # values (B, L, 4H + E)
        return expanded

    def _reads_context_linearly(self) -> bool:
        """Whether z only enters through linear maps after a scalar gate (see expand_state)."""
        return isinstance(self.attention, SoftAttention) and (self.gate is None or self.gate.out_features == 1)

    # Form the LSTM weights' gradients once per sequence, not once per step (models/deferred.py); False
    # runs the plain per-step autograd path, which tests/test_fast_paths.py compares against.
    defer_weight_grads = True

    def _hidden_weight(self) -> tuple[Tensor, Tensor | None, int]:
        """Every weight that reads h_{t-1}, stacked: weight_hh (4H, H), the attention's query projection
        (A, H) when it exposes one, the gate (1 or Z, H); so one matmul per step gives the LSTM's recurrent
        share, the projected query and the gate's logit. Returns (weight, bias of the stack or None, A).
        Without autograd the stack is column-major (_column_major); _step_weights caches it."""
        query = self.attention.query_weight
        parts = [self.lstm.weight_hh] + ([query] if query is not None else []) + \
                ([self.gate.weight] if self.gate is not None else [])
        A = 0 if query is None else query.shape[0]
        weight = parts[0] if len(parts) == 1 else torch.cat(parts)
        if not torch.is_grad_enabled():
            weight = _column_major(weight)
        if self.gate is None:
            return weight, None, A
        # zeros for the LSTM and query rows (their biases live elsewhere or nowhere)
        bias = torch.cat([self.gate.bias.new_zeros(weight.shape[0] - self.gate.out_features), self.gate.bias])
        return weight, bias, A

    def _step_weights(self) -> "_LoopWeights":
        """The decoder's per-step weights for one sequence (deferred gradients, models/deferred.py). Without
        autograd they are built once per set of weights (step() runs once per word) and keep their MKL
        packings (StepWeight)."""
        if torch.is_grad_enabled():
            return self._build_step_weights()
        return self._cached("step_weights", list(self.parameters()), self._build_step_weights)

    def _build_step_weights(self) -> "_LoopWeights":
        E = self.embedding.embedding_dim
        weight_ih = self.lstm.weight_ih if torch.is_grad_enabled() else _column_major(self.lstm.weight_ih)
        word, context = step_weights(weight_ih, (E, self.lstm.input_size - E), self.defer_weight_grads)
        weight, bias, A = self._hidden_weight()
        (hidden,) = step_weights(weight, None, self.defer_weight_grads)
        return _LoopWeights(word, context, hidden, bias, A)

    def _cached(self, name: str, tensors: list[Tensor], build: Callable[[], Any]) -> Any:
        """build() cached under ``name`` until one of ``tensors`` is replaced or changed in place, or any
        optimizer steps. For inference only. A tensor's _version counts in-place updates (load_state_dict,
        p.add_()), but fused optimizer kernels (Adam(fused=True)) do not bump it: the count of optimizer
        steps (_OPTIMIZER_STEPS, a global post-step hook) covers those."""
        key = (_OPTIMIZER_STEPS[0], *((t.data_ptr(), t._version) for t in tensors))
        cache = self.__dict__.setdefault("_inference_cache", {})
        if name not in cache or cache[name][0] != key:
            cache[name] = (key, build())
        return cache[name][1]

    def _word_gate_table(self) -> Tensor:
        """(V, 4H): every word's share of the LSTM gates (E y W_ih,y^T + both biases), for inference, where a
        step then gathers N rows instead of multiplying (N, E) by (E, 4H). Built once per set of weights."""
        E = self.embedding.embedding_dim
        return self._cached("word_gates", [self.embedding.weight, self.lstm.weight_ih, self.lstm.bias_ih,
                                           self.lstm.bias_hh],
                            lambda: F.linear(self.embedding.weight, self.lstm.weight_ih[:, :E],
                                             self.lstm.bias_ih + self.lstm.bias_hh))

    def _word_gates(self, emb: Tensor, word: StepWeight) -> Tensor:
        """The word-embedding share of the LSTM gates, both biases included: emb (..., E) -> (..., 4H)."""
        gates = word.addmm(self.lstm.bias_ih + self.lstm.bias_hh, emb.reshape(-1, emb.shape[-1]))
        return gates.view(*emb.shape[:-1], -1)

    def _recur(self, word_gates: Tensor, h: Tensor, c: Tensor, memory: tuple[Tensor, ...], mode: str,
               weights: "_LoopWeights", expectation_mask: Tensor | None = None, projected: bool = False):
        """One step of Eq. (1)-(6): attend with h_{t-1}, gate, LSTM. Returns (h, c, z, read).

        word_gates (N, 4H) is the embedding's share of the LSTM gates (see _word_gates). With ``projected``
        the memory's values are ProjectedState's, and the returned z is already L_z z (for _deep_output).
        """
        H = h.shape[1]
        base = weights.hidden_bias if weights.hidden_bias is not None else h.new_zeros(())
        from_h = weights.hidden.addmm(base, h)  # (N, 4H + A + gate): h_{t-1} times every weight that reads it
        # split, not slices: one backward that concatenates the parts' gradients instead of a zero-filled
        # full-width gradient per slice
        recurrent, query, gate_logit = from_h.split([4 * H, weights.query_size, from_h.shape[1] - 4 * H
                                                     - weights.query_size], dim=1)  # (N, 4H), (N, A), (N, 1 or 0)
        extra = {"projected_query": query} if weights.query_size else {}
        read = self.attention(h, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic, **extra)
        z = read.context  # (N, Z)
        fused = self.fused_cell and kernels.lstm_cell_applies(word_gates, recurrent, z, c)
        if projected and fused:  # all of the branch below and the cell in one pass (kernels.lstm_cell)
            h, c, z = kernels.lstm_cell(word_gates, c, recurrent, z, gate_logit if self.gate is not None else None)
            return h, c, z, read
        if self.gate is not None:
            z = torch.sigmoid(gate_logit) * z  # beta_t z_t, §4.2.1
        if projected:  # z is (N, 4H + E): [W_ih,z z; L_z z]
            z_gates, z = z.split([4 * H, z.shape[1] - 4 * H], dim=1)  # (N, 4H), (N, E)
            gates = (word_gates + recurrent).add_(z_gates)  # (N, 4H)
        else:
            gates = weights.context.addmm(word_gates + recurrent, z)  # (N, 4H), order i, f, g, o
        if fused:
            h, c, _ = kernels.lstm_cell(gates, c)
            return h, c, z, read
        i, f, g, o = gates.chunk(4, dim=1)  # 4 x (N, H)
        c = torch.addcmul(torch.sigmoid(f) * c, torch.sigmoid(i), torch.tanh(g))  # (N, H)
        h = torch.sigmoid(o) * torch.tanh(c)  # (N, H)
        return h, c, z, read

    def _deep_features(self, emb: Tensor, h: Tensor, z: Tensor, projected: bool = False) -> Tensor:
        """Eq. (7) before L_o: dropout(E y_{t-1} + L_h h_t + L_z z_t), any leading shape (``projected``: z is L_z z)."""
        # Sums in place into the fresh L_h output (no temporaries of the full (B, T-1, E) size).
        return self.dropout(self.out_h(h).add_(z if projected else self.out_z(z)).add_(emb))

    def _deep_output(self, emb: Tensor, h: Tensor, z: Tensor, projected: bool = False, bias: bool = True) -> Tensor:
        """Eq. (7): L_o(E y_{t-1} + L_h h_t + L_z z_t); without L_o's bias when ``bias`` is False (inference only:
        a search's Logits then add it as they read the logits)."""
        features = self._deep_features(emb, h, z, projected)
        if torch.is_grad_enabled():
            if not bias:
                raise RuntimeError("_deep_output(bias=False) is for inference")
            return self.out(features)
        # inference: L_o packed once per set of weights and row count (StepWeight), or column-major
        out = self._cached("out", [self.out.weight], lambda: StepWeight(_column_major(self.out.weight)))
        return out.addmm(self.out.bias, features) if bias else out.mm(features)

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
        grid_s = self.feature_dropout(grid.index_select(0, order))  # (B, L, D); identity in eval mode
        emb_s = emb.index_select(0, order)  # (B, T-1, E)
        step_weights = self._step_weights()
        if torch.is_grad_enabled():  # (without autograd the weights are the cached ones that decoding shares)
            longest_run = max(len(list(run)) for _, run in itertools.groupby(active))  # steps at one batch size
            step_weights.hidden.packing = step_weights.context.packing = longest_run >= StepWeight.PACK_MIN_RUN
        word_gates = self._word_gates(emb_s, step_weights.word)  # (B, T-1, 4H) for all steps at once
        mask_s = None if expectation_mask is None else expectation_mask.index_select(0, order)
        h, c, *memory = self.init_state(grid_s)

        # unbind, not emb_s[:, t]: a slice per step would cost a full-size zero gradient per step.
        gate_steps = word_gates.unbind(1)  # T-1 x (B, 4H)
        # Per-step results are kept packed (time-major, active rows only) and scattered into
        # (B, T-1, *) once after the loop: no per-step padding kernels.
        hs, zs, alphas, log_probs, entropies = [], [], [], [], []
        shared = [SharedRows(m) for m in memory]  # read through row prefixes as captions end
        for t, n in enumerate(active):
            if n == 0:
                break
            if n < h.shape[0]:  # shrink to the n captions still running
                h, c = h[:n], c[:n]
                memory = [m.prefix(n) for m in shared]
                if mask_s is not None:
                    mask_s = mask_s[:n]
            gates_t = gate_steps[t] if n == B else gate_steps[t][:n]  # (n, 4H)
            h, c, z, read = self._recur(gates_t, h, c, memory, mode, step_weights, mask_s)
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

        # Eq. (7) on the real steps only, in the packed order; L_o (one matmul for all of them, none on padding)
        # runs in the loss, fused with the cross-entropy (DecoderOutput.output_weight).
        emb_packed = emb.reshape(B * (T - 1), -1).index_select(0, dest)  # (R, E)
        features = self._deep_features(emb_packed, torch.cat(hs), torch.cat(zs))  # (R, E)
        bias = self.out.bias
        return DecoderOutput(
            packed_features=features,
            output_weight=self.out.weight.view_as(self.out.weight),
            output_bias=None if bias is None else bias.view_as(bias),
            rows=dest,
            alphas=scatter(alphas),
            log_probs=scatter(log_probs) if log_probs else None,
            entropies=scatter(entropies) if entropies else None,
            mask=mask,
        )

    def sample(self, grid: Tensor, samples: int, start_id: int, end_id: int, max_length: int,
               attention_mode: str = "sample", forbid_ids: tuple[int, ...] = (), greedy: bool = False,
               generator: torch.Generator | None = None) -> SampleOutput:
        """Draw ``samples`` captions per image (rows i*samples .. i*samples+samples-1 belong to image i),
        keeping the graph: the gradient of Σ_t log p(w_t) (+ log p(s_t) for hard attention) is the
        REINFORCE gradient of self-critical training (losses.scst_loss).

        ``forbid_ids`` (e.g. <pad>, <start>, <unk>) get probability 0: the policy being trained is the
        masked one. ``greedy`` takes each step's arg-max word instead (the Rennie et al. baseline). The
        deep output's dropout is active in training mode, with the same mask for the draw and the
        gradient (one forward), so the estimate stays on-policy.
        """
        mode = self._mode(attention_mode)
        forbid = sorted(set(forbid_ids) | {self.pad_id, start_id})
        state = self.expand_state(self.init_state(grid), samples)  # without autograd it may be a ProjectedState
        projected = isinstance(state, ProjectedState)
        h, c, *memory = state  # h, c: (N, H), N = B * samples
        N = h.shape[0]
        tokens = torch.full((N,), start_id, dtype=torch.long, device=grid.device)
        running = torch.ones(N, dtype=torch.bool, device=grid.device)
        words, word_lp, loc_lp, alphas, loc_h = [], [], [], [], []
        step_weights = self._step_weights()
        for _ in range(max_length):
            emb = self.embedding(tokens)  # (N, E)
            h, c, z, read = self._recur(self._word_gates(emb, step_weights.word), h, c, memory, mode, step_weights,
                                        projected=projected)
            logits = self._deep_output(emb, h, z, projected)  # (N, V)
            logits = logits.index_fill(1, torch.tensor(forbid, device=logits.device), -math.inf)
            log_p = F.log_softmax(logits.float(), dim=-1)  # (N, V)
            if greedy:
                tokens = log_p.argmax(dim=-1)
            else:
                tokens = torch.multinomial(log_p.detach().exp(), 1, generator=generator).squeeze(1)  # (N,)
            live = running.to(log_p.dtype)
            word_lp.append(log_p.gather(1, tokens.unsqueeze(1)).squeeze(1) * live)
            if read.log_prob is not None:
                loc_lp.append(read.log_prob.float() * live)
            if read.entropy is not None:
                loc_h.append(read.entropy.float() * live)
            alphas.append(read.alpha.detach() * live.unsqueeze(1))
            words.append(tokens.masked_fill(~running, self.pad_id))
            running = running & (tokens != end_id)
            if not bool(running.any()):
                break
        tokens_out = torch.stack(words, dim=1)  # (N, T)
        lengths = (tokens_out != self.pad_id).sum(dim=1)  # (N,): <pad> is never drawn
        return SampleOutput(tokens=tokens_out, lengths=lengths, word_log_probs=torch.stack(word_lp, dim=1),
                            location_log_probs=torch.stack(loc_lp, dim=1) if loc_lp else None,
                            alphas=torch.stack(alphas, dim=1),
                            location_entropies=torch.stack(loc_h, dim=1) if loc_h else None)

    def step(self, tokens: Tensor, state: tuple[Tensor, ...], attention_mode: str = "soft"
             ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """One word for N states: tokens (N,) -> (log_probs (N, V), alpha (N, L), new state).

        The attention memory in `state` may hold N / G rows (one per image, see expand_state).
        """
        log_probs, alpha, _, state = self.step_with_location(tokens, state, attention_mode)
        return log_probs, alpha, state

    def step_with_location(self, tokens: Tensor, state: tuple[Tensor, ...], attention_mode: str = "soft",
                           dense: bool = True) -> tuple["Tensor | Logits", Tensor, Tensor | None, tuple[Tensor, ...]]:
        """step() and the grid cell each row read: (log_probs, alpha, location (N,) long, new state).

        location is the sampled (or arg-max) cell in hard attention's "sample"/"argmax" modes, which
        in "sample" mode need not be alpha's arg-max; None in the other modes. With ``dense=False`` the
        log-probs come as search.Logits (the raw logits), which the searches read without forming the
        (N, V) log-softmax.
        """
        mode = self._mode(attention_mode)
        projected = isinstance(state, ProjectedState)
        h, c, *memory = state
        emb = self.embedding(tokens)  # (N, E)
        step_weights = self._step_weights()
        if torch.is_grad_enabled():
            word_gates = self._word_gates(emb, step_weights.word)  # (N, 4H)
        else:
            word_gates = self._word_gate_table().index_select(0, tokens)  # (N, 4H): a gather, no matmul
        h, c, z, read = self._recur(word_gates, h, c, memory, mode, step_weights, projected=projected)
        if dense:
            log_probs = F.log_softmax(self._deep_output(emb, h, z, projected), dim=-1)  # (N, V)
        elif torch.is_grad_enabled():
            log_probs = Logits(self._deep_output(emb, h, z, projected))  # (N, V), normalised by the search
        else:  # L_o's bias added by the search as it reads the words (no (N, V) pass of its own)
            log_probs = Logits(self._deep_output(emb, h, z, projected, bias=False), self.out.bias)
        return log_probs, read.alpha, read.index, type(state)((h, c, *memory))
