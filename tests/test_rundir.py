"""One RunDir knows a run folder's files (captioner/store/rundir.py): the package spells none of their names
elsewhere, and a checkpoint path that is a run folder loads best.pt, else last.pt."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from captioner.store.checkpoint import CheckpointError, resolve_checkpoint_path
from captioner.store.rundir import RunDir

PACKAGE = Path(__file__).resolve().parents[1] / "captioner"
RUN_FILES = ("config.yaml", "vocab.json", "last.pt", "best.pt", "metrics.jsonl", "averaged.pt", "finished.json",
             "summary.json", "run.json")


def test_the_run_folders_files_are_named_in_one_place():
    spelled = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
               for path in sorted(PACKAGE.rglob("*.py")) if path.name != "rundir.py"
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"[\"'](" + "|".join(map(re.escape, RUN_FILES)) + r")[\"']", line)]
    assert spelled == []


def test_paths_and_the_checkpoint_a_folder_stands_for(tmp_path):
    run = RunDir(tmp_path)
    assert (run.best, run.last, run.epoch(7)) == (tmp_path / "best.pt", tmp_path / "last.pt",
                                                  tmp_path / "epochs" / "epoch-007.pt")
    assert (run.run_file, run.previous("20261203-111500")) == (tmp_path / "run.json",
                                                               tmp_path / "previous-20261203-111500")
    assert run.checkpoint() is None
    with pytest.raises(CheckpointError, match="without best.pt or last.pt"):
        resolve_checkpoint_path(tmp_path)
    run.last.write_bytes(b"")
    assert run.checkpoint() == run.last == resolve_checkpoint_path(tmp_path)
    run.best.write_bytes(b"")
    assert run.checkpoint() == run.best == resolve_checkpoint_path(tmp_path)
    run.epochs.mkdir()
    for n in (2, 10, 1):
        run.epoch(n).write_bytes(b"")
    assert [p.name for p in run.epoch_snapshots()] == ["epoch-001.pt", "epoch-002.pt", "epoch-010.pt"]
    assert Path(run) == tmp_path and str(run) == str(tmp_path)
