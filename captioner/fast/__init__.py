"""The speed code, in one place, behind the one reference switch that turns every fast path off at once, so a
suspicious result can be re-checked on plain code.

The speed work of this codebase sits beside plain reference code that computes the same thing (to float
rounding), as PyTorch's ``scaled_dot_product_attention`` keeps its math backend beside the fused ones. This
package holds the building blocks, which import nothing else of captioner (the paper's code imports them where
it picks a fast path, never the other way round):

    token_nll.py         token_nll / linear_token_nll: the output layer and the cross-entropy fused, a one-pass
                         backward (the losses' reference: F.linear + F.cross_entropy)
    deferred.py          StepWeight (MKL-packed weights for few-row steps, weight gradients formed once per
                         sequence), SharedRows (the reference: torch.addmm and slices per step)
    inference_cache.py   weights restacked for decoding steps, rebuilt when a weight changes or an optimizer steps
    kernels/             the fused C kernels (fused.c: the additive scorer, the searches' read of raw logits, a
                         decoding step's LSTM cell), built at first use (kernels/build.py)

and the switch below. Where each fast path runs, and the reference it falls back to:

    fast path                                                 reference it falls back to
    FastShowAttendTellDecoder (sorted shrinking batch, caches,  ShowAttendTellDecoder, the paper's equations
      deferred weight gradients, MKL-packed weights,            step by step (models/decoders/show_attend_tell.py;
      projected values, the fused LSTM cell)                    the fast one beside it, show_attend_tell_fast.py)
    AdditiveScorer's fused C kernel and chunked inference      the PyTorch ops (models/scorers.py)
    logits.Logits (best words read from raw logits, the        dense log-softmax, then top-k (decoding/logits.py)
      fused C read)
    token_nll.linear_token_nll / token_nll (fused output       F.linear + F.cross_entropy (training/losses.py
      layer, one-pass backward)                                 calls them)
    fused Adam                                                 the single-tensor Adam (training/optim.py)
    deferred.StepWeight's packing and deferred gradients       torch.addmm per step (fast/deferred.py)

Each site asks ``enabled()`` next to its own switch (e.g. ``AdditiveScorer.fused``, ``CAPTIONER_KERNELS=0``),
which stay for benchmarks that time one fast path at a time. The reference runs when

- the environment says ``CAPTIONER_REFERENCE=1`` (any command: ``CAPTIONER_REFERENCE=1 captioner evaluate ...``),
- a training config says ``train.fast_paths: false`` (the training loop runs inside ``reference()``), or
- code runs inside ``with reference():``.

The switch is process-wide (not per thread): flip it between runs, searches or training steps, not inside one.
tests/test_reference_switch.py trains and decodes a few steps both ways and compares losses, gradients and
captions.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "CAPTIONER_REFERENCE"

_depth = [0]  # how many reference() blocks are open


def enabled() -> bool:
    """Whether the fast paths may run (False inside ``reference()`` or under CAPTIONER_REFERENCE=1)."""
    return _depth[0] == 0 and os.environ.get(ENV, "0") != "1"


@contextmanager
def reference(active: bool = True) -> Iterator[None]:
    """Run the block on the reference code; ``active=False`` changes nothing (``reference(not cfg_says_fast)``)."""
    _depth[0] += int(active)
    try:
        yield
    finally:
        _depth[0] -= int(active)
