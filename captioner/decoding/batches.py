"""Decode a split in batches: the one loop behind training's validation and ``captioner evaluate``.

Both pick and report checkpoints by what this loop decodes, so they must decode the same words: the same
search with the same ``DecodeOptions``, ``<unk>`` kept unless the
options forbid it. It sits below the training loop and the commands (neither imports the other for it).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import torch

from captioner.decoding.options import DecodeOptions


@torch.no_grad()
def decode_batches(model, batches: Iterable[tuple[Sequence, torch.Tensor]], options: DecodeOptions
                   ) -> Iterator[tuple[Any, Any, list[str]]]:
    """Decode (records, grid (B, L, D)) batches with an ``api.ImageCaptioner``: yields (record, best
    hypothesis, words) per image, in float32 for validation and evaluate alike (training's mixed precision stops
    at the teacher-forced loss: best.pt is picked on the captions evaluate reports)."""
    for records, grid in batches:
        hyps = model.generate(grid, options)
        for record, per_image in zip(records, hyps):
            best = per_image[0]
            yield record, best, model.words(best)
