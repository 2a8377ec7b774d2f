"""Tables from records (issue 72): the pieces the history pages' and the model cards' tables are made of.

A column is a header and a cell, a function of a record that gives its text (None: the record lacks the figure); a
row is a label, the record (or records) it shows and the texts of its word columns. ``Records`` reads records by
reference, wherever the run that made them wrote them: ``PAGE/NAME`` (docs/results/records, the runs only the history
pages show, copied from the pages at the precision they gave), ``grounding:NAME`` and ``options:NAME`` (the studies'
rows), ``anchors:NAME`` (docs/results/anchors.json) and ``card:MODEL`` (a shipped model's config.json ``scores``).
Every number a table shows is a record's; the words (labels, bold marks, commands) are the renderer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from captioner.reports.grounding import ROWS as GROUNDING
from captioner.reports.options import ROWS as OPTIONS
from captioner.reports.readme import ANCHORS
from captioner.reports.records import read_record
from captioner.reports.sections import ReportError

RECORDS = "docs/results/records"  # PAGE/NAME.json: the runs no study of their own records
SCORES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")
MINUS = "\u2212"  # the pages' minus sign

Record = dict[str, Any]
Cell = Callable[[Record], str | None]  # a record's text in one column; None: the record lacks the figure
Column = tuple[str, Cell | None]  # (header, cell); a None cell takes the row's next text


class Records:
    """The records under a checkout ``root``, by reference: ``PAGE/NAME`` (docs/results/records), ``grounding:NAME``,
    ``options:NAME`` (the studies' rows), ``anchors:NAME`` (docs/results/anchors.json) and ``card:MODEL`` (the
    shipped model's config.json ``scores``: the evaluation of the shipped file itself)."""

    def __init__(self, root: Path):
        self.root = root
        self._read: dict[str, Record] = {}

    def __getitem__(self, ref: str) -> Record:
        if ref not in self._read:
            self._read[ref] = self._load(ref)
        return self._read[ref]

    def _load(self, ref: str) -> Record:
        store, sep, name = ref.partition(":")
        if not sep:
            return read_record(self.root / RECORDS / f"{ref}.json")
        if store in ("grounding", "options"):
            return read_record(self.root / (GROUNDING if store == "grounding" else OPTIONS) / f"{name}.json")
        if store == "anchors":
            return read_record(self.root / ANCHORS)[name]
        if store == "card":
            return read_record(self.root / "captioner" / "pretrained" / name / "config.json")["scores"]
        raise ReportError(f"unknown record store {store!r} in {ref!r} (grounding, options, anchors, card; or PAGE/NAME "
                          f"for {RECORDS})")


def figure(record: Record, name: str) -> Any:
    """A figure of a record (or of one epoch of its curve): a score by its name, anything else by its key or dotted
    path (``boxes.generated.pointing``); None where the record lacks it."""
    value: Any = record.get("scores", record) if name in SCORES else record
    for key in [name] if name in SCORES else name.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def epoch(record: Record, number: int) -> Record:
    """The figures of one epoch of a record's curve (greedy validation, losses, rewards)."""
    for entry in record["curve"]:
        if entry["epoch"] == number:
            return entry
    raise ReportError(f"{record['name']}: no epoch {number} in its curve")


# --------------------------------------------------------------------------- cells


def num(name: str, digits: int, scale: float = 1, unit: str = "") -> Cell:
    """The figure to ``digits`` decimals (times ``scale``, then ``unit``)."""
    def cell(record: Record) -> str | None:
        value = figure(record, name)
        return None if value is None else f"{scale * value:.{digits}f}{unit}"
    return cell


def pct(name: str, digits: int = 1) -> Cell:
    """A share as a percentage."""
    return num(name, digits, 100, " %")


def joined(*cells: Cell) -> Cell:
    """Several figures in one column, "a / b / c"; None unless the record has them all."""
    def cell(record: Record) -> str | None:
        parts = [c(record) for c in cells]
        return None if None in parts else " / ".join(parts)  # type: ignore[arg-type]
    return cell


def scores(*names: str, digits: int = 1) -> list[Column]:
    return [(name, num(name, digits)) for name in names]


def signed(value: float, digits: int) -> str:
    """A difference with its sign, "+1.3" or "−0.8"."""
    return f"{value:+.{digits}f}".replace("-", MINUS)


def hours(seconds: float) -> str:
    """A wall time over an hour, to the minute: "1 h 52 min"."""
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m} min"


