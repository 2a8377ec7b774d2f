"""The tables people read are generated from records (captioner/reports/): each committed table is what its records
give, a changed record changes every table that shows it, and a page's hand edit is found and overwritten."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from captioner.reports import grounding, sections
from captioner.reports.sections import ReportError, Section, write_tables

ROOT = Path(__file__).resolve().parents[1]


def _copy_checkout(tmp_path: Path) -> Path:
    """The pages and records the tables read, copied (README, docs/, the cards and their config)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for card in (ROOT / "captioner" / "pretrained").iterdir():
        if card.is_dir():
            (tmp_path / "captioner" / "pretrained" / card.name).mkdir(parents=True)
            for name in ("README.md", "config.json"):
                shutil.copy(card / name, tmp_path / "captioner" / "pretrained" / card.name / name)
    return tmp_path


def test_every_committed_table_is_the_one_its_records_give():
    """The check the tables rest on: nothing in README, docs/ or the cards between a pair of markers was typed."""
    assert write_tables(ROOT, check=True) == [], "run: captioner recipe report --write"


def test_a_changed_record_changes_every_table_that_shows_it_and_write_puts_them_right(tmp_path):
    root = _copy_checkout(tmp_path)
    record = root / grounding.ROWS / "shipped_soft.json"  # the default: in the grounding, probe and options tables
    data = json.loads(record.read_text())
    data["scores"]["CIDEr-D"] += 0.5
    record.write_text(json.dumps(data))
    differ = write_tables(root, check=True)
    assert {"docs/grounding.md: grounding-table", "docs/grounding.md: probe-table",
            "docs/training-options.md: options-table"} <= set(differ)
    before = (root / "docs" / "grounding.md").read_text()
    assert write_tables(root, check=True) == differ  # a check writes nothing
    assert (root / "docs" / "grounding.md").read_text() == before
    assert write_tables(root) == differ
    assert write_tables(root, check=True) == []
    assert f"{data['scores']['CIDEr-D']:.2f}" in (root / "docs" / "grounding.md").read_text()


def test_a_hand_edit_between_the_markers_is_found_and_overwritten_and_the_rest_of_the_page_is_kept(tmp_path):
    root = _copy_checkout(tmp_path)
    page = root / "docs" / "training-options.md"
    text = page.read_text()
    start = text.index("<!-- options-table:start -->")
    edited = text[:start] + "Prose above, kept.\n" + text[start:].replace("| label smoothing 0.1 |",
                                                                          "| label smoothing 0.1 (typed) |", 1)
    page.write_text(edited)
    assert write_tables(root, check=True) == ["docs/training-options.md: options-table"]
    write_tables(root)
    assert page.read_text() == text[:start] + "Prose above, kept.\n" + text[start:]


def test_a_page_without_its_markers_is_refused_naming_the_page_and_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# no markers\n")
    table = Section("lonely-table", "page.md", lambda root: "| a |")
    with pytest.raises(ReportError, match=r"page\.md.*<!-- lonely-table:start -->"):
        sections.current(page.read_text(), table, page)
    with pytest.raises(ReportError, match="no generated table is named 'nope'|nope"):
        write_tables(tmp_path, check=True, only=["nope"])


def test_the_report_command_checks_and_names_what_differs(capsys):
    from captioner.commands.recipe import main

    assert main(["report", "--check"]) == 0
    assert "every generated table matches its records" in capsys.readouterr().out
    assert main(["report", "--check", "--table", "nope"]) == 1
    assert "no generated table is named nope" in capsys.readouterr().err


def test_every_shipped_model_has_a_rebuild_record_that_evaluated_the_file_that_ships():
    """Each model in captioner/pretrained/ was rebuilt by its recipe, and the record's other side is the shipped file
    itself: the run's evaluation of it gives the very scores its config.json was exported with."""
    from captioner.reports.rebuilds import FOLDER
    from captioner.store.zoo import scan_models

    shipped, damaged = scan_models()  # the package's model folders and their config.json, as `captioner` finds them
    assert shipped and not damaged, (sorted(shipped), damaged)
    for name, meta in shipped.items():
        path = ROOT / FOLDER / f"{name}.json"
        assert path.is_file(), f"{name} ships but has no rebuild record ({path}): run `captioner recipe run {name}`"
        record = json.loads(path.read_text())
        assert record["recipe"] == name and record["compared"]["model"] == name, path
        exported = meta["scores"]  # the evaluation the folder was exported with
        assert record["compared"]["result"]["scores"] == exported["scores"], path
        paired = record["compared"]["paired"]["CIDEr-D"]
        assert paired["B"] == pytest.approx(record["scores"]["CIDEr-D"]), path
        assert paired["A"] == pytest.approx(exported["scores"]["CIDEr-D"]), path
