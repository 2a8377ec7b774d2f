"""`captioner score RESULTS --references FILE`: score a COCO-format results file, from this project
(``captioner evaluate --results-file``) or any other system, against references in a Karpathy split JSON, COCO
caption annotations or a captions file, with the metrics `captioner evaluate` reports (BLEU-1..4, METEOR,
ROUGE-L, CIDEr-D on the 0-100 scale, after coco-caption's PTB tokenizer when Java is present).
captioner/evaluation/results.py reads and matches the files.

`captioner score --compare A B --references FILE`: two results files of the same photos compared, each metric's
difference B - A with its paired bootstrap 95 % interval (the photos resampled, seeded; evaluation/paired.py); files
written by `captioner evaluate --entities --results-file` carry each photo's box figures, and pointing and the
attention inside are compared too.

The scoring is captioner/evaluation/score.py's (``score_file``, ``format_scores``); this module is the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from captioner.commands.arguments import add_scoring_flags, int_at_least
from captioner.data.records import DataError
from captioner.evaluation.results import ResultsError
from captioner.evaluation.score import format_scores, score_file
from captioner.names import SPLITS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="captioner score", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=None,
                        help='COCO results file: [{"image_id": ..., "caption": ...}, ...]')
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                        help="compare two results files of the same photos: B - A per metric, with its paired "
                             "bootstrap 95 %% interval")
    parser.add_argument("--resamples", type=int_at_least(1000), default=2000,
                        help="--compare: bootstrap resamples of the photos (default 2000, at least 1000)")
    parser.add_argument("--seed", type=int, default=0, help="--compare: the resampling seed (default 0)")
    parser.add_argument("--references", required=True,
                        help="Karpathy split JSON, COCO captions_*.json, or a captions file (.csv / .jsonl)")
    parser.add_argument("--split", choices=SPLITS, default=None,
                        help="score against every image of this split (Karpathy JSON, or a captions file with a "
                             "split column); default: the images of the results file")
    add_scoring_flags(parser)  # --tokenizer, --no-meteor
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if (args.results is None) == (args.compare is None):
        parser.error("give one results file, or --compare A B")
    try:
        if args.compare:
            from captioner.evaluation.paired import compare_files, format_comparison

            result = compare_files(*args.compare, args.references, args.split, args.tokenizer,
                                   meteor=not args.no_meteor, resamples=args.resamples, seed=args.seed)
            print(json.dumps(result, indent=2) if args.json else format_comparison(result))
            return 0
        result = score_file(args.results, args.references, args.split, args.tokenizer, meteor=not args.no_meteor)
    except (ResultsError, DataError, ValueError) as err:
        print(f"captioner score: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_scores(result))
    return 0
