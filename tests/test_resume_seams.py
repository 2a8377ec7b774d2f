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


def _payload(in_epoch: dict | None, **train) -> dict:
    return {"in_epoch": in_epoch, "config": {"train": {"batch_size": 16, "seed": 0, **train}}}


def test_a_resume_inside_an_epoch_refuses_another_batch_size_seed_or_training_set():
    """Each key that changes which items the epoch's first batches held is named; an epoch-end checkpoint (no
    in_epoch) may change them all; a checkpoint saved before train_items was stored compares its per-process
    share (items)."""
    from captioner.config import ConfigError
    from captioner.training.resume import check_resumed_inside_epoch

    part = {"epoch": 2, "batches": 5, "items": 60, "train_items": 120}
    changed = load_config(SMOKE, ["train.batch_size=8", "train.seed=3"])
    same = load_config(SMOKE)
    check_resumed_inside_epoch(_payload(part), same, 120, 2, "runs/x")  # the same: nothing to refuse
    check_resumed_inside_epoch(_payload(None), changed, 90, 2, "runs/x")  # an epoch's end: anything goes
    with pytest.raises(ConfigError) as refused:
        check_resumed_inside_epoch(_payload(part), changed, 90, 2, "runs/x")
    message = str(refused.value)
    assert "--resume runs/x: last.pt was saved inside epoch 3, after its batch 5" in message
    assert "train.batch_size is 8 but the epoch began with 16" in message
    assert "train.seed is 3 but the epoch began with 0" in message
    assert "the training set holds 90 items but the epoch began with 120" in message
    assert "a last.pt saved at an epoch's end may change" in message
    with pytest.raises(ConfigError, match=r"the training set holds 121 items") as refused:
        check_resumed_inside_epoch(_payload(part), same, 121, 2, "runs/x")
    assert "train.batch_size is" not in str(refused.value) and "train.seed is" not in str(refused.value)
    older = {k: v for k, v in part.items() if k != "train_items"}
    check_resumed_inside_epoch(_payload(older), same, 119, 2, "runs/x")  # 60 a process all the same
    with pytest.raises(ConfigError, match=r"gives each process 61 items but the epoch began with 60"):
        check_resumed_inside_epoch(_payload(older), same, 122, 2, "runs/x")


def test_a_checkpoint_saved_inside_an_epoch_resumes_only_with_its_batch_size_and_seed(data_root, tmp_path,
                                                                                      monkeypatch, capsys,
                                                                                      wrap_objective_loss):
    """A run stopped inside its first epoch (SIGTERM after batch 2) is refused with another train.batch_size and
    train.seed (before, it skipped 2 x 8 items of another order), ends the epoch with its own, and from that
    epoch-end checkpoint trains on with the new ones."""
    import os
    import signal

    import captioner.training.loop as loop_mod

    steps = {"n": 0}

    def signal_at_second_step(loss, forward, batch):
        steps["n"] += 1
        if steps["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # noted: the step finishes, last.pt is saved, the run stops
        return loss(forward, batch)

    run = tmp_path / "run"
    with monkeypatch.context() as mp:
        mp.setattr(loop_mod, "build_objective", loop_mod.build_objective)  # undone after: the wrap below
        wrap_objective_loss(signal_at_second_step)
        with pytest.raises(loop_mod.TrainingError, match="stopped by SIGTERM inside epoch 1, after its batch 2"):
            train(_cfg(data_root, run, "train.epochs=1"))
    assert load_checkpoint(run / "last.pt")["in_epoch"]["batches"] == 2
    common = ["--resume", str(run), "--set", f"data.root={data_root}", "--set", "train.num_threads=1"]
    new = ["--set", "train.batch_size=8", "--set", "train.seed=3"]
    assert main(common + new) == 1
    err = capsys.readouterr().err
    assert "train.batch_size is 8 but the epoch began with 16" in err and "train.seed is 3" in err
    assert load_checkpoint(run / "last.pt")["in_epoch"]["batches"] == 2  # untouched
    assert main(common) == 0  # the epoch ends as it began
    assert load_checkpoint(run / "last.pt")["in_epoch"] is None
    assert main(common + new + ["--set", "train.epochs=2"]) == 0  # an epoch's end may change them
    assert [e["epoch"] for e in _log(run)] == [1, 2]
    assert load_checkpoint(run / "last.pt")["config"]["train"]["batch_size"] == 8


def test_a_bare_run_folder_name_starts_the_run_there_and_the_same_command_resumes_it(data_root, tmp_path,
                                                                                     monkeypatch, capsys):
    """`--resume myrun` (no slash) for a run not started yet starts it in ./myrun, as `--resume runs/x` does, rather
    than failing "checkpoint not found: myrun"; the same command again continues that run (its id kept, nothing
    moved aside as a new run would). A missing name that looks like a checkpoint file, or a shipped model's name,
    is not a run folder."""
    from captioner.training.resume import nothing_to_resume

    monkeypatch.chdir(tmp_path)
    assert nothing_to_resume("myrun") and nothing_to_resume("runs/x")
    assert not nothing_to_resume("last.pt") and not nothing_to_resume("flickr8k")
    command = ["--config", str(SMOKE), "--resume", "myrun", "--set", f"data.root={data_root}",
               "--set", "train.num_threads=1", "--set", "train.tensorboard=off", "--set", "train.epochs=1"]
    assert main(command) == 0
    run = tmp_path / "myrun"
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    assert main(command + ["--set", "train.epochs=2"]) == 0  # the requeue: the same folder, continued
    assert json.loads((run / "run.json").read_text())["run_id"] == run_id
    assert not list(run.glob("previous-*")) and [e["epoch"] for e in _log(run)] == [1, 2]
    capsys.readouterr()
    assert main(["--config", str(SMOKE), "--resume", "missing.pt"]) == 1
    assert "checkpoint not found: missing.pt" in capsys.readouterr().err
