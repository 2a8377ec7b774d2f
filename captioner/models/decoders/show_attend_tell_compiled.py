"""The Show-Attend-Tell decoder's step compiled by ``torch.compile``, over static shapes (``train.compile``).

At real sizes a training step dispatches some 2,400 operations, most of them the recurrence's, step by step: on a
GPU that is launch-bound. Here one step of the reference module (show_attend_tell.py) is compiled once per shape:
the attention read (Eq. 4-6), the gate beta_t (§4.2.1), the LSTM cell (Eq. 1-3) and the deep output's sum
E y_{t-1} + L_h h_t + L_z z_t (Eq. 7 before dropout; while decoding, L_o too). ``inductor`` (torch.compile's
default mode) fuses its elementwise work into a few kernels, on the CPU too; ``cudagraphs`` (its "reduce-overhead"
mode, CUDA only) also records each step as a CUDA graph, replayed with one launch, which needs every call to see
the same shapes. So the shapes are kept static:

- teacher forcing runs the whole padded batch at every step, as the reference does: no sorted, shrinking active
  batch. A row keeps stepping past its caption's end; those steps are dropped by the mask
  (DecoderOutput.from_padded), as the reference drops them, and rows never mix (no op reads across rows);
- rows are padded up to a multiple of ``ROW_BUCKET`` (an epoch's last, smaller batch too) with zero grids and
  <pad> words, and cut off again before anything reads them;
- under CUDA graphs the steps are padded up to a multiple of ``STEP_BUCKET`` too: a graph tree records one path per
  number of calls, so few lengths keep it small (without graphs the step's shape does not depend on the length,
  and steps past the longest caption would only cost time);
- decoding steps over a fixed number of rows: greedy search keeps finished captions in the batch anyway, and beam
  search keeps a retired image's rows (``static_rows``, decoding/search.py); the step pads the images to the bucket.

The step is the reference's own code (ShowAttendTellDecoder.recur), traced with the fast paths off (no C kernel
inside a graph); dropout stays outside it, drawn once for all steps. Only the soft read ("expectation") is
compiled; the config refuses ``train.compile`` where nothing would run compiled (hard attention, sampling
objectives, mixed precision, the reference switch: config.unread_keys). A call the compiled step does not serve (a
one-cell read, an expectation mask, dropout masks shared by caption copies, a decoding step under autograd) runs
the fast path (FastShowAttendTellDecoder). tests/test_compiled_step.py holds it to the eager paths: losses,
gradients and captions.

Limits: torch._dynamo keeps 8 graphs per step function (its recompile_limit; with fullgraph, a 9th shape is an
error): a training run meets at most 4 per function (training and validation rows, each with its last, smaller
batch; a beam search adds its first step's rows). Under CUDA graphs the attention memory, made by eager code, is
copied into the graph's inputs at every replay (B L (D + A) floats a step), and a decode is one graph generation:
the searches must hand every step the same memory tensors (``static_rows``), since new ones start the next
generation (``_padded_memory``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioner import fast
from captioner.decoding.search import Logits
from captioner.models.decoders.contract import DecoderOutput, State, caption_mask
from captioner.names import COMPILE_MODES

# train.compile -> torch.compile's mode ("off" compiles nothing)
TORCH_MODES = {"inductor": "default", "cudagraphs": "reduce-overhead"}
ROW_BUCKET = 8  # rows (captions, images) padded up to a multiple of this: few shapes, few compiles
STEP_BUCKET = 8  # teacher-forced steps padded up to a multiple of this under CUDA graphs


def bucket(n: int, size: int) -> int:
    """``n`` rounded up to a multiple of ``size``."""
    return -(-n // size) * size


def pad_rows(x: Tensor, rows: int, value: float = 0) -> Tensor:
    """``x`` (N, ...) with rows N..rows-1 filled with ``value``; ``x`` itself when it has them."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_full((rows - x.shape[0], *x.shape[1:]), value)])


