"""`captioner extract`: fill the feature cache with the frozen encoder's grids (Xu et al. 2015, §3.1.1).

The command does the model part (the encoder is built from the config by ``api.build_encoder_from_config``,
the same translation training uses, so the fingerprints agree) and hands the encoder to the data
layer's ``extract_features`` (captioner/data/features.py), which knows files, not models; all it adds is
which records to extract and what to print, so it has no library module of its own.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Sequence

from captioner.api import build_encoder_from_config
from captioner.atomic import DiskFullError
from captioner.commands.arguments import int_at_least
from captioner.config import ConfigError, add_config_arguments, load_config
from captioner.data.features import FeatureCacheError, cache_dir_for, extract_features
from captioner.models.weights import EncoderWeightsError
from captioner.names import SPLITS
from captioner.runtime import describe_device, enable_tf32, resolve_device
from captioner.training.distributed import seed_everything


def _split_records(data: Any, splits: str | None) -> tuple[list[str], list[Any]]:
    """The records of the named splits; by default every split the data set has (a missing one is noted).
    With ``data.mirror`` the training split's mirrored copies come too (training reads both)."""
    from captioner.data.datasets import EmptySplitError, load_records, mirrored_records

    def records_of(split: str) -> list[Any]:
        records = load_records(data, split)
        return records + mirrored_records(records) if data.mirror and split == "train" else records

    if splits is not None:  # asked for by name: a missing split is an error
        names = [s.strip() for s in splits.split(",") if s.strip()]
        return names, [r for split in names for r in records_of(split)]
    names, records = [], []
    for split in SPLITS:
        try:
            records += records_of(split)
            names.append(split)
        except EmptySplitError as err:
            print(f"note: skipping split {split!r}: {err}")
    return names, records


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner extract", description="Precompute the frozen encoder's grids "
                                     "of every image of the given splits into one feature cache.")
    add_config_arguments(parser)
    parser.add_argument("--splits", default=None,
                        help="comma-separated splits (default: train, val and test, skipping a split the data set "
                             "does not have, such as Flickr8k's withheld test split)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=None, help="default: eval.batch_size")
    parser.add_argument("--num-workers", type=int_at_least(0), default=None, help="default: data.num_workers")
    parser.add_argument("--device", default=None,
                        help="auto (CUDA when present, else the CPU), cpu, cuda or cuda:N; default: the config's "
                             "train.device (auto unless the config says otherwise)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`captioner extract --config X.yaml [--set k=v ...] [--splits train,val,test]`: fill the feature cache."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
        enc = cfg.model.encoder
        # seeded as training seeds before it builds the model (encoder first): an encoder without pretrained weights
        # (the smoke config's) gets the weights, so the fingerprint, that `captioner train` will look for
        seed_everything(cfg.train.seed)
        encoder = build_encoder_from_config(enc)  # the frozen part is cached: the projection trains after it
        splits, records = _split_records(cfg.data, args.splits)
        out_dir = cache_dir_for(cfg.data, encoder.cache_fingerprint())
        requested = args.device or cfg.train.device
        device = resolve_device(requested, "--device" if args.device else "train.device")
        if device.type == "cuda":
            enable_tf32(cfg.train.tf32)
        print(f"captioner extract: {describe_device(device, requested)}", file=sys.stderr)
        print(f"extracting {len(records)} images ({', '.join(splits)}) with {enc.name} "
              f"({'grid' if encoder.frozen else 'activations below the trained blocks'} "
              f"{'x'.join(map(str, encoder.cache_shape))}) into {out_dir}")
        cache = extract_features(encoder, records, out_dir,
                                 batch_size=args.batch_size or cfg.eval.batch_size,
                                 num_workers=cfg.data.num_workers if args.num_workers is None else args.num_workers,
                                 max_failure_share=cfg.data.max_failure_share, progress=not args.no_progress,
                                 device=device)
    except (ConfigError, FeatureCacheError, EncoderWeightsError, ValueError, DiskFullError) as err:
        print(f"captioner extract: error: {err}", file=sys.stderr)  # a full disk: the file, the space free and needed
        return 1
    s = cache.stats
    print(f"done: {s['processed']} images in {s['seconds']:.1f} s ({s['images_per_s']:.1f} images/s); "
          f"{len(cache)} grids cached, {s['failed']} unreadable -> {out_dir}")
    return 0
