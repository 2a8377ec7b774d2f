"""The history pages' and the model cards' results tables are generated from records (captioner/reports/history.py,
cards.py): the committed tables are what the records give, each table changes when a record it shows changes, and a
run shown in several tables is read from one record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from captioner.reports import cards, history
from captioner.reports.sections import write_tables

ROOT = Path(__file__).resolve().parents[1]
NAMES = [s.name for s in history.TABLES + cards.TABLES]
MODELS = ("flickr8k_soft", "flickr8k_hard", "flickr8k_grounded")


def _copy_checkout(tmp_path: Path) -> Path:
    """What these tables read: their pages, the records (this page's, the studies' rows, the anchors) and the cards
    with their config.json."""
    for page in {s.file for s in history.TABLES}:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    for folder in ("docs/results", "docs/grounding/rows", "docs/training-options/rows"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    for model in MODELS:
        (tmp_path / "captioner" / "pretrained" / model).mkdir(parents=True)
        for name in ("README.md", "config.json"):
            shutil.copy(ROOT / "captioner/pretrained" / model / name, tmp_path / "captioner/pretrained" / model / name)
    return tmp_path


def _change(path: Path, key: str, new: float | None = None) -> None:
    """Add 1 to a record's figure (or set it to ``new``); ``key`` is a dotted path, list items by index."""
    record = json.loads(path.read_text())
    *parents, last = key.split(".")
    node = record
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = node[last] + 1 if new is None else new
    path.write_text(json.dumps(record))


def test_every_committed_history_and_card_table_is_the_one_its_records_give():
    assert write_tables(ROOT, check=True, only=NAMES) == [], "run: captioner recipe report --write"


# each table, with a record it shows and one of that record's figures
SHOWN = {
    "results-flickr8k": ("docs/results/records/results/soft_xe.json", "scores.BLEU-4"),
    "results-beyond": ("docs/results/records/results/lite2.json", "vocabulary"),
    "results-levers": ("docs/results/records/results/probe_lite0.json", "curve.0.CIDEr-D"),
    "results-issue36": ("docs/results/records/results/soft_finetune_ensemble.json", "distinct_captions"),
    "results-issue36-runs": ("docs/results/records/results/soft_scst_more_mean4.json", "cells_per_caption"),
    "results-shapes": ("docs/results/records/results/shapes_hard.json", "grounding"),
    "flickr8k-first": ("docs/results/records/flickr8k/hard_reinforce_scst.json", "alpha_entropy"),
    "flickr8k-soft-runs": ("docs/results/records/flickr8k/soft_run4.json", "curve.5.val_loss"),
    "flickr8k-reinforce-weight": ("docs/results/records/flickr8k/lambda_r_1.json", "curve.0.val_loss"),
    "flickr8k-scst-epochs": ("docs/results/records/results/soft_scst.json", "curve.2.greedy_reward"),
    "hard-second-soft": ("docs/results/records/hard-attention/from_soft2_scst_more_mean4.json", "columns_stay"),
    "hard-first-soft": ("docs/results/records/hard-attention/from_soft1_gumbel.json", "columns_stay"),
    "hard-probes": ("docs/results/records/hard-attention/probe_c.json", "curve.0.cell_changes"),
    "hard-shapes-reinforce": ("docs/results/records/hard-attention/shapes_lambda_r_0.1_seed2.json", "grounding"),
    "robustness-load-test": ("docs/results/records/robustness/load_test.json", "latency_p95_s"),
    "card-soft-scores": ("captioner/pretrained/flickr8k_soft/config.json", "scores.scores.ROUGE-L"),
    "card-hard-scores": ("docs/results/records/cards/flickr8k_hard_int8_previous.json", "vocabulary"),
    "card-hard-boxes": ("docs/grounding/rows/shipped_hard.json", "boxes.teacher_forced.pointing"),
    "card-hard-mirror": ("captioner/pretrained/flickr8k_hard/config.json", "scores.alpha_entropy"),
    "card-grounded-scores": ("docs/grounding/rows/soft_grounded_scst.json", "scores.BLEU-3"),
    "card-grounded-boxes": ("captioner/pretrained/flickr8k_grounded/config.json",
                            "scores.boxes.teacher_forced.uniform"),
}


def test_every_table_is_listed_with_a_record_it_shows():
    assert sorted(SHOWN) == sorted(NAMES)


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_a_changed_figure_changes_the_table_that_shows_it(tmp_path, name):
    root = _copy_checkout(tmp_path)
    record, key = SHOWN[name]
    _change(root / record, key)
    section = next(s for s in history.TABLES + cards.TABLES if s.name == name)
    assert f"{section.file}: {name}" in write_tables(root, check=True, only=NAMES)


@pytest.mark.parametrize("record, tables", [
    # the first flickr8k_soft: one record behind six tables of three pages and its successor's card
    ("docs/results/records/results/soft_scst.json",
     {"results-flickr8k", "results-beyond", "results-issue36", "results-issue36-runs", "flickr8k-first",
      "hard-first-soft", "card-soft-scores"}),
    # the shipped flickr8k_soft (its grounding record): the results and hard pages and two cards
    ("docs/grounding/rows/shipped_soft.json",
     {"results-flickr8k", "results-issue36", "results-issue36-runs", "hard-second-soft", "card-soft-scores",
      "card-hard-scores"}),
])
def test_a_run_shown_in_several_tables_is_read_from_one_record(tmp_path, record, tables):
    root = _copy_checkout(tmp_path)
    _change(root / record, "scores.CIDEr-D", new=61.23)
    differ = {entry.split(": ")[1] for entry in write_tables(root, check=True, only=NAMES)}
    assert tables <= differ
    write_tables(root, only=NAMES)
    for page in {s.file for s in history.TABLES + cards.TABLES if s.name in tables}:
        assert "61.2" in (root / page).read_text()
    assert write_tables(root, check=True, only=NAMES) == []


def test_writing_a_card_keeps_the_metadata_block_and_the_fingerprint_export_writes(tmp_path):
    root = _copy_checkout(tmp_path)
    _change(root / "captioner/pretrained/flickr8k_hard/config.json", "scores.scores.CIDEr-D")
    card = root / "captioner/pretrained/flickr8k_hard/README.md"
    before = card.read_text()
    assert write_tables(root, only=NAMES) == ["captioner/pretrained/flickr8k_hard/README.md: card-hard-scores"]
    after = card.read_text()
    assert after != before
    for part in (before[:before.index("\n---\n", 4)], before[before.index("## Fingerprint"):]):
        assert part in after
