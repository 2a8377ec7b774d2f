"""Resume and logging seams of the training loop: the logged learning rate, a resume that changes the
schedule, the time budget across a resume, a resume from an earlier checkpoint or with another process
count (refused), and fp16's gradient scaler across a resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from captioner.commands.train import main
from captioner.config import load_config
from captioner.store.checkpoint import load_checkpoint
from captioner.training.loop import train

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


def _falling_scores(monkeypatch):
    """Validation scores that fall every epoch, so best.pt stays at epoch 1 while last.pt moves on."""
    import captioner.training.validation as validation_mod

    calls = []

    def score(predictions, references, meteor=False):
        calls.append(1)
        return {"BLEU-4": 50.0 - len(calls), "CIDEr-D": 50.0 - len(calls)}

    monkeypatch.setattr(validation_mod, "caption_scores", score)


def test_resume_from_an_earlier_best_pt_is_refused_and_the_advice_works(data_root, tmp_path, monkeypatch, capsys):
    """`--resume RUN/best.pt` is refused (it would rewrite metrics.jsonl from best.pt's history, losing the
    later epochs) with the way to branch a copy, and following that way keeps both."""
    _falling_scores(monkeypatch)
    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=2"))
    assert load_checkpoint(run / "best.pt")["epoch"] == 1 and len(_log(run)) == 2
    common = ["--set", f"data.root={data_root}", "--set", "train.num_threads=1", "--set", "train.epochs=3"]
    assert main(["--resume", str(run / "best.pt"), *common]) == 1
    err = capsys.readouterr().err
    assert "best.pt holds the state after epoch 1, but the run went on to epoch 2" in err
    assert f"--resume {run}." in err and "cp -r" in err
    assert [e["epoch"] for e in _log(run)] == [1, 2]  # the run's history is untouched
    branch = tmp_path / "run-from-best"
    assert f"cp -r {run} {branch} && cp {run / 'best.pt'} {branch / 'last.pt'}" in err
    shutil.copytree(run, branch)
    shutil.copy(run / "best.pt", branch / "last.pt")
    assert main(["--resume", str(branch), *common]) == 0
    assert [e["epoch"] for e in _log(branch)] == [1, 2, 3]  # epochs 2 and 3 trained again from best.pt ...
    assert [e["epoch"] for e in _log(run)] == [1, 2]  # ... and the original run keeps its own


def test_resume_with_another_process_count_is_refused(data_root, tmp_path, monkeypatch, capsys):
    """Resuming with more processes than were saved is refused: it would hand rank 0's RNG state to the new
    ranks."""
    import captioner.training.loop as train_mod

    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1"))
    monkeypatch.setattr(train_mod, "setup_distributed", lambda device, *settings: (0, 2, torch.device("cpu")))
    assert main(["--resume", str(run), "--set", f"data.root={data_root}", "--set", "train.epochs=2"]) == 1
    err = capsys.readouterr().err
    assert "saved by 1 process(es) and this resume runs 2" in err and "--init" in err
    assert load_checkpoint(run / "last.pt")["epoch"] == 1


def test_resume_restores_the_gradient_scaler(data_root, tmp_path, monkeypatch):
    """fp16's loss scaler (here an enabled CPU GradScaler standing in for CUDA's, with a scale that doubles
    every two steps) is saved and restored: 1 + resume + 1 epochs end with the scale, growth tracker and
    weights of 2 straight epochs. Before, the scaler was not saved and restarted from its initial scale."""
    import captioner.training.loop as train_mod

    monkeypatch.setattr(train_mod, "_make_scaler",
                        lambda device, enabled: torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=2))
    straight = train(_cfg(data_root, tmp_path / "straight", "train.epochs=2"))
    first = train(_cfg(data_root, tmp_path / "resumed", "train.epochs=1"))
    halfway = load_checkpoint(first / "last.pt")["scaler"]
    assert halfway["scale"] > 2.0  # the scale has moved: restarting it would show
    assert main(["--resume", str(first), "--set", "train.epochs=2"]) == 0
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(first / "last.pt")
    assert a["scaler"] == b["scaler"] and b["scaler"]["scale"] > halfway["scale"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_an_objective_switched_on_resume_keeps_training_with_its_own_fresh_state():
    """A leave-one-out run resumed with train.objective.kind=reinforce ended in KeyError: 'baseline' (a loo
    checkpoint saves its objective state as {}): the REINFORCE baseline now starts unset, as in a new run."""
    from types import SimpleNamespace

    from captioner.objective_sections import ReinforceConfig
    from captioner.training.objectives.location import Reinforce

    objective = Reinforce(ReinforceConfig(), SimpleNamespace(box_targets=None))
    objective.load_state_dict({})  # what a loo, gumbel or scst checkpoint holds
    assert objective.baseline is None
    objective.after_step(2.0)
    assert objective.baseline == 2.0
    objective.load_state_dict({"baseline": 1.5})
    assert objective.baseline == 1.5
