"""`captioner evaluate --checkpoint CKPT [CKPT2 ...] [--split S] [--beam N] [--json] [--out F] [--results-file F]`:
decode a split with ``evaluate.evaluate_model`` and print its scores (``--results-file``: also write the captions
in COCO's results format, which `captioner score` and other tools score). Several checkpoints are decoded as
one ensemble (models/ensemble.py); the first one's config says which data and split."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Sequence

from captioner.api import load_captioner
from captioner.atomic import write_text_atomic
from captioner.commands.arguments import (
    add_decode_flags,
    add_device_flag,
    add_scoring_flags,
    chosen_device,
    decode_options,
    int_at_least,
    use_tf32,
)
from captioner.data.images import JPEG_QUALITIES
from captioner.evaluation.metrics import resolve_tokenizer
from captioner.evaluation.split import PER_PHOTO_BOXES, cached_grids, evaluate_model, format_table, summary
from captioner.names import ENSEMBLE_ATTENTIONS, SPLITS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner evaluate", description="Decode a split and score it.")
    parser.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, nargs="+", action="extend",
                        help="checkpoint file, run directory, model folder, hub model id (owner/name) or shipped "
                             "model name (e.g. flickr8k); several (--checkpoint A B, or the flag again): an "
                             "ensemble of those models (one vocabulary and encoder), the mean of their word "
                             "log-probabilities at each step, the data and eval settings the first one's; every "
                             "model reads the same way: as each reads on its own (eval.attention_mode) when they "
                             "agree; models that read differently on their own (a soft model beside a hard one "
                             "reading argmax) need --attention-mode, and then all read that way")
    parser.add_argument("--ensemble-attention", choices=ENSEMBLE_ATTENTIONS, default=None,
                        help="with several checkpoints, the attention the grounding and attention figures read, "
                             "and the cells the one-cell figures (cells, movement, mirror columns) read: the first "
                             "model's map and read cells, or the mean of all maps and its arg-max cell "
                             "(default: first)")
    parser.add_argument("--split", default=None, choices=SPLITS,
                        help="default: the checkpoint's eval.split")
    add_decode_flags(parser, n_best=False, for_people=False)  # --beam, --attention-mode, ..., --forbid-unk
    add_scoring_flags(parser)  # --tokenizer, --no-meteor
    parser.add_argument("--max-images", type=int_at_least(0), default=0,
                        help="score only the first N images (0 = all)")
    parser.add_argument("--data-root", default=None, help="override the data root stored in the checkpoint")
    parser.add_argument("--instances", default=None,
                        help="COCO instances_*.json: also report attention grounding on instance masks")
    parser.add_argument("--entities", default=None, metavar="DIR",
                        help="a Flickr30k Entities folder (Sentences/, Annotations/): also report attention "
                             "grounding on its boxes, for the generated captions and the references read "
                             "teacher-forced, beside the uniform, mean-map and centre-cell baselines "
                             "(default: the checkpoint's data.entities, when it names one)")
    parser.add_argument("--no-cache", action="store_true",
                        help="encode every image even when the feature cache of this frozen encoder holds its grid")
    parser.add_argument("--jpeg-quality", type=int_at_least(JPEG_QUALITIES.start, JPEG_QUALITIES.stop - 1),
                        default=None, metavar="Q",
                        help="re-save every image as a JPEG of quality Q (1..95) in memory before the encoder sees "
                             "it (so never reads the feature cache): how steady are the captions under recompression?")
    parser.add_argument("--mirror-check", action="store_true",
                        help="also caption every photo mirrored left-right and report whether attention follows "
                             "the objects (flipped maps, mirrored columns) or stays where it was")
    add_device_flag(parser)  # --device, default auto
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--out", default=None, help="also write the JSON result (with predictions) here")
    parser.add_argument("--results-file", default=None, metavar="PATH",
                        help='also write the captions as a COCO results file, [{"image_id", "caption"}] (what '
                             "COCO's evaluation server and pycocoevalcap read; `captioner score` scores it)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    ensemble = len(args.checkpoint) > 1
    if args.ensemble_attention and not ensemble:
        parser.error("argument --ensemble-attention: needs two or more checkpoints")

    from captioner.data.datasets import load_records
    from captioner.store.checkpoint import CheckpointError

    try:  # a list of one: that model
        model = load_captioner(args.checkpoint, device=chosen_device("evaluate", args.device),
                               ensemble_attention=args.ensemble_attention)
    except (CheckpointError, ValueError) as err:
        print(f"captioner evaluate: {err}", file=sys.stderr)
        return 2
    use_tf32(model)
    cfg = model.config
    # another root for the photos, read from here only: the loaded model's config (saved with any export) keeps its own
    data = dataclasses.replace(cfg.data, root=args.data_root) if args.data_root else cfg.data
    split = args.split or cfg.eval.split
    options = decode_options(parser, args, model.decode_options.replace_given)  # as training scored: <unk> kept
    records = load_records(data, split)
    if args.max_images:
        records = records[: args.max_images]
    try:
        tokenizer = resolve_tokenizer(args.tokenizer)
    except ValueError as err:
        print(f"captioner evaluate: {err}", file=sys.stderr)
        return 2
    entities = None
    entities_dir = args.entities or cfg.data.entities
    if entities_dir:
        from captioner.data.records import DataError
        from captioner.evaluation.regions import open_entities

        try:
            entities = open_entities(entities_dir, [r.image_id for r in records], f"split {split!r}")
        except DataError as err:
            print(f"captioner evaluate: {err}", file=sys.stderr)
            return 2
    cache = None if args.no_cache or args.jpeg_quality is not None else cached_grids(model, records, data)
    result = evaluate_model(model, records, options, tokenizer=tokenizer, cache=cache,
                            batch_size=cfg.eval.batch_size, meteor=not args.no_meteor, progress=not args.json,
                            instances=args.instances, jpeg_quality=args.jpeg_quality, mirror_check=args.mirror_check,
                            entities=entities)
    result["split"] = split
    if ensemble:
        result["ensemble"] = model.ensemble
    else:
        result["parameters"] = _parameter_count(model)
    try:
        if args.out:
            write_text_atomic(args.out, json.dumps(result, indent=2))
        if args.results_file:
            from captioner.evaluation.results import write_results

            n = write_results(args.results_file, records, result["predictions"], result.get(PER_PHOTO_BOXES))
            print(f"captioner evaluate: wrote {n} captions to {args.results_file}", file=sys.stderr)
    except OSError as err:  # a full disk (atomic.DiskFullError names the file and the free space), a bad path
        write_error = err
    else:
        write_error = None
    if args.json:  # the scores took the whole decode: printed even when a file could not be written
        print(json.dumps(summary(result), indent=2))
    else:
        print(format_table(result, split))
    if write_error is not None:
        print(f"captioner evaluate: {write_error}", file=sys.stderr)
        return 1
    return 0


def _parameter_count(model) -> int:
    """The model's parameters outside the encoder's pretrained CNN (frozen unless fine-tuned, and the same in every
    model on one encoder): the attention, decoder and projections a variant's size differs by."""
    backbone = getattr(model.encoder, "backbone", None)  # an encoder on cached grids may hold none
    skip = {id(p) for p in backbone.parameters()} if backbone is not None else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)
