"""Scoring a COCO-format results file, from this project (``captioner evaluate --results-file``) or any other
system, against references in a Karpathy split JSON, COCO caption annotations or a captions file, with the
metrics `captioner evaluate` reports (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D on the 0-100 scale, after
coco-caption's PTB tokenizer when Java is present): ``score_file`` and its table, ``format_scores``, whose
rows of scores (``score_rows``) `captioner evaluate`'s table shares.
captioner/evaluation/results.py reads and matches the files; ``captioner score`` is captioner/commands/score.py.
"""

from __future__ import annotations

from pathlib import Path

from captioner.evaluation.metrics import caption_scores, resolve_tokenizer
from captioner.evaluation.results import match_references, read_references, read_results


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
    return "\n".join([head, *score_rows(result, head)])


def score_rows(result: dict, head: str) -> list[str]:
    """The lines under a scores table's heading ``head`` (``format_scores`` here, ``format_table`` in
    captioner/evaluation/split.py): the tokenizer, a rule as wide as the heading, one line per caption score."""
    note = ("  (coco-caption PTB, as published tables)" if result["tokenizer"] == "ptb"
            else "  (not PTB: scores differ slightly from published tables)")
    rows = [f"tokenizer={result['tokenizer']}{note}", "-" * len(head)]
    rows += [f"{name:<10} {'unavailable' if value is None else f'{value:6.2f}'}"
             for name, value in result["scores"].items()]
    return rows