def teacher_forced_step(decoder: nn.Module, emb: Tensor, h: Tensor, c: Tensor, values: Tensor, prepared: Tensor
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step of Eq. (1)-(7) over every row, emb (N, E) = E y_{t-1}: (h_t, c_t, the deep output before dropout
    and L_o (N, E), alpha_t (N, L)). The reference module's recur(), read softly."""
    (h, c, *_), z, read = decoder.recur(emb, (h, c, values, prepared), "expectation")
    return h, c, emb + decoder.out_h(h) + decoder.out_z(z), read.alpha


def decoding_step(decoder: nn.Module, tokens: Tensor, h: Tensor, c: Tensor, values: Tensor, prepared: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One decoding step for tokens (N,): (h_t, c_t, logits (N, V), alpha_t (N, L)); dropout is off (eval mode)."""
    emb = decoder.embedding(tokens)  # (N, E)
    h, c, features, alpha = teacher_forced_step(decoder, emb, h, c, values, prepared)
    return h, c, decoder.out(features), alpha


class StaticSteps:
    """A decoder's compiled steps and the static shapes they run on (module docstring).

    Args:
        mode: a value of ``train.compile`` other than "off" (a key of TORCH_MODES).
        backend: torch.compile's backend; "inductor" (what ``mode`` configures) except in tests, which may check
            the tracing alone on a cheaper one ("aot_eager").
    """

    def __init__(self, mode: str, backend: str = "inductor") -> None:
        if mode not in TORCH_MODES:
            raise ValueError(f"compile mode {mode!r} is not one of {', '.join(COMPILE_MODES[1:])}")
        self.mode = mode
        # one graph per shape (dynamic=False: the buckets keep them few), and all of a step in it (fullgraph)
        options = dict(dynamic=False, fullgraph=True, backend=backend,
                       **({"mode": TORCH_MODES[mode]} if backend == "inductor" else {}))
        self.train_step = torch.compile(teacher_forced_step, **options)
        self.decode_step = torch.compile(decoding_step, **options)
        self.step_bucket = STEP_BUCKET if mode == "cudagraphs" else 1
        self._memory: tuple[Tensor, ...] = ()  # the decode's attention memory and its padded copy (_padded_memory)

    def _begin(self) -> None:
        """A new forward or decode: CUDA graphs may reuse the memory of the last one's outputs from here on."""
        if self.mode == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()

    def forward(self, decoder: nn.Module, grid: Tensor, captions: Tensor, lengths: Tensor) -> DecoderOutput:
        """Teacher-forced decoding read softly (contract.CaptionDecoder.forward, without dropout_rows: every caption
        draws its own masks), every step over the padded batch."""
        self._begin()
        self._memory = ()
        mask = caption_mask(captions, lengths)  # (B, S), S = T-1 steps
        B, S = mask.shape
        Bp, Sp = bucket(B, ROW_BUCKET), bucket(S, self.step_bucket)
        grid = decoder.feature_dropout(grid)  # identity in eval mode
        words = F.pad(captions[:, :-1], (0, Sp - S, 0, Bp - B), value=decoder.pad_id)  # (Bp, Sp)
        emb = decoder.embedding(words.t())  # (Sp, Bp, E): time-major, each step's rows contiguous
        h, c, values, prepared = decoder.init_state(pad_rows(grid, Bp))  # padded rows read zero grids
        features, alphas = [], []
        with fast.reference():  # the plain PyTorch scorer inside the graph
            for x in emb.unbind(0):
                h, c, feature, alpha = self.train_step(decoder, x, h, c, values, prepared)
                features.append(feature)
                alphas.append(alpha)
        features = decoder.dropout(torch.stack(features, dim=1)[:B, :S])  # (B, S, E): one draw for all steps
        return DecoderOutput.from_padded(features, torch.stack(alphas, dim=1)[:B, :S], mask, decoder.out)

    def expand(self, state: State, beams: int) -> State:
        """Beam search's rows: h and c ``beams`` times per image, the attention memory kept at one row per image."""
        h, c, *memory = state
        return (h.repeat_interleave(beams, dim=0), c.repeat_interleave(beams, dim=0), *memory)

    def _padded_memory(self, values: Tensor, prepared: Tensor) -> tuple[Tensor, Tensor]:
        """The attention memory (M, L, *) padded to the bucket, once per decode: the searches hand every step the
        same memory tensors (static rows), so new ones start a new decode."""
        if len(self._memory) != 4 or self._memory[0] is not values or self._memory[1] is not prepared:
            self._begin()
            rows = bucket(values.shape[0], ROW_BUCKET)
            self._memory = (values, prepared, pad_rows(values, rows), pad_rows(prepared, rows))
        return self._memory[2], self._memory[3]

    def step(self, decoder: nn.Module, tokens: Tensor, state: State, dense: bool
             ) -> tuple["Tensor | Logits", Tensor, None, State]:
        """contract.CaptionDecoder.step_with_location, read softly, without autograd: N rows, G per memory row,
        padded to the images' bucket times G."""
        if decoder.training and decoder.dropout.p > 0:
            raise RuntimeError("the compiled decoding step runs without dropout: decode in eval mode (model.eval())")
        h, c, values, prepared = state
        N = h.shape[0]
        values_p, prepared_p = self._padded_memory(values, prepared)
        rows = values_p.shape[0] * (N // values.shape[0])
        with fast.reference():  # the plain PyTorch scorer inside the graph
            h_p, c_p, logits, alpha = self.decode_step(decoder, pad_rows(tokens, rows, decoder.pad_id),
                                                       pad_rows(h, rows), pad_rows(c, rows), values_p, prepared_p)
        if rows > N:  # (no view otherwise: CUDA graphs take their own outputs back without a copy)
            h_p, c_p, logits, alpha = h_p[:N], c_p[:N], logits[:N], alpha[:N]
        log_probs = torch.log_softmax(logits, dim=-1) if dense else Logits(logits)  # (N, V)
        return log_probs, alpha, None, (h_p, c_p, values, prepared)
