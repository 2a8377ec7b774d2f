"""The README's results table, generated from records: the shipped models beside the anchors.

    python scripts/readme_table.py          # rewrite the table between README.md's markers
    python scripts/readme_table.py --check  # exit 1 when the README's table is not the one the records give

Each shipped model's row is its own record, the ``scores`` that ``captioner export --scores`` wrote into
captioner/pretrained/NAME/config.json (`captioner evaluate` of the shipped file itself: val, beam 3); the anchors'
rows are docs/results/anchors.json (the paper's Table 1, and the popular PyTorch port as measured by the issue's
author), each with its source. tests/test_readme.py checks that the README's table is this one, so a figure typed
by hand into it, or a record that changes under it, fails there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PRETRAINED = ROOT / "captioner" / "pretrained"
ANCHORS = ROOT / "docs" / "results" / "anchors.json"
START, END = "<!-- results-table:start -->", "<!-- results-table:end -->"
METRICS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")
# the shipped models, in the order a newcomer should read them, with what each is for
SHIPPED = {
    "flickr8k_soft": "**`flickr8k_soft`**: soft attention, the default",
    "flickr8k_hard": "`flickr8k_hard`: hard attention, one cell per word",
    "flickr8k_grounded": "`flickr8k_grounded`: attention trained on boxes",
}


def read_records(pretrained: Path = PRETRAINED, anchors: Path = ANCHORS) -> dict[str, dict]:
    """name -> record: each shipped model's (config.json's ``scores``), then each anchor's."""
    records = {name: json.loads((pretrained / name / "config.json").read_text())["scores"] for name in SHIPPED}
    return {**records, **json.loads(anchors.read_text())}


def _figure(scores: dict, metric: str) -> str:
    value = scores.get(metric)
    if value is None:
        return "–"  # not reported
    return str(value) if isinstance(value, int) else f"{value:.1f}"  # the paper's BLEU-1 is a whole number


def format_table(records: dict[str, dict], anchors: Path = ANCHORS) -> str:
    """The table: one row per shipped model, then one per anchor, split and beam as each record says, and where
    the figures come from (a shipped model's card, which has its commands; the anchors' file, which has sources)."""
    lines = ["| model | split | " + " | ".join(METRICS) + " | record |", "|---" * (len(METRICS) + 3) + "|"]
    for name, record in records.items():
        if name in SHIPPED:
            label, source = SHIPPED[name], f"[card](captioner/pretrained/{name}/README.md)"
        else:
            label, source = f"*{record['label']}*", f"[source]({anchors.relative_to(ROOT).as_posix()})"
        beam = f", beam {record['beam_size']}" if record.get("beam_size") else ""
        figures = " | ".join(_figure(record["scores"], m) for m in METRICS)
        lines.append(f"| {label} | {record['split']}{beam} | {figures} | {source} |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The part of ``text`` between the markers, without the blank edges."""
    if START not in text or END not in text:
        raise ValueError(f"README.md: the markers {START} and {END} are missing")
    return text[text.index(START) + len(START):text.index(END)].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the README's table is up to date")
    args = parser.parse_args(argv)
    text, table = README.read_text(), format_table(read_records())
    if args.check:
        same = readme_table(text) == table
        print("README.md's results table is up to date" if same else "README.md's results table differs: rerun "
              "python scripts/readme_table.py")
        return 0 if same else 1
    readme_table(text)  # the markers are there
    start, end = text.index(START) + len(START), text.index(END)
    README.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