def epochs(n: int) -> str:
    return f"{n} epoch" + ("s" if n != 1 else "")


MIRROR = joined(pct("mirror_follow"), pct("columns_mirror"), pct("columns_stay"))
COLUMNS = joined(pct("columns_mirror"), pct("columns_stay"))


def pointing(record: Record) -> str | None:
    """The boxes on the record's own captions: pointing (the centre cell's) / the attention inside."""
    if figure(record, "boxes.generated.pointing") is None:
        return None
    return (f"{pct('boxes.generated.pointing')(record)} ({pct('boxes.generated.centre_pointing')(record)}) / "
            f"{num('boxes.generated.inside', 3)(record)}")


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Row:
    """A row: its label; the record its figures come from (several: shown "a / b" in each column); the texts of the
    table's word columns, in order; the headers whose lead figure is bold; cells given whole by header (a text, or a
    cell formatting the record otherwise than the column does); what a missing figure reads."""

    label: str
    record: Record | tuple[Record, ...] | None = None
    texts: tuple[str, ...] = ()
    bold: tuple[str, ...] = ()
    italic: bool = False
    cells: Mapping[str, str | Cell] = field(default_factory=dict)
    missing: str | None = None


def given(label: str, columns: Sequence[Column], *texts: str) -> Row:
    """A row with no record (a target): every cell given."""
    return Row(label, cells=dict(zip((header for header, _ in columns), texts)))


def _apply(cell: Cell, record: Record | tuple[Record, ...] | None) -> str | None:
    if record is None:
        return None
    if not isinstance(record, tuple):
        return cell(record)
    parts = [cell(r) for r in record]
    if all(p is None for p in parts):
        return None
    texts = [p or "—" for p in parts]  # —: that run lacks the figure
    if any(" / " in t for t in texts):
        return "; ".join(texts)
    if all(t.endswith(" %") or t == "—" for t in texts) and texts[-1].endswith(" %"):
        texts = [t.removesuffix(" %") for t in texts[:-1]] + texts[-1:]  # the unit once: "91.3 / 85.0 %"
    return " / ".join(texts)


def _bold(text: str) -> str:
    """Bold the lead figure: the text before its first " (" or " / "."""
    cut = min((i for i in (text.find(" ("), text.find(" / ")) if i >= 0), default=len(text))
    return f"**{text[:cut]}**{text[cut:]}"


def _line(cells: Sequence[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def table(label: str, columns: Sequence[Column], rows: Sequence[Row], missing: str = "") -> str:
    """A Markdown table: the label column, then ``columns``; a figure a row's record lacks reads ``missing``."""
    lines = [_line([label, *(header for header, _ in columns)]), "|" + "---|" * (len(columns) + 1)]
    for row in rows:
        texts = iter(row.texts)
        cells = [row.label]
        for header, cell in columns:
            chosen = row.cells.get(header, cell)
            if chosen is None:
                text = next(texts, None)
                if text is None:
                    raise ReportError(f"row {row.label!r}: no text for the column {header!r}")
            else:
                text = chosen if isinstance(chosen, str) else _apply(chosen, row.record)
            if text is None:
                text = missing if row.missing is None else row.missing
            cells.append(_bold(text) if header in row.bold and text else text)
        if next(texts, None) is not None:
            raise ReportError(f"row {row.label!r}: more texts than word columns")
        lines.append(_line([f"*{c}*" if row.italic and c else c for c in cells]))
    return "\n".join(lines)


def anchor_rows(r: Records) -> list[Row]:
    """The port's and the paper's rows of a Flickr8k table whose word columns are the wall time and the command
    (italic: not measured here)."""
    port, soft, hard = r["anchors:pytorch_port"], r["anchors:xu2015_soft"], r["anchors:xu2015_hard"]
    return [Row(f"the popular PyTorch port, same features, {port['train_minutes']} min (test split)", port,
                (f"{port['train_minutes']} min ({port['captions_per_s']} captions/s)",
                 "measured by the issue's author, `../shared/data/flickr8k/README.md`"),
                italic=True, missing=""),
            # the paper gives BLEU-1 as a whole number
            Row("Xu et al. 2015, Table 1, VGG (test split)", (soft, hard), ("", "soft / hard"), italic=True, missing="",
                cells={"BLEU-1": num("BLEU-1", 0)})]
