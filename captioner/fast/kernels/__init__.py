"""Fused CPU kernels for the decoder's hot loop, in C (fused.c), built at first use with the system C compiler.

The additive scorer v^T tanh(W a_i + U h) (Xu et al. 2015 Eq. (4), scorers.AdditiveScorer) is elementwise
work over a (B, G, L, A) hidden layer at every word: in PyTorch an add and a tanh that each write that layer,
then the v matmul that reads it back, and under autograd the layer kept for the backward at every step.
fused.c computes the scores in one pass over the projected keys and recomputes tanh in the backward,
so the hidden layer is never stored (scripts/bench.py's shapes, 2 threads: the scores of beam 5 at R7,
(32, 5, 49, 512), 1.4 ms against 2.2 for the PyTorch ops). It also reads a search step's raw logits
(search.Logits.best): each row's k best words and its log-sum-exp in two passes, nothing written (160 x
10,000 logits: 1.05 ms against 2.0), with the output layer's bias added as it reads. And it runs a decoding
step's LSTM cell (lstm_cell: with projected values also the gate and the gate sums) in one pass per row
instead of about ten ops. Whole runs, in-process A/B: training 1.04-1.09x, beam 5 1.09-1.20x, then 1.03x for
the bias and 1.04x for the cell (docs/performance.md). The PyTorch code in models/scorers.py, decoding/logits.py
and models/decoders/show_attend_tell_fast.py stay the reference and the fallback, and tests/test_kernels.py compares
the two.

The library is compiled at first use with ``$CC`` (default ``cc``) and -march=native, and cached per source,
flags, compiler version and CPU; kernels/build.py owns how (the cache is used only when nobody else can write
to it, a library that does not load or bind is rebuilt once, the compiler has a timeout). When there is no
compiler, the build fails, or the platform lacks glibc's vector math library (libmvec), the PyTorch path runs
and one warning says why. ``CAPTIONER_KERNELS=0`` turns the kernels off; ``CAPTIONER_REQUIRE_KERNELS=1`` (CI)
makes their absence an error.
"""
from __future__ import annotations

import ctypes
import functools
import os
import warnings

import torch
from torch import Tensor

from captioner.fast.kernels.build import KernelUnavailable, find_compiler, load_library

_C_INT64, _C_PTR = ctypes.c_int64, ctypes.c_void_p


def _bind(lib: ctypes.CDLL) -> None:
    """Declare the C functions' signatures (an AttributeError when the library lacks one)."""
    lib.additive_scores.argtypes = [_C_PTR, _C_PTR, _C_INT64, _C_PTR, _C_PTR] + [_C_INT64] * 4 + [ctypes.c_int]
    lib.additive_scores_backward.argtypes = ([_C_PTR, _C_PTR, _C_INT64, _C_PTR, _C_PTR, _C_PTR, _C_PTR, _C_PTR]
                                             + [_C_INT64] * 4 + [ctypes.c_int])
    lib.row_best_log_probs.argtypes = ([_C_PTR, _C_PTR] + [_C_INT64] * 3
                                       + [_C_PTR, _C_INT64, _C_PTR, _C_PTR, ctypes.c_int])
    lib.lstm_cell.argtypes = ([_C_PTR, _C_INT64] * 4 + [_C_PTR] * 4 + [_C_INT64] * 3 + [ctypes.c_int])
    for fn in (lib.additive_scores, lib.additive_scores_backward, lib.row_best_log_probs, lib.lstm_cell):
        fn.restype = None


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    """The loaded kernels; raises KernelUnavailable with the reason."""
    if os.environ.get("CAPTIONER_KERNELS", "1") == "0":
        raise KernelUnavailable("turned off by CAPTIONER_KERNELS=0")
    compiler = find_compiler()
    if not compiler:
        raise KernelUnavailable("no C compiler found (set $CC, or install gcc)")
    return load_library(compiler, _bind)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the fused kernels run here; the first False warns once with the reason (or raises under
    CAPTIONER_REQUIRE_KERNELS=1)."""
    try:
        _library()
        return True
    except Exception as err:  # noqa: BLE001 - whatever went wrong, the PyTorch path runs (KernelUnavailable says why)
        if os.environ.get("CAPTIONER_REQUIRE_KERNELS") == "1":
            raise
        if os.environ.get("CAPTIONER_KERNELS", "1") != "0":
            warnings.warn(f"captioner: the fused CPU kernels are not used ({err}); the PyTorch path runs "
                          "instead (slower). CAPTIONER_KERNELS=0 silences this.", RuntimeWarning, stacklevel=2)
        return False


def _float32_cpu(*tensors: Tensor) -> bool:
    """What the C code reads: float32 CPU memory."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def _serves(*tensors: Tensor) -> bool:
    """Whether a kernel may stand in for the PyTorch ops on these tensors: float32 on the CPU, outside autocast,
    kernels built."""
    return _float32_cpu(*tensors) and not torch.is_autocast_enabled("cpu") and available()


