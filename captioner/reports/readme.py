"""README's results table: the shipped models beside the anchors, from their records.

Each shipped model's row is its own record, the ``scores`` that ``captioner export --scores`` wrote into
captioner/pretrained/NAME/config.json (`captioner evaluate` of the shipped file itself: val, beam 3); the anchors'
rows are docs/results/anchors.json (the paper's Table 1, and the popular PyTorch port as measured by the issue's
author), each with its source.
"""

from __future__ import annotations

import json
from pathlib import Path

from captioner.reports.sections import Section

ANCHORS = "docs/results/anchors.json"
METRICS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")
# the shipped models, in the order a newcomer should read them, with what each is for
SHIPPED = {
    "flickr8k_soft": "**`flickr8k_soft`**: soft attention, the default",
    "flickr8k_hard": "`flickr8k_hard`: hard attention, one cell per word",
    "flickr8k_grounded": "`flickr8k_grounded`: attention trained on boxes",
}


def read_records(root: Path) -> dict[str, dict]:
    """name -> record: each shipped model's (its config.json's ``scores``), then each anchor's."""
    records = {name: json.loads((root / "captioner" / "pretrained" / name / "config.json").read_text())["scores"]
               for name in SHIPPED}
    return {**records, **json.loads((root / ANCHORS).read_text())}


def _figure(scores: dict, metric: str) -> str:
    value = scores.get(metric)
    if value is None:
        return "–"  # not reported
    return str(value) if isinstance(value, int) else f"{value:.1f}"  # the paper's BLEU-1 is a whole number


def format_table(records: dict[str, dict]) -> str:
    """One row per shipped model, then one per anchor, split and beam as each record says, and where the figures
    come from (a shipped model's card, which has its commands; the anchors' file, which has sources)."""
    lines = ["| model | split | " + " | ".join(METRICS) + " | record |", "|---" * (len(METRICS) + 3) + "|"]
    for name, record in records.items():
        if name in SHIPPED:
            label, source = SHIPPED[name], f"[card](captioner/pretrained/{name}/README.md)"
        else:
            label, source = f"*{record['label']}*", f"[source]({ANCHORS})"
        beam = f", beam {record['beam_size']}" if record.get("beam_size") else ""
        figures = " | ".join(_figure(record["scores"], m) for m in METRICS)
        lines.append(f"| {label} | {record['split']}{beam} | {figures} | {source} |")
    return "\n".join(lines)


TABLES = [Section("results-table", "README.md", lambda root: format_table(read_records(root)))]
