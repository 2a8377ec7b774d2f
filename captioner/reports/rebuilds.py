"""docs/results.md's table of shipped models rebuilt by their recipes (``captioner recipe run NAME``), from the
records in docs/results/rebuilds/NAME.json (each the recipe's record, runs/recipes/NAME/record.json, as the run wrote
it): each rebuild's scores beside the shipped file's, both measured by that run (the recipe's ``evaluate.compare``),
with the paired interval of the difference, where and how long it ran."""

from __future__ import annotations

from pathlib import Path

from captioner.evaluation.paired import interval_text
from captioner.reports.records import read_rows
from captioner.reports.sections import Section
from captioner.training.recipes import format_duration

FOLDER = "docs/results/rebuilds"


def format_rebuilds(root: Path) -> str:
    """One row per rebuild: the recipe, BLEU-4 / METEOR / CIDEr-D of the rebuild and of the shipped file, the paired
    CIDEr-D difference, the stages' and the evaluation's wall time, the CPU, the evaluation's commit and the date."""
    lines = ["| recipe | rebuilt: BLEU-4 / METEOR / CIDEr-D | shipped file | CIDEr-D rebuilt − shipped, paired 95 % "
             "| pointing − centre, the same | stages + evaluation | CPU, the evaluation's commit, date |",
             "|---" * 7 + "|"]
    for record in read_rows(root / FOLDER).values():
        compared, provenance = record["compared"], record["provenance"]
        paired, shipped = compared["paired"], compared["result"]
        lines.append(
            f"| `captioner recipe run {record['recipe']}` | {_scores(record)} | {_scores(shipped)} | "
            f"{interval_text(paired['CIDEr-D'], 2)} | "
            f"{interval_text(paired['pointing - centre'], 1) if 'pointing - centre' in paired else '–'} | "
            f"{format_duration(record['train_wall_s'])} + {format_duration(record['evaluate_wall_s'])} | "
            f"{provenance['cpu']}, {provenance['commit'][:7]}, {provenance['date'][:10]} |")
    return "\n".join(lines)


def _scores(record: dict) -> str:
    s = record["scores"]
    return f"{s['BLEU-4']:.1f} / {s['METEOR']:.1f} / {s['CIDEr-D']:.2f}"


TABLES = [Section("rebuilds-table", "docs/results.md", format_rebuilds)]
