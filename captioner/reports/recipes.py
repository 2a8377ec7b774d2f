"""The table of the recipes' records (``captioner recipe report [PATH ...]``): one row per record, its recipe (and
variant), split, beam, BLEU-4, METEOR, CIDEr-D, wall time and date."""

from __future__ import annotations

from pathlib import Path

from captioner.training.recipe_runs import read_json, score_text
from captioner.training.recipes import RecipeError, format_duration, load_recipes, shipped_recipes

REPORT_COLUMNS = ("recipe", "split", "beam", "BLEU-4", "METEOR", "CIDEr-D", "wall time", "date", "record")


def find_records(paths: list[str] | None = None) -> list[Path]:
    """The record files under ``paths`` (a record file, or a folder searched for record.json); none given: the
    shipped recipes' record paths and runs/recipes/ under the working folder."""
    found: list[Path] = []
    if paths:
        for text in paths:
            path = Path(text)
            if not path.exists():
                raise RecipeError(f"{text}: no such record file or folder")
            found += [path] if path.is_file() else sorted(path.rglob("record.json"))
    else:
        found += [Path(r.record) for f in shipped_recipes().values() for r in load_recipes(f)
                  if r.variant is None]
        found += sorted(Path("runs/recipes").glob("*/record.json"))
    unique = {p.resolve(): p for p in found if p.is_file()}
    return list(unique.values())


def format_report(paths: list[Path]) -> str:
    """A Markdown table, one row per record: the recipe, split, beam, BLEU-4, METEOR, CIDEr-D, wall time."""
    lines = ["| " + " | ".join(REPORT_COLUMNS) + " |", "|" + "---|" * len(REPORT_COLUMNS)]
    for path in paths:
        record = read_json(path) or {}
        scores = record.get("scores", {})
        name = record.get("recipe", "?") + (f"/{record['variant']}" if record.get("variant") else "")
        row = [name, str(record.get("split", "?")), str(record.get("beam_size", "?")),
               *(score_text(scores.get(metric)) for metric in ("BLEU-4", "METEOR", "CIDEr-D")),
               format_duration(record["wall_s"]) if record.get("wall_s") is not None else "–",
               str(record.get("provenance", {}).get("date", "?"))[:10], str(path)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
