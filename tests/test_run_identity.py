"""Run folders know which run they hold (issue 45): a new run moves an earlier run's files aside
(training/run_files.start_clean), every run has an id that its checkpoints and snapshots carry, and averaging
(train.average_last, `captioner average --run`) takes only this run's kept epochs (checkpoint.last_snapshots)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captioner.commands import average
from captioner.commands.train import main as train_main
from captioner.config import load_config
from captioner.store.checkpoint import CheckpointError, last_snapshots, load_checkpoint, run_identity, save_checkpoint
from captioner.store.rundir import RunDir
from captioner.training.run_files import start_clean

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
VOCAB = {"words": ["<pad>", "<start>", "<end>", "<unk>", "a"]}


def _snapshot(run: RunDir, epoch: int, run_id: str | None, value: float | None = None) -> Path:
    """A weights-only snapshot of ``epoch`` as the training loop keeps it (run_id None: an earlier version's)."""
    payload = {"model": {"w": torch.full((3,), float(epoch if value is None else value))},
               "config": {"model": {"decoder": {"hidden_dim": 4}}}, "vocab": VOCAB, "epoch": epoch, "step": 2 * epoch}
    if run_id is not None:
        payload["run_id"] = run_id
    save_checkpoint(run.epoch(epoch), payload)
    return run.epoch(epoch)


def _last(run: RunDir, epoch: int, run_id: str | None) -> None:
    payload = {"model": {}, "config": {}, "vocab": VOCAB, "epoch": epoch}
    if run_id is not None:
        payload["run_id"] = run_id
    save_checkpoint(run.last, payload)


def test_only_the_runs_own_epochs_are_averaged_and_too_few_are_refused_naming_the_files(tmp_path):
    """The reproduction of issue 45: another run's epochs 3 and 4 in the folder, this run's 1 and 2. The last two
    are this run's 1 and 2; a snapshot past last.pt's epoch (written just before a kill) is not taken; asking for
    three is refused, naming what was taken and what was skipped and why."""
    run = RunDir(tmp_path)
    for epoch in (3, 4):
        _snapshot(run, epoch, "old")
    for epoch in (1, 2):
        _snapshot(run, epoch, "new")
    _last(run, 2, "new")
    assert run_identity(run.root) == ("new", 2)
    assert last_snapshots(run.root, 2, "new", 2, "k") == [run.epoch(1), run.epoch(2)]
    assert last_snapshots(run.root, 0, "new", 2, "k") == [run.epoch(1), run.epoch(2)]  # 0: all of the run's
    with pytest.raises(CheckpointError) as info:
        last_snapshots(run.root, 3, "new", 2, "train.average_last=3")
    message = str(info.value)
    assert message.startswith(f"train.average_last=3: {run} kept only 2 epochs of its run (run_id new), 3 needed")
    assert "epoch-001.pt, epoch-002.pt" in message and "epoch-004.pt (another run's, run_id old)" in message
    _snapshot(run, 3, "new")  # this run's epoch 3, written before last.pt when the kill came
    assert last_snapshots(run.root, 2, "new", 2, "k") == [run.epoch(1), run.epoch(2)]
    with pytest.raises(CheckpointError, match=r"epoch-003.pt \(epoch 3, after the run's latest state"):
        last_snapshots(run.root, 3, "new", 2, "k")


def test_snapshots_without_an_id_count_only_for_a_run_without_one(tmp_path):
    """Snapshots saved before run ids: a folder whose last.pt has no id either (wholly an earlier version's) takes
    them, up to last.pt's epoch (epochs past it can only be an earlier run's); a run with an id never does."""
    run = RunDir(tmp_path)
    for epoch in (1, 2, 3, 4):
        _snapshot(run, epoch, None)
    _last(run, 2, None)
    assert run_identity(run.root) == (None, 2)
    assert last_snapshots(run.root, 2, None, 2, "k") == [run.epoch(1), run.epoch(2)]
    with pytest.raises(CheckpointError, match=r"epoch-001.pt \(written by a version before run ids"):
        last_snapshots(run.root, 1, "new", None, "k")
    run.last.unlink()
    run.run_file.write_text(json.dumps({"run_id": "abc"}))
    assert run_identity(run.root) == ("abc", None)  # no last.pt: run.json's id, no latest epoch
    run.run_file.unlink()
    assert run_identity(run.root) == (None, None)


def test_captioner_average_run_takes_the_runs_epochs_and_names_the_others(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    for epoch, run_id in ((1, "new"), (2, "new"), (3, "old")):
        _snapshot(run, epoch, run_id)
    _last(run, 2, "new")
    assert average.main(["--run", str(run), "--last", "2", "--out", str(tmp_path / "avg.pt")]) == 0
    out = load_checkpoint(tmp_path / "avg.pt")
    assert torch.equal(out["model"]["w"], torch.full((3,), 1.5)) and out["epoch"] == 2 and out["run_id"] == "new"
    assert average.main(["--run", str(run), "--last", "3", "--out", str(tmp_path / "x.pt")]) == 1
    err = capsys.readouterr().err
    assert "--last 3:" in err and "kept only 2 epochs" in err and "epoch-003.pt (another run's, run_id old)" in err
    assert not (tmp_path / "x.pt").exists()


def test_a_new_run_moves_an_earlier_runs_files_aside(tmp_path, caplog):
    """Everything a run wrote moves into RUN/previous-<time>/ (a second start within the same second gets its own
    folder); the demo's photos/ and files that are no run's stay."""
    run = RunDir(tmp_path / "run")
    assert start_clean(run) is None  # nothing there (not even the folder): nothing to move
    for path in (run.last, run.best, run.averaged, run.metrics, run.config, run.run_file, run.weights_hash(1)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.name)
    _snapshot(run, 1, "old")
    (run.tensorboard / "events").mkdir(parents=True)
    (run.photos / "cat.png").parent.mkdir(parents=True)
    (run.photos / "cat.png").write_text("x")
    (run.root / "notes.txt").write_text("mine")
    with caplog.at_level("WARNING"):
        moved = start_clean(run)
    assert moved is not None and moved.parent == run.root and moved.name.startswith("previous-")
    assert sorted(p.name for p in moved.iterdir()) == sorted(
        ["last.pt", "best.pt", "averaged.pt", "metrics.jsonl", "config.yaml", "run.json", "weights-rank1.sha256",
         "epochs", "tensorboard"])
    assert (moved / "epochs" / "epoch-001.pt").is_file() and (moved / "last.pt").read_text() == "last.pt"
    assert sorted(p.name for p in run.root.iterdir()) == sorted([moved.name, "photos", "notes.txt"])
    assert f"moved them to {moved}" in caplog.text and f"--resume {moved}" in caplog.text
    run.last.write_text("again")
    again = start_clean(run)
    assert again is not None and again != moved and (again / "last.pt").read_text() == "again"


def test_resume_of_a_folder_without_last_pt_starts_the_run_there_as_a_requeue_needs(tmp_path, capsys, monkeypatch):
    """A job preempted before its first epoch ended left no last.pt, and a scheduler's requeue passes --resume
    every time: the run starts there from its first epoch (it used to be refused on every requeue), with the
    folder's config.yaml or --config; with neither it is refused, naming what to give."""
    import captioner.commands.train as train_cmd

    started = []
    monkeypatch.setattr(train_cmd, "train", lambda cfg, resume=None: started.append((cfg, resume)) or cfg.train.run_dir)
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    assert train_main(["--resume", str(run)]) == 1
    assert (f"--resume {run}: no last.pt there yet and no config.yaml to start the run from: give the config, "
            f"captioner train --config CONFIG --resume {run}") in capsys.readouterr().err
    # the folder's own config.yaml, whose run_dir may name another folder (a run moved aside): this folder wins
    run.config.write_text(f"train: {{run_dir: {tmp_path / 'elsewhere'}}}\n")
    assert train_main(["--resume", str(run)]) == 0
    assert started[-1][1] is None and started[-1][0].train.run_dir == str(run.root)
    # a folder the scheduler never started, with --config
    fresh = tmp_path / "not-yet"
    assert train_main(["--config", str(SMOKE), "--resume", str(fresh)]) == 0
    assert started[-1][1] is None and started[-1][0].train.run_dir == str(fresh)


@pytest.mark.slow
def test_a_rerun_in_a_used_folder_averages_its_own_epochs(tmp_path):
    """The reproduction: a run of four epochs, then a new run of two in the same folder with train.average_last=2.
    It used to average the first run's epochs 3 and 4 and record epoch 4; now the first run is moved aside, whole,
    and the average is the second run's epochs 1 and 2. The run's id is in run.json and in all its files."""
    from captioner.store.checkpoint import average_checkpoints
    from captioner.training.loop import train

    sets = [f"data.root={tmp_path / 'data'}", f"train.run_dir={tmp_path / 'run'}", "train.num_threads=1",
            "train.tensorboard=off", "train.keep_epochs=true", "train.average_last=2"]
    run = RunDir(train(load_config(SMOKE, sets + ["train.epochs=4"])))
    first_id = json.loads(run.run_file.read_text())["run_id"]
    train(load_config(SMOKE, sets + ["train.epochs=2"]))
    (previous,) = run.root.glob("previous-*")
    assert sorted(p.name for p in RunDir(previous).epoch_snapshots()) == [f"epoch-00{n}.pt" for n in (1, 2, 3, 4)]
    assert json.loads(RunDir(previous).run_file.read_text())["run_id"] == first_id
    run_id = json.loads(run.run_file.read_text())["run_id"]
    assert run_id != first_id
    kept = run.epoch_snapshots()
    assert [p.name for p in kept] == ["epoch-001.pt", "epoch-002.pt"]
    assert {load_checkpoint(p)["run_id"] for p in (*kept, run.last, run.best)} == {run_id}
    averaged = load_checkpoint(run.averaged)
    assert averaged["epoch"] == 2 and averaged["run_id"] == run_id
    expected = average_checkpoints(kept)["model"]
    assert all(torch.equal(v, expected[k]) for k, v in averaged["model"].items())


def test_the_advice_after_moving_a_run_aside_leads_to_a_command_that_works(tmp_path, caplog):
    """It always suggested `--resume RUN/previous-X`, even for a folder with no last.pt: a moved run with last.pt is
    continued that way, one without is started again in its own folder (its config.yaml), and one with neither
    gets no command."""
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.config.write_text("train: {}\n")
    run.metrics.write_text("")
    with caplog.at_level("WARNING"):
        moved = start_clean(run)
    assert f"(it had no last.pt: to start that run again in its own folder: captioner train --resume {moved})" \
        in caplog.text
    caplog.clear()
    (run.root / "metrics.jsonl").write_text("")
    with caplog.at_level("WARNING"):
        bare = start_clean(run)
    assert f"moved them to {bare}" in caplog.text and "--resume" not in caplog.text
