"""What the training loop reads: records, the feature cache, datasets and each epoch's loader.

``from_images`` (``not data.use_cache``, decided once by the training loop) picks between datasets of images,
which the encoder runs on, and datasets of the feature cache's rows (a frozen encoder's grids, a fine-tuned one's
activations below its trainable blocks), extracted here once by rank 0 when the cache is incomplete. The order of
every epoch depends only on (seed, epoch), which is what makes a resumed run continue bit for bit.
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from captioner.config import Config
from captioner.data.datasets import (
    CaptionDataset,
    DataError,
    GridCaptionDataset,
    ImageCaptionDataset,
    ImageRecord,
    collate_captions,
    load_records,
)
from captioner.data.vocab import Vocab
from captioner.training.distributed import barrier
from captioner.training.objectives.registry import objective_class

log = logging.getLogger(__name__)


def load_split_records(cfg: Config, split: str, rank: int, world: int) -> list[ImageRecord]:
    """The records of ``split`` on every rank."""
    # Rank 0 first: the shapes format generates its data on first use, which must happen once.
    if rank == 0:
        records = load_records(cfg.data, split)
    barrier(world)
    if rank != 0:
        records = load_records(cfg.data, split)
    return records


def open_feature_cache(cfg: Config, model: nn.Module, records: list[ImageRecord], rank: int, world: int) -> Any:
    """Open the feature cache of this encoder, extracting it first when incomplete; under torchrun an incomplete
    cache is refused instead (`captioner extract` first)."""
    from captioner.data.features import FeatureCache, cache_dir_for, extract_features, open_complete_cache

    fingerprint = model.encoder.cache_fingerprint()
    directory = cache_dir_for(cfg.data, fingerprint)
    if open_complete_cache(directory, records, fingerprint) is None:
        if world > 1:  # every rank sees the same files, so every rank refuses: none is left waiting at a collective
            raise DataError(f"{directory}: the feature cache of this encoder is incomplete for these {len(records)} "
                            "images; under torchrun run `captioner extract --config CONFIG` first, in one process "
                            "(extracting on rank 0 would outlast the other ranks' wait at the process group)")
        log.info("extracting encoder grids for %d images into %s", len(records), directory)
        extract_features(model.encoder, records, directory, batch_size=cfg.eval.batch_size,
                         num_workers=cfg.data.num_workers, max_failure_share=cfg.data.max_failure_share,
                         progress=True)
    return FeatureCache.open(directory, expected_fingerprint=fingerprint)


def _drop_uncached(records: list[ImageRecord], cache: Any, split: str) -> list[ImageRecord]:
    kept = [r for r in records if r.image_id in cache]
    if len(kept) < len(records):
        log.warning("%s: %d of %d images have no cached grid (unreadable at extraction) and are skipped",
                    split, len(records) - len(kept), len(records))
    if not kept:
        raise DataError(f"{split}: no image has a cached grid")
    return kept


def make_datasets(cfg: Config, model: nn.Module, vocab: Vocab, train_records: list[ImageRecord],
                  val_records: list[ImageRecord], from_images: bool, rank: int, world: int
                  ) -> tuple[CaptionDataset, CaptionDataset | None, CaptionDataset | None]:
    """(train per caption, or per image for SCST; val per caption for the loss; val per image for decoding). Only
    rank 0 validates, so the other ranks get no validation sets (None): they neither read nor hold those grids."""
    max_length = cfg.data.max_length
    if from_images:
        def make(records, per_image):
            return ImageCaptionDataset(records, vocab, max_length, transform=model.transform, per_image=per_image)
    else:
        cache = open_feature_cache(cfg, model, train_records + val_records, rank, world)
        train_records = _drop_uncached(train_records, cache, "train")
        if rank == 0:
            val_records = _drop_uncached(val_records, cache, "val")

        def make(records, per_image):
            return GridCaptionDataset(records, vocab, max_length, cache=cache, per_image=per_image)
    # what the objective reads from the data: images with all their references (SCST), or captions
    train_set = make(train_records, objective_class(cfg.train.objective).per_image)
    if train_set.n_truncated:
        log.info("train: %d of %d captions longer than data.max_length=%d words were truncated",
                 train_set.n_truncated, len(train_set), max_length)
    if rank != 0:
        return train_set, None, None
    return train_set, make(val_records, False), make(val_records, True)


class _SkipFirst(torch.utils.data.Sampler):
    """``sampler``'s order without its first ``n`` indices, drawn the same way (a resume inside an epoch: the
    batches already trained are not read again)."""

    def __init__(self, sampler: Any, n: int) -> None:
        self.sampler, self.n = sampler, n

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.n, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.n, 0)


def epoch_loader(dataset: CaptionDataset, batch_size: int, epoch: int, seed: int, rank: int, world: int,
                 shuffle: bool, num_workers: int, pin_memory: bool, skip_batches: int = 0) -> DataLoader:
    """The order of epoch ``epoch`` depends only on (seed, epoch): what makes resume exact, with workers or
    without (they return batches in the sampler's order). Its batches hold cached grids as float16: read them
    through ``CaptionBatch.to(device)``, which widens them to float32 on the device. ``skip_batches``: start after
    that many batches of the epoch (a resume from a checkpoint saved inside it)."""
    generator = torch.Generator().manual_seed(seed + epoch)
    if world > 1:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
    elif shuffle:
        sampler = RandomSampler(dataset, generator=generator)
    else:
        sampler = None
    if skip_batches:
        sampler = _SkipFirst(sampler if sampler is not None else range(len(dataset)), skip_batches * batch_size)
    # generator= also feeds the loader's worker base seed, which would otherwise draw on the global RNG.
    # Cached rows stay float16 to the device: the loop moves each batch with CaptionBatch.to, which widens there.
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False,
                      collate_fn=functools.partial(collate_captions, widen=False), num_workers=num_workers,
                      pin_memory=pin_memory, generator=generator, persistent_workers=False)
