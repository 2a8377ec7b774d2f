"""Resume and logging seams of the training loop: the logged learning rate, a resume that changes the
schedule, and the time budget across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captioner.checkpoint import load_checkpoint
from captioner.config import load_config
from captioner.train import main, train

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("seams_data")


def _cfg(data_root: Path, run_dir: Path, *overrides: str):
    return load_config(SMOKE, [f"data.root={data_root}", f"train.run_dir={run_dir}", "train.num_threads=1",
                               "train.tensorboard=off", *overrides])


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_logged_lr_is_the_one_that_trained_the_epoch(data_root, tmp_path):
    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=2", "train.lr_schedule=cosine", "train.lr=0.002"))
    lrs = [e["lr"] for e in _log(run)]
    assert lrs == pytest.approx([0.002, 0.001])  # cosine over 2 epochs: full rate, then half


def test_resume_refuses_a_changed_schedule(data_root, tmp_path, capsys):
    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1", "train.lr_schedule=cosine"))
    common = ["--resume", str(run), "--set", f"data.root={data_root}", "--set", "train.num_threads=1"]
    assert main(common + ["--set", "train.epochs=3"]) == 1
    assert "train.epochs" in capsys.readouterr().err
    assert main(common + ["--set", "train.lr=0.1"]) == 1
    assert "train.lr" in capsys.readouterr().err


def test_time_budget_counts_across_a_resume(data_root, tmp_path):
    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1"))
    first = load_checkpoint(run / "last.pt")["elapsed_s"]
    assert first > 0
    assert main(["--resume", str(run), "--set", f"data.root={data_root}", "--set", "train.num_threads=1",
                 "--set", "train.epochs=2"]) == 0
    second = load_checkpoint(run / "last.pt")["elapsed_s"]
    assert second >= first + 0.9 * _log(run)[1]["time_s"]  # the second session adds to the first's time
