"""`captioner score RESULTS --references FILE`: score a COCO-format results file, from this project
(``captioner evaluate --results-file``) or any other system, against references in a Karpathy split JSON, COCO
caption annotations or a captions file, with the metrics `captioner evaluate` reports (BLEU-1..4, METEOR,
ROUGE-L, CIDEr-D on the 0-100 scale, after coco-caption's PTB tokenizer when Java is present). captioner/results.py
reads and matches the files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from captioner.data.datasets import SPLITS, DataError
from captioner.metrics import caption_scores, resolve_tokenizer
from captioner.results import ResultsError, match_references, read_references, read_results


def score_file(results_path: str | Path, references_path: str | Path, split: str | None = None,
               tokenizer: str = "auto", meteor: bool = True) -> dict:
    """The scores of a results file against its images' references (all of ``split``'s when one is named)."""
    results = read_results(results_path)
    references = match_references(results, read_references(references_path, split), whole_split=split is not None,
                                  source=Path(references_path))
    tokenizer = resolve_tokenizer(tokenizer)
    return {"scores": caption_scores(results, references, meteor=meteor, tokenizer=tokenizer),
            "tokenizer": tokenizer, "n_images": len(results), "split": split,
            "results": str(results_path), "references": str(references_path)}


def format_scores(result: dict) -> str:
    head = (f"results={result['results']}  references={result['references']}"
            + (f"  split={result['split']}" if result["split"] else "") + f"  images={result['n_images']}")
    rows = [head, f"tokenizer={result['tokenizer']}" + ("  (coco-caption PTB, as published tables)"
                                                         if result["tokenizer"] == "ptb" else ""), "-" * len(head)]
    rows += [f"{name:<10} {'unavailable' if value is None else f'{value:6.2f}'}"
             for name, value in result["scores"].items()]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="captioner score", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help='COCO results file: [{"image_id": ..., "caption": ...}, ...]')
    parser.add_argument("--references", required=True,
                        help="Karpathy split JSON, COCO captions_*.json, or a captions file (.csv / .jsonl)")
    parser.add_argument("--split", choices=SPLITS, default=None,
                        help="score against every image of this split (Karpathy JSON, or a captions file with a "
                             "split column); default: the images of the results file")
    parser.add_argument("--tokenizer", choices=("auto", "ptb", "treebank", "simple"), default="auto",
                        help="as in `captioner evaluate`: auto = ptb when Java is present, else treebank")
    parser.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts a Java process)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        result = score_file(args.results, args.references, args.split, args.tokenizer, meteor=not args.no_meteor)
    except (ResultsError, DataError, ValueError) as err:
        print(f"captioner score: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_scores(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