def additive_applies(q: Tensor, prepared: Tensor, v: Tensor) -> bool:
    """Whether additive_scores serves these tensors: non-empty keys (M, L, A), queries (N, A), and _serves."""
    return (prepared.dim() == 3 and q.dim() == 2 and prepared.shape[0] > 0 and prepared.shape[1] > 0
            and _serves(q, prepared, v))


def _check(q: Tensor, prepared: Tensor, v: Tensor) -> tuple[Tensor, Tensor, int, int, int, int]:
    """The C code reads raw pointers: shapes, device and dtype are checked here, not trusted."""
    if not _float32_cpu(q, prepared, v):
        raise ValueError("the fused kernels take float32 CPU tensors (see additive_applies)")
    M, L, A = prepared.shape
    N = q.shape[0]
    if q.dim() != 2 or q.shape[1] != A or N % M or v.numel() != A:
        raise ValueError(f"queries {tuple(q.shape)} and v {tuple(v.shape)} do not fit keys {tuple(prepared.shape)}: "
                         "need (M*G, A) and A values for keys (M, L, A)")
    if q.stride(1) != 1:
        q = q.contiguous()
    return q, prepared.contiguous(), M, N // M, L, A


class _AdditiveScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, prepared: Tensor, v: Tensor) -> Tensor:
        q, prepared, M, G, L, A = _check(q, prepared, v)
        ctx.v_shape = v.shape
        v = v.reshape(-1).contiguous()
        scores = prepared.new_empty(M * G, L)
        _library().additive_scores(prepared.data_ptr(), q.data_ptr(), q.stride(0), v.data_ptr(), scores.data_ptr(),
                                   M, G, L, A, torch.get_num_threads())
        ctx.save_for_backward(q, prepared, v)
        return scores

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        q, prepared, v = ctx.saved_tensors
        M, L, A = prepared.shape
        G = q.shape[0] // M
        grad = grad.contiguous()
        dprepared, dq, dv_rows = prepared.new_empty(M, L, A), q.new_empty(M * G, A), v.new_empty(M, A)
        _library().additive_scores_backward(prepared.data_ptr(), q.data_ptr(), q.stride(0), v.data_ptr(),
                                            grad.data_ptr(), dprepared.data_ptr(), dq.data_ptr(), dv_rows.data_ptr(),
                                            M, G, L, A, torch.get_num_threads())
        return dq, dprepared, dv_rows.sum(0).view(ctx.v_shape)


def additive_scores(q: Tensor, prepared: Tensor, v: Tensor) -> Tensor:
    """e (M*G, L) with e[n, l] = v . tanh(prepared[n // G, l] + q[n]): q (M*G, A), prepared (M, L, A), v (A,)
    or (1, A). Differentiable in all three (the backward recomputes tanh). Check additive_applies first."""
    return _AdditiveScores.apply(q, prepared, v)


# Below this many words a row's read is too short for the kernel to matter (and the tests' tiny vocabularies
# keep exercising the PyTorch path).
BEST_MIN_WORDS = 256


