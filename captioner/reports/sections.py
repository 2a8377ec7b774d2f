"""Every generated table of the checkout, where it sits and how it is rendered from records; writing and checking
them (``captioner recipe report --write`` / ``--check``).

A table sits in a Markdown file between the lines ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; the text between
them is the renderer's output alone, so a hand edit is overwritten by ``--write`` and fails ``--check``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from captioner.atomic import write_text_atomic

# the checkout the package runs from: README.md, docs/ and the records live there
ROOT = Path(__file__).resolve().parents[2]

# the modules that define tables (each a TABLES list of Section), in the order they are written
TABLE_MODULES = ("captioner.reports.readme", "captioner.reports.family", "captioner.reports.grounding",
                 "captioner.reports.options", "captioner.reports.cards", "captioner.reports.history",
                 "captioner.reports.rebuilds")


class ReportError(ValueError):
    """A page without its markers, or a checkout without its pages."""


@dataclass(frozen=True)
class Section:
    """A generated table: its marker name, the file it sits in (relative to the checkout) and its renderer, which
    reads records under the checkout ``root`` and returns the Markdown between the markers."""

    name: str
    file: str
    render: Callable[[Path], str]

    @property
    def markers(self) -> tuple[str, str]:
        return f"<!-- {self.name}:start -->", f"<!-- {self.name}:end -->"


def sections() -> list[Section]:
    """Every generated table, from the modules in TABLE_MODULES that exist."""
    out: list[Section] = []
    for module in TABLE_MODULES:
        try:
            tables = importlib.import_module(module).TABLES
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            continue
        out += tables
    names = [s.name for s in out]
    for name in names:
        if names.count(name) > 1:
            raise ReportError(f"two generated tables are named {name!r}")
    return out


def current(text: str, section: Section, path: Path) -> str:
    """The text between ``section``'s markers in ``text`` (the page at ``path``), without its blank edges."""
    start, end = section.markers
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ReportError(f"{path}: expected the marker lines {start} and {end} once each, in that order")
    return text[text.index(start) + len(start):text.index(end)].strip("\n")


def replaced(text: str, section: Section, path: Path, body: str) -> str:
    current(text, section, path)  # the markers are there
    start, end = section.markers
    return text[:text.index(start) + len(start)] + "\n" + body + "\n" + text[text.index(end):]


def write_tables(root: Path = ROOT, check: bool = False, only: list[str] | None = None) -> list[str]:
    """Render every table (or those named in ``only``) from the records under ``root``; ``check``: write nothing.
    Returns "FILE: NAME" of each table that differed from its page (and, unless ``check``, was rewritten)."""
    chosen = sections()
    if only:
        unknown = sorted(set(only) - {s.name for s in chosen})
        if unknown:
            raise ReportError(f"no generated table is named {', '.join(unknown)} (they are: "
                              f"{', '.join(s.name for s in chosen)})")
        chosen = [s for s in chosen if s.name in only]
    differ: list[str] = []
    texts: dict[Path, str] = {}
    for section in chosen:
        path = root / section.file
        if path not in texts:
            if not path.is_file():
                raise ReportError(f"{path}: no such page; the tables are written in a checkout of the project")
            texts[path] = path.read_text(encoding="utf-8")
        body = section.render(root).strip("\n")
        if current(texts[path], section, path) != body:
            differ.append(f"{section.file}: {section.name}")
            texts[path] = replaced(texts[path], section, path, body)
    if not check:
        for path, text in texts.items():
            if text != path.read_text(encoding="utf-8"):
                write_text_atomic(path, text)
    return differ
