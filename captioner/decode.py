"""Decode a split in batches: the one loop behind training's validation and ``captioner evaluate``.

Both pick and report checkpoints by what this loop decodes, so they must decode the same words:
the same search, the same hard-attention mode (resolved once per decode), ``<unk>`` kept. It sits
below the training loop and the commands (neither imports the other for it).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable, Iterator, Sequence

import torch


@torch.no_grad()
def decode_batches(model, batches: Iterable[tuple[Sequence, torch.Tensor]], beam_size: int = 1,
                   max_length: int | None = None, attention_mode: str | None = None,
                   autocast: Callable[[], ContextManager] = nullcontext,
                   length_penalty: float | None = None,
                   forbid_unk: bool = False,
                   block_trigrams: bool | None = None) -> Iterator[tuple[Any, Any, list[str]]]:
    """Decode (records, grid (B, L, D)) batches with an ``api.ImageCaptioner``: yields (record, best
    hypothesis, words) per image.

    ``autocast`` wraps each batch's search (training passes its AMP context). ``max_length`` /
    ``length_penalty`` / ``block_trigrams`` default to the model's (its config's ``eval`` section).
    ``forbid_unk`` keeps <unk> out of the search (off by default: scores then match training's).
    """
    mode = model.decode_mode(attention_mode)
    for records, grid in batches:
        with autocast():
            hyps = model.generate(grid, beam_size=beam_size, max_length=max_length, attention_mode=mode,
                                  length_penalty=length_penalty, forbid_unk=forbid_unk,
                                  block_trigrams=block_trigrams)
        for record, per_image in zip(records, hyps):
            best = per_image[0]
            yield record, best, model.words(best)
