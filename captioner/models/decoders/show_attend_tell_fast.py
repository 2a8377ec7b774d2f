"""The fast path of the Show-Attend-Tell decoder: the same equations, parameters and state_dict as
``ShowAttendTellDecoder`` (show_attend_tell.py, the reference), computed the way the training hot loop and
decoding want them.

Training: the attention keys are projected once per batch (attention.prepare), the word embeddings of all
steps are computed before the loop, and the deep output is applied after the loop to all steps at once. The
LSTM's input matmul is split the same way: its word-embedding part (plus both biases) runs for all steps in
one matmul before the loop. Each step then makes one matmul of h_{t-1} with every weight that reads it
(weight_hh, the scorer's query projection, the gate: see _hidden_weight), attends, adds beta_t z_t times its
weights and does the cell's elementwise math (nn.LSTMCell's parameters and gate order i, f, g, o). Under
autograd the per-step weights' gradients are formed once per sequence (captioner/fast/deferred.py). Captions are
sorted by length so the recurrence runs only the captions still going at each step (the active batch
shrinks); the output layer and the loss then run on the real steps only (DecoderOutput.packed_features),
never on padding, as one fused function (fast/token_nll.linear_token_nll).

Decoding (no autograd): a step gathers each word's share of the LSTM gates from a cached (V, 4H) table,
multiplies by cached column-major or MKL-packed weights (fast/inference_cache.py, fast/deferred.StepWeight), runs the
LSTM cell as one fused C kernel (captioner/fast/kernels), hands the search its raw logits with L_o's bias apart
(search.Logits), and beam search may read projected values (expand_state).

Every public method runs the reference's code instead under the reference switch (captioner/fast);
tests/test_fast_paths.py compares the two (losses, every parameter's gradient, decoded captions).

Compiled (``compile_steps``, ``train.compile``): teacher forcing and decoding read softly run one step of the
reference compiled by torch.compile over static shapes instead (show_attend_tell_compiled.py), for GPUs, where the
many small kernels of a step are launch-bound.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from captioner import fast
from captioner.decoding.search import Logits
from captioner.fast import kernels
from captioner.fast.deferred import SharedRows, StepWeight, step_weights
from captioner.fast.inference_cache import InferenceCache, column_major, module_cache
from captioner.models.attention import AttentionOutput, SoftAttention
from captioner.models.decoders.contract import (
    DecoderOutput,
    SampleDraws,
    SampleOutput,
    SortedBatch,
    State,
    caption_mask,
    shared_dropout,
)
from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder
from captioner.models.decoders.show_attend_tell_compiled import StaticSteps


class ProjectedState(tuple):
    """A decoder state (h, c, projected values, prepared keys) whose values were multiplied by the weights
    that read the context (FastShowAttendTellDecoder.expand_state). A tuple: search reorders it like any state."""


@dataclass
class _LoopWeights:
    """The per-step weights of one sequence: LSTM word and context blocks of weight_ih, and the stack of
    every weight reading h_{t-1} (FastShowAttendTellDecoder._hidden_weight) with its bias and query size."""

    word: StepWeight
    context: StepWeight
    hidden: StepWeight
    hidden_bias: Tensor | None
    query_size: int


class FastShowAttendTellDecoder(ShowAttendTellDecoder):
    """ShowAttendTellDecoder's fast path (module docstring); the same arguments and state_dict."""

    # Whether a step without autograd runs its LSTM cell (and, with projected values, the gate and the gate sums)
    # as one fused C kernel (captioner/fast/kernels, float32 on the CPU); the PyTorch code in _recur_fast is what it is
    # tested against (tests/test_kernels.py).
    fused_cell = True
    # Form the LSTM weights' gradients once per sequence, not once per step (fast/deferred.py); False
    # runs the plain per-step autograd path.
    defer_weight_grads = True
    # Beam search decodes from projected values (expand_state) when it pays: multiplying each image's L
    # annotation vectors once by the weights that read the context costs 2·L·Z·(4H + E) FLOPs and saves
    # 2·Z·(4H + E) per beam and word, so it pays when beams x words > L. With captions of about
    # `project_values_words` words and a 1.5x margin: from 4 beams on a 7x7 grid, 15 on a 14x14 one.
    project_values_words = 20
    # The step compiled over static shapes (show_attend_tell_compiled.py; compile_steps), or None: eager
    _compiled: StaticSteps | None = None

    @property
    def _inference(self) -> InferenceCache:
        """Weights restacked for decoding steps (not in the state_dict), made at the first decoding step."""
        return module_cache(self)

    # ------------------------------------------------------------------ the compiled step

    def compile_steps(self, mode: str, setting: str = "compile", backend: str = "inductor") -> None:
        """From now on teacher forcing and decoding, read softly, run the compiled step (show_attend_tell_compiled.py:
        ``mode`` "inductor" or "cudagraphs"; "off": eager again). ValueError, naming ``setting`` (the config key it
        came from), for hard attention and for CUDA graphs off CUDA. ``backend``: torch.compile's (tests)."""
        if mode == "off":
            self._compiled = None
            return
        if self.stochastic:
            raise ValueError(f"{setting}={mode}: hard attention samples where it reads; only soft reads are compiled")
        if self.sentinel is not None:
            raise ValueError(f"{setting}={mode}: the sentinel's read has no compiled step")
        device = self.embedding.weight.device
        if mode == "cudagraphs" and device.type != "cuda":
            raise ValueError(f"{setting}=cudagraphs: CUDA graphs need a CUDA device, the decoder is on {device}; "
                             "use inductor")
        self._compiled = StaticSteps(mode, backend)

    @property
    def static_rows(self) -> bool:
        """Whether decoding runs the compiled step, which wants the same rows at every step (contract.py)."""
        return self._compiled is not None and fast.enabled()

    # ------------------------------------------------------------------ state for search

    def _projects_values(self, beams: int, locations: int) -> bool:
        return beams * self.project_values_words >= 1.5 * locations

    def _reads_context_linearly(self) -> bool:
        """Whether z only enters through linear maps after a scalar gate (see expand_state)."""
        return (isinstance(self.attention, SoftAttention) and (self.gate is None or self.gate.out_features == 1)
                and self.sentinel is None)  # the sentinel's value W_v s_t is no weighted sum of the cells' values

    def expand_state(self, state: State, beams: int) -> State:
        """`beams` consecutive rows per image for beam search (its `expand`): h and c are repeated;
        the attention memory stays at one row per image (the attention reads it for a group of queries,
        attention.grouped_queries), so it is neither copied nor reordered: beams never leave their image.

        Without autograd and with enough beams (_projects_values), the values are replaced by
        values @ [W_ih,z; L_z]^T (B, L, 4H + E): the context z = sum_i alpha_i a_i (or a_s) only ever enters
        the LSTM and the deep output linearly, and beta_t is a scalar, so (beta sum_i alpha_i a_i) W =
        beta sum_i alpha_i (a_i W). The state is then a ProjectedState; step_with_location() reads it the same way.
        """
        if not fast.enabled():
            return super().expand_state(state, beams)
        if self._compiled is not None:  # raw values: the compiled step reads the plain state
            return self._compiled.expand(state, beams)
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

    # ------------------------------------------------------------------ weights, stacked and cached

    def _hidden_weight(self) -> tuple[Tensor, Tensor | None, int]:
        """Every weight that reads h_{t-1}, stacked: weight_hh (4H, H), the attention's query projection
        (A, H) when it exposes one, the gate (1 or Z, H); so one matmul per step gives the LSTM's recurrent
        share, the projected query and the gate's logit. Returns (weight, bias of the stack or None, A).
        Without autograd the stack is column-major (column_major); _step_weights caches it."""
        query = self.attention.query_weight
        parts = [self.lstm.weight_hh] + ([query] if query is not None else []) + \
                ([self.gate.weight] if self.gate is not None else [])
        A = 0 if query is None else query.shape[0]
        weight = parts[0] if len(parts) == 1 else torch.cat(parts)
        if not torch.is_grad_enabled():
            weight = column_major(weight)
        if self.gate is None:
            return weight, None, A
        # zeros for the LSTM and query rows (their biases live elsewhere or nowhere)
        bias = torch.cat([self.gate.bias.new_zeros(weight.shape[0] - self.gate.out_features), self.gate.bias])
        return weight, bias, A

    def _step_weights(self) -> _LoopWeights:
        """The decoder's per-step weights for one sequence (deferred gradients, fast/deferred.py). Without
        autograd they are built once per set of weights (step_with_location() runs once per word) and keep their MKL
        packings (StepWeight)."""
        if torch.is_grad_enabled():
            return self._build_step_weights()
        return self._inference.get("step_weights", list(self.parameters()), self._build_step_weights)

    def _build_step_weights(self) -> _LoopWeights:
        E = self.embedding.embedding_dim
        weight_ih = self.lstm.weight_ih if torch.is_grad_enabled() else column_major(self.lstm.weight_ih)
        word, context = step_weights(weight_ih, (E, self.lstm.input_size - E), self.defer_weight_grads)
        weight, bias, A = self._hidden_weight()
        (hidden,) = step_weights(weight, None, self.defer_weight_grads)
        return _LoopWeights(word, context, hidden, bias, A)

    def _word_gate_table(self) -> Tensor:
        """(V, 4H): every word's share of the LSTM gates (E y W_ih,y^T + both biases), for inference, where a
        step then gathers N rows instead of multiplying (N, E) by (E, 4H). Built once per set of weights."""
        E = self.embedding.embedding_dim
        return self._inference.get("word_gates", [self.embedding.weight, self.lstm.weight_ih, self.lstm.bias_ih,
                                                  self.lstm.bias_hh],
                                   lambda: torch.nn.functional.linear(self.embedding.weight, self.lstm.weight_ih[:, :E],
                                                                      self.lstm.bias_ih + self.lstm.bias_hh))

    def _word_gates(self, emb: Tensor, word: StepWeight) -> Tensor:
        """The word-embedding share of the LSTM gates, both biases included: emb (..., E) -> (..., 4H)."""
        gates = word.addmm(self.lstm.bias_ih + self.lstm.bias_hh, emb.reshape(-1, emb.shape[-1]))
        return gates.view(*emb.shape[:-1], -1)

    # ------------------------------------------------------------------ one step, the output layer

    def _recur_fast(self, word_gates: Tensor, h: Tensor, c: Tensor, memory: list[Tensor], mode: str,
                    weights: _LoopWeights, expectation_mask: Tensor | None = None, projected: bool = False,
                    temperature: float = 1.0, emb: Tensor | None = None
                    ) -> tuple[Tensor, Tensor, Tensor, AttentionOutput]:
        """One step of Eq. (1)-(6) (ShowAttendTellDecoder.recur): attend with h_{t-1}, gate, LSTM. Returns
        (h, c, z, read). word_gates (N, 4H) is the embedding's share of the LSTM gates (see _word_gates). With
        ``projected`` the memory's values are ProjectedState's, and the returned z is already L_z z."""
        H = h.shape[1]
        base = weights.hidden_bias if weights.hidden_bias is not None else h.new_zeros(())
        from_h = weights.hidden.addmm(base, h)  # (N, 4H + A + gate): h_{t-1} times every weight that reads it
        # split, not slices: one backward that concatenates the parts' gradients instead of a zero-filled
        # full-width gradient per slice
        recurrent, query, gate_logit = from_h.split([4 * H, weights.query_size, from_h.shape[1] - 4 * H
                                                     - weights.query_size], dim=1)  # (N, 4H), (N, A), (N, 1 or 0)
        extra = {"projected_query": query} if weights.query_size else {}
        if self.sentinel is not None:  # ``emb`` (N, E): the sentinel's gate reads the step's input word
            read = self.sentinel.read(self.attention.scorer, emb, h, c, memory, **extra)
        else:
            read = self.attention(h, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic,
                                  temperature=temperature, **extra)
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

    def _deep_features_fast(self, emb: Tensor, h: Tensor, z: Tensor, projected: bool = False,
                            dropout_rows: Tensor | None = None) -> Tensor:
        """Eq. (7) before L_o: dropout(E y_{t-1} + L_h h_t + L_z z_t), any leading shape (``projected``: z is L_z z;
        ``dropout_rows``: rows of equal value share a mask)."""
        # Sums in place into the fresh L_h output (no temporaries of the full (B, T-1, E) size).
        return shared_dropout(self.dropout, self.out_h(h).add_(z if projected else self.out_z(z)).add_(emb),
                              dropout_rows)

    def _deep_output_fast(self, emb: Tensor, h: Tensor, z: Tensor, projected: bool = False, bias: bool = True
                          ) -> Tensor:
        """Eq. (7): L_o(E y_{t-1} + L_h h_t + L_z z_t); without L_o's bias when ``bias`` is False (inference only:
        a search's Logits then add it as they read the logits)."""
        features = self._deep_features_fast(emb, h, z, projected)
        if torch.is_grad_enabled():
            if not bias:
                raise RuntimeError("_deep_output_fast(bias=False) is for inference")
            return self.out(features)
        # inference: L_o packed once per set of weights and row count (StepWeight), or column-major
        out = self._inference.get("out", [self.out.weight], lambda: StepWeight(column_major(self.out.weight)))
        return out.addmm(self.out.bias, features) if bias else out.mm(features)

    # ------------------------------------------------------------------ the contract

    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "expectation",
                expectation_mask: Tensor | None = None, dropout_rows: Tensor | None = None,
                temperature: float = 1.0, sample_prob: float = 0.0) -> DecoderOutput:
        """Teacher-forced decoding (contract.CaptionDecoder.forward) on the batch sorted by length. Scheduled
        sampling (``sample_prob`` > 0) runs the plain step-by-step forward: its input words are known only one
        step at a time (docs/training-options.md measures what that costs)."""
        if not fast.enabled() or sample_prob:
            return super().forward(grid, captions, lengths, attention_mode, expectation_mask, dropout_rows,
                                   temperature, sample_prob)
        if (self._compiled is not None and attention_mode == "expectation" and expectation_mask is None
                and dropout_rows is None):  # the soft read, every caption its own dropout masks: compiled
            return self._compiled.forward(self, grid, captions, lengths)
        mode = self._mode(attention_mode)
        mask = caption_mask(captions, lengths)  # (B, T-1)
        emb = self.embedding(captions[:, :-1])  # (B, T-1, E): all inputs at once
        # Sorted by length (longest first) so that at step t the active captions are a prefix.
        batch = SortedBatch.of(lengths.to(captions.device), captions.shape[1])
        order, active = batch.order, batch.active
        rows_s = None if dropout_rows is None else dropout_rows.index_select(0, order)
        grid_s = shared_dropout(self.feature_dropout, grid.index_select(0, order), rows_s)  # identity in eval mode
        weights = self._step_weights()
        if torch.is_grad_enabled():  # (without autograd the weights are the cached ones that decoding shares)
            longest_run = max(len(list(run)) for _, run in itertools.groupby(active))  # steps at one batch size
            weights.hidden.packing = weights.context.packing = longest_run >= StepWeight.PACK_MIN_RUN
        emb_s = emb.index_select(0, order)  # (B, T-1, E), sorted: the gates' input, and the sentinel's
        word_gates = self._word_gates(emb_s, weights.word)  # (B, T-1, 4H) for all steps
        mask_s = None if expectation_mask is None else expectation_mask.index_select(0, order)
        hs, zs, reads = self._sorted_steps(word_gates, self.init_state(grid_s), active, mode, weights, mask_s,
                                           temperature, emb_s if self.sentinel is not None else None)

        # Eq. (7) on the real steps only, in the packed order; L_o (one matmul for all of them, none on padding)
        # runs in the loss, fused with the cross-entropy (DecoderOutput.output_weight).
        emb_packed = emb.reshape(-1, emb.shape[2]).index_select(0, batch.dest)  # (R, E)
        features = self._deep_features_fast(emb_packed, torch.cat(hs), torch.cat(zs),
                                            dropout_rows=batch.step_rows(dropout_rows))  # (R, E)
        return DecoderOutput.from_packed(features, self.out, batch, mask, reads)

    def _sorted_steps(self, word_gates: Tensor, state: State, active: list[int], mode: str, weights: _LoopWeights,
                      expectation_mask: Tensor | None, temperature: float = 1.0, emb: Tensor | None = None
                      ) -> tuple[list[Tensor], list[Tensor], list[AttentionOutput]]:
        """The recurrence over captions sorted by length, step t on its active[t] captions (a prefix of the
        rows). Per-step results stay packed (time-major, active rows only): (h_t's, z_t's, reads)."""
        h, c, *memory = state
        B = h.shape[0]
        # unbind, not word_gates[:, t]: a slice per step would cost a full-size zero gradient per step.
        gate_steps = word_gates.unbind(1)  # T-1 x (B, 4H)
        emb_steps = emb.unbind(1) if emb is not None else None  # T-1 x (B, E): the sentinel's input words
        hs, zs, reads = [], [], []
        shared = [SharedRows(m) for m in memory]  # read through row prefixes as captions end
        for t, n in enumerate(active):
            if n == 0:
                break
            if n < h.shape[0]:  # shrink to the n captions still running
                h, c = h[:n], c[:n]
                memory = [m.prefix(n) for m in shared]
                if expectation_mask is not None:
                    expectation_mask = expectation_mask[:n]
            gates_t = gate_steps[t] if n == B else gate_steps[t][:n]  # (n, 4H)
            emb_t = None if emb_steps is None else emb_steps[t][:n]  # (n, E)
            h, c, z, read = self._recur_fast(gates_t, h, c, memory, mode, weights, expectation_mask,
                                             temperature=temperature, emb=emb_t)
            hs.append(h)
            zs.append(z)
            reads.append(read)
        return hs, zs, reads

    def sample(self, grid: Tensor, samples: int, start_id: int, end_id: int, max_length: int,
               attention_mode: str | None = None, forbid_ids: tuple[int, ...] = (), greedy: bool = False,
               generator: torch.Generator | None = None, temperature: float = 1.0) -> SampleOutput:
        """contract.CaptionDecoder.sample, with one set of step weights for the whole sequence (deferred
        gradients) and, without autograd, projected values (expand_state)."""
        if not fast.enabled():
            return super().sample(grid, samples, start_id, end_id, max_length, attention_mode, forbid_ids, greedy,
                                  generator, temperature)
        mode = self._sample_mode(attention_mode)
        state = self.expand_state(self.init_state(grid), samples)  # without autograd it may be a ProjectedState
        projected = isinstance(state, ProjectedState)
        h, c, *memory = state  # h, c: (N, H), N = B * samples
        draws = SampleDraws(h.shape[0], start_id, end_id, self.pad_id, forbid_ids, greedy, generator, grid.device,
                            temperature)
        weights = self._step_weights()
        for _ in range(max_length):
            emb = self.embedding(draws.tokens)  # (N, E)
            h, c, z, read = self._recur_fast(self._word_gates(emb, weights.word), h, c, memory, mode, weights,
                                             projected=projected, emb=emb)
            if not draws.draw(self._deep_output_fast(emb, h, z, projected), read):  # logits (N, V)
                break
        return draws.output()

    def step_with_location(self, tokens: Tensor, state: State, attention_mode: str = "expectation",
                           dense: bool = True) -> tuple["Tensor | Logits", Tensor, Tensor | None, State]:
        """contract.CaptionDecoder.step_with_location; without autograd a step gathers its word gates from a table
        and hands the search L_o's bias apart (search.Logits adds it as it reads the words)."""
        if not fast.enabled():
            return super().step_with_location(tokens, state, attention_mode, dense)
        if self._compiled is not None and attention_mode == "expectation" and not torch.is_grad_enabled():
            return self._compiled.step(self, tokens, state, dense)
        mode = attention_mode  # checked once per decode (Captioner.check_decode_options), not per step
        projected = isinstance(state, ProjectedState)
        h, c, *memory = state
        emb = self.embedding(tokens)  # (N, E)
        weights = self._step_weights()
        if torch.is_grad_enabled():
            word_gates = self._word_gates(emb, weights.word)  # (N, 4H)
        else:
            word_gates = self._word_gate_table().index_select(0, tokens)  # (N, 4H): a gather, no matmul
        h, c, z, read = self._recur_fast(word_gates, h, c, memory, mode, weights, projected=projected, emb=emb)
        if dense:
            log_probs = torch.log_softmax(self._deep_output_fast(emb, h, z, projected), dim=-1)  # (N, V)
        elif torch.is_grad_enabled():
            log_probs = Logits(self._deep_output_fast(emb, h, z, projected))  # (N, V), normalised by the search
        else:  # L_o's bias added by the search as it reads the words (no (N, V) pass of its own)
            log_probs = Logits(self._deep_output_fast(emb, h, z, projected, bias=False), self.out.bias)
        return log_probs, read.alpha, read.index, type(state)((h, c, *memory))
