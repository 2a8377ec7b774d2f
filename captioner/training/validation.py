"""Validation by real decoding, once per epoch: the greedy captions of the val images scored against their raw
references (``train.val_metric`` picks ``best.pt``), the teacher-forced loss (logged, never used to choose), the
attention's sharpness and movement, and with ``eval.mirror_check`` the mirror figures."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from captioner.config import Config
from captioner.data.datasets import CaptionDataset, collate_captions
from captioner.decoding.options import DecodeOptions
from captioner.evaluation.metrics import attention_movement, attention_sharpness, caption_scores, resolve_tokenizer
from captioner.training.losses import sequence_cross_entropy


@torch.no_grad()
def validate(model: nn.Module, cfg: Config, loss_set: CaptionDataset, decode_set: CaptionDataset,
             device: torch.device, from_images: bool, amp: Any) -> dict[str, float | None]:
    """Greedy-decode the validation images and score them (in float32, as `captioner evaluate` decodes); also the
    teacher-forced loss under ``amp``, training's mixed precision (logged only)."""
    from captioner.evaluation.split import decode_reads

    was_training = model.training
    model.eval()
    options = model.decode_options.replace_given(beam=1)  # greedy, else the config's (generate checks them)
    mode = options.attention_mode
    try:
        total, count = 0.0, 0
        for batch in DataLoader(loss_set, batch_size=cfg.eval.batch_size, collate_fn=collate_captions):
            batch = batch.to(device)
            with amp():  # as training computes it (the output layer reads the decoder's half-precision state)
                out = model(model.grid_from(batch.inputs, from_images), batch.captions, batch.lengths,
                            attention_mode=mode)
                n = int(out.mask.sum())
                total += float(sequence_cross_entropy(out, batch.captions[:, 1:])) * n
            count += n

        def batches():
            for batch in DataLoader(decode_set, batch_size=cfg.eval.batch_size, collate_fn=collate_captions):
                grid = model.grid_from(batch.inputs.to(device), from_images)  # (B, L, D)
                yield [decode_set.records[i] for i in batch.indices.tolist()], grid

        # Decoded in float32 whatever train.amp says, as `captioner evaluate` decodes: best.pt is chosen on the
        # captions that evaluate later scores. reads: id -> (words, alphas, cells)
        predictions, reads = decode_reads(model, batches(), options)
        references = {record.image_id: record.raw for record in decode_set.records}
        # scored as `captioner evaluate` scores (raw references, PTB-tokenized when Java is present); METEOR only
        # when it picks best.pt: its JVM start costs seconds per validation
        scores = caption_scores(predictions, references, meteor=cfg.train.val_metric == "METEOR")
        mirror = _mirror_check(model, cfg, decode_set.records, reads, options, cached_originals=not from_images)
        boxes = _box_figures(model, cfg, decode_set.records, reads, options)
    finally:
        model.train(was_training)
    result: dict[str, Any] = {"val_loss": total / max(count, 1)}
    result.update({k: (None if v is None else float(v)) for k, v in scores.items()})
    sharp = attention_sharpness([alphas for _, alphas, _ in reads.values()])
    result.update({"alpha_max": sharp["alpha_max"], "alpha_entropy": sharp["alpha_entropy"],
                   "alpha_saturated": sharp["alpha_saturated"],
                   **attention_movement([cells for _, _, cells in reads.values()]), **mirror,
                   "tokenizer": resolve_tokenizer("auto")})
    result.update(boxes)
    return result


def _box_figures(model: nn.Module, cfg: Config, records: list, reads: dict, options: DecodeOptions) -> dict:
    """With ``data.entities``, the box figures of the greedy captions as `captioner evaluate` computes them
    (evaluation/split.box_grounding, its pointing figures only): ``pointing``, ``inside`` and the
    ``centre_pointing`` baseline on the same words; else nothing."""
    if not cfg.data.entities or not reads:
        return {}
    from captioner.evaluation.regions import open_entities
    from captioner.evaluation.split import box_grounding

    entities = open_entities(cfg.data.entities, list(reads), "the validation split")
    g = box_grounding(model, records, reads, options, entities, cfg.eval.batch_size, metrics=("pointing",),
                      teacher_forced=False)["generated"]
    return {"pointing": g["pointing"], "inside": g["inside"], "centre_pointing": g["centre_pointing"],
            "grounded_words": g["words"]}


def _mirror_check(model: nn.Module, cfg: Config, records: list, reads: dict, options: DecodeOptions,
                  cached_originals: bool) -> dict:
    """With ``eval.mirror_check``, the mirror figures of the greedy captions (evaluation/split.mirror_figures: the
    mirrored photos are encoded from their images, in float32 as the originals are decoded), else nothing."""
    if not cfg.eval.mirror_check or not reads:
        return {}
    from captioner.evaluation.split import mirror_figures

    return mirror_figures(model, records, reads, options, cfg.eval.batch_size, cached_originals=cached_originals)
