"""What search, SCST, the losses and the overlays need from a caption decoder: the contract and its output types.

A decoder reads an annotation grid (B, L, D) (Xu et al. 2015, §3.1.1) and predicts words. Everything outside
the decoder talks to it through these members of ``CaptionDecoder`` and nothing else:

    forward(grid, captions, lengths, attention_mode, expectation_mask) -> DecoderOutput
        teacher forcing, for the cross-entropy and attention losses (training/losses.py, training/loop.py). The
        output layer's inputs come packed, real steps only (``packed_features`` + ``rows``), and L_o's parameters
        beside them, so the loss runs the output layer fused with the cross-entropy and never on padding.
    init_state(grid) -> state;  expand_state(state, beams) -> state
        a state is a (nested) tuple of tensors whose dim 0 is the row; search only reorders and expands it
        (search.py). expand_state may keep per-image tensors at B rows while per-beam ones get B*K.
    step_with_location(tokens, state, attention_mode, dense) -> (log-probs or search.Logits, alpha (N, L),
        location (N,) or None, state)
        one word for N rows: what greedy and beam search drive, and where the overlays' per-word maps come from.
    sample(grid, samples, start_id, end_id, max_length, ...) -> SampleOutput
        captions drawn with their log-probabilities, differentiable (self-critical training, scst.py).
    stochastic
        True when the decoder samples where it looks (hard attention): the decoding mode then matters.
    static_rows
        True when its decoding step wants the same rows at every step (beam search keeps retired images' rows).
    vocab_size, pad_id, attention_kind (the attention whose maps the overlays show, recorded in outputs)

A decoder implements ``forward``, ``init_state`` and ``next_logits`` (one step's raw logits and attention
read); the base class derives ``step_with_location``, ``sample`` and ``expand_state`` from them. A
fast implementation may override any of them, as long as it computes the same thing.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner.decoding.search import Logits, map_state
from captioner.models.attention import AttentionOutput, check_read, draw_index

State = Any  # a (nested) tuple of tensors whose dim 0 is the row (search.State)


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
    log_probs: (B, T-1) log p(s_t) of the attended locations (hard attention in the one-cell modes,
        "sample"/"argmax"/"gumbel"; 0 at padded steps and for images under expectation_mask), else None.
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

    @classmethod
    def from_padded(cls, features: Tensor, alphas: Tensor, mask: Tensor, out: nn.Linear,
                    log_probs: Tensor | None = None, entropies: Tensor | None = None) -> "DecoderOutput":
        """Pack per-step results computed over the whole padded batch: features (B, S, E), alphas (B, S, L),
        log_probs and entropies (B, S) or None, mask (B, S); padded steps are zeroed."""
        B, S, E = features.shape
        rows = mask.reshape(-1).nonzero().squeeze(1)  # (R,) real steps, row-major
        real = mask.to(alphas.dtype)
        bias = out.bias
        return cls(packed_features=features.reshape(B * S, E).index_select(0, rows),
                   output_weight=out.weight.view_as(out.weight),
                   output_bias=None if bias is None else bias.view_as(bias),
                   rows=rows, alphas=alphas * real.unsqueeze(2), mask=mask,
                   log_probs=None if log_probs is None else log_probs * real,
                   entropies=None if entropies is None else entropies * real)

    @classmethod
    def from_packed(cls, features: Tensor, out: nn.Linear, batch: "SortedBatch", mask: Tensor,
                    reads: list[AttentionOutput]) -> "DecoderOutput":
        """The output of a forward over a SortedBatch: features (R, E) packed in its order, the reads of its
        steps (n_t rows each), mask (B, T-1)."""
        bias = out.bias
        return cls(packed_features=features, output_weight=out.weight.view_as(out.weight),
                   output_bias=None if bias is None else bias.view_as(bias), rows=batch.dest,
                   alphas=batch.scatter([r.alpha for r in reads]),
                   log_probs=batch.scatter([r.log_prob for r in reads if r.log_prob is not None]),
                   entropies=batch.scatter([r.entropy for r in reads if r.entropy is not None]), mask=mask)


@dataclass
class SortedBatch:
    """Teacher forcing over captions sorted by length, longest first, so that the captions still running at step
    t are a prefix of the rows (``active[t]`` of them) and the recurrence can shrink to them; per-step results
    stay packed, time-major, running captions only (the fast decoders' forward).

    order: (B,) the sorted rows' original indices. active: T-1 counts of running captions, one per step.
    dest: (R,) the flat index b * (T-1) + t, in the unsorted (B, T-1) layout, of every packed row."""

    order: Tensor
    active: list[int]
    dest: Tensor

    @classmethod
    def of(cls, lengths: Tensor, T: int) -> "SortedBatch":
        """Captions (B, T) with lengths (B,) (<start> and <end> included)."""
        steps = lengths - 1  # (B,) words to predict per caption
        order = torch.argsort(steps, descending=True, stable=True)  # (B,)
        steps_s = steps.index_select(0, order)
        live = steps_s.unsqueeze(1) > torch.arange(T - 1, device=steps.device)  # (B, T-1) sorted rows
        dest = order.unsqueeze(1) * (T - 1) + torch.arange(T - 1, device=order.device)  # (B, T-1) sorted rows
        return cls(order=order, active=live.sum(0).tolist(), dest=dest.t()[live.t()])

    def scatter(self, seq: list[Tensor]) -> Tensor | None:
        """Per-step packed results (time-major, n_t rows each) -> (B, T-1, *), zeros at padded steps; None
        for no steps."""
        if not seq:
            return None
        packed = torch.cat(seq, dim=0)  # (R, *)
        B, S = self.order.shape[0], len(self.active)
        out = packed.new_zeros(B * S, *packed.shape[1:]).index_copy(0, self.dest, packed)
        return out.view(B, S, *packed.shape[1:])

    def step_rows(self, dropout_rows: Tensor | None) -> Tensor | None:
        """The dropout rows (shared_dropout) of every packed (caption, step) row: copies of a caption (equal
        ``dropout_rows`` (B,)) share one mask per step."""
        if dropout_rows is None:
            return None
        S = len(self.active)
        return dropout_rows.to(self.dest.device).index_select(0, self.dest // S) * S + self.dest % S


def shared_dropout(layer: nn.Dropout, x: Tensor, rows: Tensor | None) -> Tensor:
    """``layer(x)`` for x (N, *), with one mask per value of rows (N,) long (rows of equal value share it);
    with rows None, or outside training, exactly ``layer(x)``."""
    if rows is None or not layer.training or layer.p == 0.0:
        return layer(x)
    if layer.p == 1.0:
        return x * 0.0
    keep = torch.empty((int(rows.max()) + 1, *x.shape[1:]), dtype=x.dtype, device=x.device).bernoulli_(1.0 - layer.p)
    return x * keep.index_select(0, rows).div_(1.0 - layer.p)


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


def caption_mask(captions: Tensor, lengths: Tensor) -> Tensor:
    """(B, T-1) bool, True at the steps that predict a real token of captions (B, T) (<start> w.. <end> <pad>..)
    with lengths (B,) tokens each (<start> and <end> included); lengths outside [2, T] are an error."""
    T = captions.shape[1]
    steps = lengths.to(captions.device) - 1  # (B,) words to predict per caption
    shortest, longest = int(steps.min()), int(steps.max())
    if longest > T - 1 or shortest < 1:
        raise ValueError(f"lengths must lie in [2, T={T}] (<start> and <end> included); "
                         f"got {shortest + 1}..{longest + 1}")
    return torch.arange(T - 1, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T-1)


class SampleDraws:
    """The bookkeeping of sample(): per step, mask the forbidden words, draw (or take the arg-max), and keep the
    word, its log-probability (0 once the caption ended), the location read and alpha; output() stacks them.

    Whether every caption has ended is a host read, which on an accelerator waits for all the queued work: draw()
    asks it every ``CHECK_EVERY[device type]`` steps (every step on the CPU, where it costs nothing), and output()
    drops the steps drawn after the last caption ended (<pad> words, zero log-probabilities), so the result is the
    same as when asked at every step. The banned ids are copied to the device once, here."""

    CHECK_EVERY = {"cpu": 1}  # steps between two reads of "every caption has ended", per device type
    CHECK_EVERY_DEFAULT = 4  # on the others (CUDA, ...)

    def __init__(self, rows: int, start_id: int, end_id: int, pad_id: int, forbid_ids: tuple[int, ...],
                 greedy: bool, generator: torch.Generator | None, device: torch.device,
                 temperature: float = 1.0) -> None:
        if not temperature > 0:
            raise ValueError(f"sampling temperature must be > 0, got {temperature!r}")
        self.end_id, self.pad_id, self.greedy, self.generator = end_id, pad_id, greedy, generator
        self.temperature = float(temperature)
        device = torch.device(device)
        forbid = sorted(set(forbid_ids) | {pad_id, start_id})  # <pad> and <start> are never words
        self.forbid = torch.tensor(forbid, dtype=torch.long, device=device)  # (b,)
        self.check_every = self.CHECK_EVERY.get(device.type, self.CHECK_EVERY_DEFAULT)
        self.tokens = torch.full((rows,), start_id, dtype=torch.long, device=device)
        self.running = torch.ones(rows, dtype=torch.bool, device=device)
        self.live_steps = torch.zeros((), dtype=torch.long, device=device)  # steps some caption was running at
        self.words: list[Tensor] = []
        self.word_lp: list[Tensor] = []
        self.loc_lp: list[Tensor] = []
        self.loc_h: list[Tensor] = []
        self.alphas: list[Tensor] = []

    def draw(self, logits: Tensor, read: AttentionOutput) -> bool:
        """Next word of every row from its logits (N, V); False once every caption has ended (known at the steps
        that read it, every check_every)."""
        logits = logits.index_fill(1, self.forbid.to(logits.device), -math.inf)
        if self.temperature != 1.0:  # the policy is softmax(logits / T): its log-probabilities are the gradient's
            logits = logits / self.temperature
        log_p = F.log_softmax(logits.float(), dim=-1)  # (N, V)
        if self.greedy:
            tokens = log_p.argmax(dim=-1)
        else:  # a row of NaNs draws too (draw_index), and its word's log-probability stays non-finite
            tokens = draw_index(log_p.detach().exp(), self.generator)  # (N,)
        live = self.running.to(log_p.dtype)
        self.word_lp.append(log_p.gather(1, tokens.unsqueeze(1)).squeeze(1) * live)
        if read.log_prob is not None:
            self.loc_lp.append(read.log_prob.float() * live)
        if read.entropy is not None:
            self.loc_h.append(read.entropy.float() * live)
        self.alphas.append(read.alpha.detach() * live.unsqueeze(1))
        self.words.append(tokens.masked_fill(~self.running, self.pad_id))
        if self.check_every > 1:
            self.live_steps = self.live_steps + self.running.any()  # no host read: a device counter
        self.running = self.running & (tokens != self.end_id)
        self.tokens = tokens
        if len(self.words) % self.check_every:
            return True
        return bool(self.running.any())  # the one host read, every check_every steps

    def output(self) -> SampleOutput:
        T = len(self.words)
        if self.check_every > 1:  # the steps after the last caption ended (<pad> only) are dropped
            T = int(self.live_steps)
        tokens = torch.stack(self.words[:T], dim=1)  # (N, T)
        lengths = (tokens != self.pad_id).sum(dim=1)  # (N,): <pad> is never drawn

        def stacked(steps: list[Tensor]) -> Tensor | None:
            return torch.stack(steps[:T], dim=1) if steps else None  # (N, T, ...)

        return SampleOutput(tokens=tokens, lengths=lengths, word_log_probs=stacked(self.word_lp),
                            location_log_probs=stacked(self.loc_lp), alphas=stacked(self.alphas),
                            location_entropies=stacked(self.loc_h))


class CaptionDecoder(nn.Module, ABC):
    """The decoder contract (module docstring). Subclasses set ``vocab_size``, ``pad_id`` and ``attention_kind``
    and implement ``forward``, ``init_state`` and ``next_logits``; a registered family's ``model.decoder``
    dataclass names its class (family.py, ``IMPLEMENTATION``)."""

    vocab_size: int
    pad_id: int
    attention_kind: str
    # Whether its decoding step wants the same rows at every step (a compiled step, show_attend_tell_compiled.py):
    # beam search then keeps a retired image's rows in the batch (search's static_rows)
    static_rows: bool = False

    @property
    def stochastic(self) -> bool:
        """True when the decoder samples where it looks (hard attention): the only kind whose decoding mode
        matters (attention.check_read)."""
        return False

    @property
    def one_cell(self) -> bool:
        """Whether a soft decoder can read one cell per word on request ("argmax"/"sample"; check_read)."""
        return False

    def _mode(self, attention_mode: str) -> str:
        return check_read(attention_mode, self.stochastic, self.one_cell)

    def _sample_mode(self, attention_mode: str | None) -> str:
        """sample()'s mode: None reads as the decoder was trained ("sample" for hard attention, else "soft")."""
        return self._mode(attention_mode or ("sample" if self.stochastic else "expectation"))

    @abstractmethod
    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "expectation",
                expectation_mask: Tensor | None = None, dropout_rows: Tensor | None = None,
                temperature: float = 1.0) -> DecoderOutput:
        """Teacher-forced decoding of captions (B, T) = <start> w_1 .. w_n <end> <pad>.. with lengths (B,) = n + 2
        over grid (B, L, D). expectation_mask (B,) bool: hard attention reads the expected context there.
        dropout_rows (B,) long: rows with the same value draw the same dropout masks (``shared_dropout``: the K
        copies of a caption in the leave-one-out estimator, whose advantage should carry only the cells).
        temperature: τ of hard attention's "gumbel" read (training/objectives/location.py); no other mode reads it.
        A family whose section sets SCHEDULED_SAMPLING also takes ``sample_prob`` (scheduled sampling: the share of
        input words after the first drawn from its own previous output; family.py)."""

    @abstractmethod
    def init_state(self, grid: Tensor) -> State:
        """The state before the first word for grid (B, L, D); every tensor has dim 0 = B."""

    @abstractmethod
    def next_logits(self, tokens: Tensor, state: State, attention_mode: str) -> tuple[Tensor, AttentionOutput, State]:
        """One word for N rows: tokens (N,) -> (logits (N, V), the step's attention read (alpha (N, L), and for
        hard attention log_prob, entropy, index), new state). ``attention_mode`` is already resolved."""

    def expand_state(self, state: State, beams: int) -> State:
        """``beams`` consecutive rows per image (search's ``expand``): every tensor repeated."""
        return map_state(state, lambda x: x.repeat_interleave(beams, dim=0))

    def step_with_location(self, tokens: Tensor, state: State, attention_mode: str = "expectation",
                           dense: bool = True) -> tuple["Tensor | Logits", Tensor, Tensor | None, State]:
        """One word for N states: (log_probs (N, V), alpha (N, L), location (N,) long or None, new state).

        location is the cell read in the one-cell modes "sample"/"argmax" (in "sample" mode not necessarily
        alpha's arg-max), else None. ``attention_mode`` is read as given: a decode checks it once
        (Captioner.check_decode_options), not at every step. With ``dense=False`` the log-probs come as search.Logits
        (the raw logits), which the searches read without forming the (N, V) log-softmax.
        """
        logits, read, state = self.next_logits(tokens, state, attention_mode)
        log_probs = F.log_softmax(logits, dim=-1) if dense else Logits(logits)
        return log_probs, read.alpha, read.index, state

    def sample(self, grid: Tensor, samples: int, start_id: int, end_id: int, max_length: int,
               attention_mode: str | None = None, forbid_ids: tuple[int, ...] = (), greedy: bool = False,
               generator: torch.Generator | None = None, temperature: float = 1.0) -> SampleOutput:
        """Draw ``samples`` captions per image (rows i*samples .. i*samples+samples-1 belong to image i),
        keeping the graph: the gradient of Σ_t log p(w_t) (+ log p(s_t) for hard attention) is the
        REINFORCE gradient of self-critical training (losses.scst_loss).

        ``forbid_ids`` (e.g. <unk>; <pad> and <start> always) get probability 0: the policy being trained is
        the masked one. ``greedy`` takes each step's arg-max word instead (the Rennie et al. baseline).
        Dropout is active in training mode, with the same mask for the draw and the gradient (one forward),
        so the estimate stays on-policy. ``attention_mode`` None: hard attention samples its cells, soft
        attention reads softly (each as it was trained). ``temperature`` T draws the words from softmax(logits / T),
        and their log-probabilities are that distribution's (below 1: sharper; the greedy word is the same).
        """
        mode = self._sample_mode(attention_mode)
        state = self.expand_state(self.init_state(grid), samples)
        draws = SampleDraws(grid.shape[0] * samples, start_id, end_id, self.pad_id, forbid_ids, greedy, generator,
                            grid.device, temperature)
        for _ in range(max_length):
            logits, read, state = self.next_logits(draws.tokens, state, mode)
            if not draws.draw(logits, read):
                break
        return draws.output()


class GridAttentionDecoder(CaptionDecoder):
    """A decoder that reads the grid through one attention module of models/attention.py (``self.attention``):
    hard, and able to read one cell, as that module is (Show-Attend-Tell's LSTM, Up-Down)."""

    attention: nn.Module

    @property
    def stochastic(self) -> bool:
        """True for hard attention: the only kind whose decoding mode matters."""
        return self.attention.stochastic

    @property
    def one_cell(self) -> bool:
        """Soft attention over the raw grid or key-value attention can read one cell per word on request."""
        return self.attention.one_cell
