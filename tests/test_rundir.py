"""One RunDir knows a run folder's files (captioner/store/rundir.py), and a checkpoint path that is a run folder
loads best.pt, else last.pt. That a run writes nothing RunDir does not name is checked on real runs
(tests/test_averaging.py, tests/test_end_to_end.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from captioner.store.checkpoint import CheckpointError, resolve_checkpoint_path
from captioner.store.rundir import RunDir


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