def row_best_log_probs(logits: Tensor, k: int, banned: list[int], bias: Tensor | None = None
                       ) -> tuple[Tensor, Tensor] | None:
    """(log-probs (N, k), ids (N, k)) of each row's k best words other than ``banned``, best first, from raw
    logits (N, V) plus ``bias`` (V,) when given (added as ``logits + bias`` would round it), with the banned words
    counted in the normaliser (search.Logits.best); one read of each row for its top k (which gives its maximum)
    and one for the sum of exponentials, nothing written. None where the kernel does not serve (not float32 on
    the CPU, few words, or a row with non-finite logits or fewer than k eligible words): the caller's PyTorch
    path then runs."""
    N, V = logits.shape if logits.dim() == 2 else (0, 0)
    if (not _float32_cpu(logits) or V < BEST_MIN_WORDS or N == 0
            or k < 1 or k + len(banned) >= V or not available()):
        return None
    if bias is None:
        bias = _zeros(V)
    elif bias.shape != (V,):
        raise ValueError(f"bias must have shape ({V},) for logits {tuple(logits.shape)}, got {tuple(bias.shape)}")
    elif not _float32_cpu(bias):
        return None
    x, bias = logits.contiguous(), bias.contiguous()
    ban = torch.tensor(sorted(set(banned)), dtype=torch.int64)
    values, ids = x.new_empty(N, k), torch.empty(N, k, dtype=torch.int64)
    _library().row_best_log_probs(x.data_ptr(), bias.data_ptr(), N, V, k, ban.data_ptr(), ban.numel(),
                                  values.data_ptr(), ids.data_ptr(), torch.get_num_threads())
    if bool((ids[:, 0] < 0).any()):
        return None
    return values, ids


def lstm_cell_applies(*tensors: Tensor) -> bool:
    """Whether lstm_cell serves a decoding step with these tensors: no autograd recording, and _serves."""
    return not torch.is_grad_enabled() and _serves(*tensors)


def lstm_cell(a: Tensor, c: Tensor, b: Tensor | None = None, z: Tensor | None = None,
              gate_logit: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """An LSTM cell without autograd, the gate sums included: gates = a (N, 4H), or a + b + beta z[:, :4H] with
    beta = sigmoid(gate_logit) (N, 1) (1 without it); blocks i, f, g, o; returns (h, c_new, zl) with
    c_new = sigmoid(f) c + sigmoid(i) tanh(g), h = sigmoid(o) tanh(c_new) and, when z (N, 4H + E) has E > 0 more
    columns, zl = beta z[:, 4H:] (else None). One pass per row (fused.c); check lstm_cell_applies first."""
    if a.dim() != 2 or c.dim() != 2 or a.shape != (c.shape[0], 4 * c.shape[1]):
        raise ValueError(f"gates {tuple(a.shape)} and cell state {tuple(c.shape)} do not fit: need (N, 4H) and (N, H)")
    N, H = c.shape
    if (b is None) != (z is None):
        raise ValueError("b and z come together (the gate sums) or not at all")
    if b is not None and (b.shape != a.shape or z.dim() != 2 or z.shape[0] != N or z.shape[1] < 4 * H):
        raise ValueError(f"b {tuple(b.shape)} and z {tuple(z.shape)} do not fit gates {tuple(a.shape)}")
    if gate_logit is not None and (b is None or gate_logit.shape != (N, 1)):
        raise ValueError(f"gate_logit must be (N={N}, 1) beside b and z, got {tuple(gate_logit.shape)}")
    tensors = [t for t in (a, c, b, z, gate_logit) if t is not None]
    if not _float32_cpu(*tensors):
        raise ValueError("lstm_cell reads float32 CPU tensors")

    def rows(t: Tensor | None) -> tuple[Tensor | None, int]:  # row-major rows of contiguous columns
        if t is None:
            return None, 0
        t = t if t.stride(-1) == 1 or t.shape[1] == 1 else t.contiguous()
        return t, t.stride(0)

    (a, sa), (b, sb), (z, sz), (gate_logit, sg) = rows(a), rows(b), rows(z), rows(gate_logit)
    c = c.contiguous()
    E = 0 if z is None else z.shape[1] - 4 * H
    h_out, c_out = c.new_empty(N, H), c.new_empty(N, H)
    zl = c.new_empty(N, E) if E else None
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    _library().lstm_cell(a.data_ptr(), sa, ptr(b), sb, ptr(z), sz, ptr(gate_logit), sg, c.data_ptr(),
                         h_out.data_ptr(), c_out.data_ptr(), ptr(zl), N, H, E, torch.get_num_threads())
    return h_out, c_out, zl


@functools.lru_cache(maxsize=4)
def _zeros(n: int) -> Tensor:
    """A float32 CPU zero vector of n (the kernel's bias when there is none); never written."""
    return torch.zeros(n)
