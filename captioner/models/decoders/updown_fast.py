"""The Up-Down decoder (updown.py) computed faster, as show_attend_tell_fast.py does for the LSTM: the same
function, tests/test_fast_paths.py holding the two equal.

- Teacher forcing runs on the captions sorted by length (contract.SortedBatch): at step t only the captions still
  running are stepped, the output layer's inputs stay packed (real steps only), and the attention memory and the
  mean feature's gates are read through shrinking row prefixes (fast/deferred.SharedRows).
- The word's share of the attention LSTM's gates is one matmul for every step at once; each step then has one
  matmul per LSTM: the attention LSTM's on [h2; h1], the language LSTM's on [context; h1; h2].
- Without autograd (decoding), the stacked weights are built once per set of weights and the LSTM cells run as
  one fused pass (fast/kernels).

Under the reference switch (captioner/fast), and for scheduled sampling (whose input words are known one step at
a time), every method runs updown.py's code instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from captioner import fast
from captioner.fast import kernels
from captioner.fast.deferred import SharedRows
from captioner.fast.inference_cache import module_cache
from captioner.models.attention import AttentionOutput
from captioner.models.decoders.contract import DecoderOutput, SortedBatch, State, caption_mask, shared_dropout
from captioner.models.decoders.updown import UpDownDecoder, lstm_step


@dataclass
class _StepWeights:
    """One step's weights, each LSTM's input and recurrent weights side by side (one matmul per LSTM)."""

    word: Tensor  # (4H, E): the word's columns of the attention LSTM's W_ih
    word_bias: Tensor  # (4H,): both of the attention LSTM's biases
    attention: Tensor  # (4H, 2H): reads [h2; h1]
    language: Tensor  # (4H, Z + 2H): reads [context; h1; h2]
    language_bias: Tensor  # (4H,)


class FastUpDownDecoder(UpDownDecoder):
    """UpDownDecoder (updown.py) with the fast forward and step of the module docstring."""

    def _step_weights(self) -> _StepWeights:
        """Built per sequence with autograd; without it (decoding steps) once per set of weights."""
        if torch.is_grad_enabled():
            return self._build_step_weights()
        return module_cache(self).get("step_weights", list(self.parameters()), self._build_step_weights)

    def _build_step_weights(self) -> _StepWeights:
        att, lang = self.attention_lstm, self.language_lstm
        from_h2, _, from_word = self.attention_lstm_inputs()
        return _StepWeights(word=from_word, word_bias=att.bias_ih + att.bias_hh,
                            attention=torch.cat([from_h2, att.weight_hh], dim=1),
                            language=torch.cat([lang.weight_ih, lang.weight_hh], dim=1),
                            language_bias=lang.bias_ih + lang.bias_hh)

    def _step(self, word_gates: Tensor, mean_gates: Tensor, h2: Tensor, c2: Tensor, h1: Tensor, c1: Tensor,
              memory: list[Tensor], mode: str, weights: _StepWeights, expectation_mask: Tensor | None = None,
              temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor, Tensor, AttentionOutput]:
        """Eq. (2)-(6) for N rows, the word's share of the attention LSTM's gates given (N, 4H, biases included).
        Returns (h2, c2, h1, c1, the read)."""
        gates = torch.addmm(word_gates + mean_gates, torch.cat([h2, h1], dim=1), weights.attention.t())  # (N, 4H)
        h1, c1 = _cell(gates, c1)  # Eq. (2)
        read = self.attention(h1, memory, mode, expectation_mask=expectation_mask, entropy=self.stochastic,
                              temperature=temperature)  # Eq. (3)-(5)
        gates = torch.addmm(weights.language_bias, torch.cat([read.context, h1, h2], dim=1), weights.language.t())
        h2, c2 = _cell(gates, c2)  # Eq. (6)
        return h2, c2, h1, c1, read

    def recur(self, emb: Tensor, state: State, mode: str, expectation_mask: Tensor | None = None,
              temperature: float = 1.0) -> tuple[State, AttentionOutput]:
        """updown.UpDownDecoder.recur: one step. Without autograd (decoding) one matmul per LSTM with the stacked
        weights built once per set of weights; with it (SCST's samples, scheduled sampling) the reference's step,
        which reads the weights in place instead of stacking them again at every step."""
        if not fast.enabled() or torch.is_grad_enabled():
            return super().recur(emb, state, mode, expectation_mask, temperature)
        h2, c2, h1, c1, mean_gates, *memory = state
        weights = self._step_weights()
        word_gates = F.linear(emb, weights.word, weights.word_bias)  # (N, 4H)
        h2, c2, h1, c1, read = self._step(word_gates, mean_gates, h2, c2, h1, c1, memory, mode, weights,
                                          expectation_mask, temperature)
        return (h2, c2, h1, c1, mean_gates, *memory), read

    def forward(self, grid: Tensor, captions: Tensor, lengths: Tensor, attention_mode: str = "expectation",
                expectation_mask: Tensor | None = None, dropout_rows: Tensor | None = None,
                temperature: float = 1.0, sample_prob: float = 0.0) -> DecoderOutput:
        """Teacher-forced decoding (contract.CaptionDecoder.forward) on the batch sorted by length."""
        if not fast.enabled() or sample_prob:
            return super().forward(grid, captions, lengths, attention_mode, expectation_mask, dropout_rows,
                                   temperature, sample_prob)
        mode = self._mode(attention_mode)
        mask = caption_mask(captions, lengths)  # (B, T-1)
        batch = SortedBatch.of(lengths.to(captions.device), captions.shape[1])
        order = batch.order
        rows_s = None if dropout_rows is None else dropout_rows.index_select(0, order)
        grid_s = shared_dropout(self.feature_dropout, grid.index_select(0, order), rows_s)  # identity in eval mode
        h2, c2, h1, c1, *per_image = self.init_state(grid_s)
        weights = self._step_weights()
        emb = self.embedding(captions.index_select(0, order)[:, :-1])  # (B, T-1, E), sorted
        # every step's word gates at once; unbind, not a slice per step (whose backward is a full-size zero tensor)
        words = F.linear(emb, weights.word, weights.word_bias).unbind(1)  # T-1 x (B, 4H)
        shared = [SharedRows(m) for m in per_image]  # the mean feature's gates and the attention memory
        mean_gates, *memory = per_image
        mask_s = None if expectation_mask is None else expectation_mask.index_select(0, order)
        B = h2.shape[0]
        hs, reads = [], []
        for t, n in enumerate(batch.active):
            if n == 0:
                break
            if n < h2.shape[0]:  # shrink to the n captions still running
                h2, c2, h1, c1 = h2[:n], c2[:n], h1[:n], c1[:n]
                mean_gates, *memory = [m.prefix(n) for m in shared]
                if mask_s is not None:
                    mask_s = mask_s[:n]
            word_gates = words[t] if n == B else words[t][:n]
            h2, c2, h1, c1, read = self._step(word_gates, mean_gates, h2, c2, h1, c1, memory, mode, weights,
                                              mask_s, temperature)
            hs.append(h2)
            reads.append(read)
        # the output layer's inputs, real steps only, packed; L_o runs fused with the loss (DecoderOutput)
        features = shared_dropout(self.dropout, torch.cat(hs), batch.step_rows(dropout_rows))  # (R, H)
        return DecoderOutput.from_packed(features, self.out, batch, mask, reads)


def _cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """updown.lstm_step, one fused pass where the kernel serves (no autograd: decoding)."""
    if kernels.lstm_cell_applies(gates, c):
        h, c, _ = kernels.lstm_cell(gates, c)
        return h, c
    return lstm_step(gates, c)
