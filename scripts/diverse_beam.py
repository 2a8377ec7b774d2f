"""Diverse beam search against plain beam search at n-best N (issue 55): how different each image's N best
captions are (evaluation/diversity.nbest_diversity: distinct captions, distinct 4-grams, self-BLEU-4) and the
scores of the best caption (coco-caption PTB tokenizer), on one model and split, decoded from the feature cache.

    python scripts/diverse_beam.py --model flickr8k_soft --split val --beam 5 --groups 5 --diversity 0.5 \\
        --out docs/training-options/diverse_beam.json

Each setting decodes the split once (plain first, then every --diversity value); the JSON keeps every figure, the
decoding settings, the wall time of each decode and the machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from captioner.api import load_captioner
from captioner.atomic import write_text_atomic
from captioner.data.datasets import load_records
from captioner.evaluation.diversity import nbest_diversity
from captioner.evaluation.metrics import caption_scores
from captioner.evaluation.split import _grid_batches, cached_grids
from captioner.training.provenance import cpu_model


def decode_nbest(model, records, options, cache, batch_size: int) -> dict[str, list[str]]:
    """Image id -> its n best captions (words joined), best first."""
    out: dict[str, list[str]] = {}
    bar = tqdm(total=len(records), desc=f"beam {options.beam} groups {options.beam_groups}", unit="img")
    for batch, grid in _grid_batches(model, records, batch_size, cache, bar):
        for record, hyps in zip(batch, model.generate(grid, options)):
            out[record.image_id] = [" ".join(model.words(h)) for h in hyps]
    bar.close()
    return out


def measure(model, records, options, cache, batch_size: int) -> dict:
    start = time.perf_counter()
    nbest = decode_nbest(model, records, options, cache, batch_size)
    wall = time.perf_counter() - start
    references = {r.image_id: list(r.raw) for r in records}
    top = {key: captions[0] for key, captions in nbest.items()}
    return {"beam": options.beam, "n_best": options.n_best, "beam_groups": options.beam_groups,
            "diversity": options.diversity, "decode_s": round(wall, 1), **nbest_diversity(nbest),
            "top_scores": caption_scores(top, references, tokenizer="ptb"),
            "examples": {key: nbest[key] for key in list(nbest)[:5]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="flickr8k_soft")
    parser.add_argument("--split", default="val")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--n-best", type=int, default=0, help="captions kept per image (default: --beam)")
    parser.add_argument("--diversity", type=float, nargs="+", default=[0.5])
    parser.add_argument("--max-images", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    model = load_captioner(args.model, device="cpu")
    records = load_records(model.config.data, args.split)
    if args.max_images:
        records = records[: args.max_images]
    cache = cached_grids(model, records)
    batch_size = model.config.eval.batch_size
    base = model.decode_options.replace_given(beam=args.beam, n_best=args.n_best or args.beam)
    rows = [measure(model, records, base, cache, batch_size)]
    for lam in args.diversity:
        rows.append(measure(model, records, base.replace_given(beam_groups=args.groups, diversity=lam), cache,
                            batch_size))
    result = {"model": args.model, "split": args.split, "images": len(records), "cpu": cpu_model(), "rows": rows}
    for row in rows:
        s = row["top_scores"]
        print(f"groups {row['beam_groups']} lambda {row['diversity']}: distinct captions "
              f"{row['distinct_captions']:.2f}/{row['n_best']}, distinct 4-grams {row['distinct_4grams']:.1f}, "
              f"self-BLEU-4 {row['self_bleu4']:.1f}; top: BLEU-4 {s['BLEU-4']:.2f} METEOR "
              f"{s['METEOR'] if s['METEOR'] is None else round(s['METEOR'], 2)} CIDEr-D {s['CIDEr-D']:.2f} "
              f"({row['decode_s']} s)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
