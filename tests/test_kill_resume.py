"""A training run interrupted at any moment, a checkpoint or snapshot write included, resumes with --resume to the
same epochs, files and weights as a run that was never interrupted (issue 45; the order of the writes is
captioner/training/run_files.py's).

Two ways: the process dies at the start of each of an epoch's writes in turn (in process, an exception where the
write would begin: a kill inside an atomic write leaves what a kill just before it does), and real SIGKILLs of
`python -m captioner train` at random moments (seeded), resumed until the run completes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import captioner.store.checkpoint as checkpoint_mod
import captioner.training.loop as loop_mod
import captioner.training.run_files as run_files_mod
import captioner.training.validation as validation_mod
from captioner.config import load_config
from captioner.store.checkpoint import average_checkpoints, load_checkpoint
from captioner.store.rundir import RunDir
from captioner.training.loop import train

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
KEEP = ["train.epochs=3", "train.keep_epochs=true", "train.average_last=2"]


class Killed(BaseException):
    """The process's death at this point: nothing after it runs (no except clause of the package catches it)."""


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kill_data")


def _cfg(data_root: Path, run_dir: Path, *overrides: str):
    return load_config(SMOKE, [f"data.root={data_root}", f"train.run_dir={run_dir}", "train.num_threads=1",
                               "train.tensorboard=off", *overrides])


def _constant_scores(predictions, references, meteor=False) -> dict:
    return {"BLEU-4": 0.0, "CIDEr-D": 0.0}


def _scored_by_val_loss(monkeypatch) -> None:
    """Validation's score is minus the validation loss: a function of the weights alone (so an interrupted run and
    an uninterrupted one choose alike), which improves as the smoke model learns (best.pt is rewritten)."""
    real = validation_mod.validate

    def validate(*args):
        scores = real(*args)
        return {**scores, "CIDEr-D": -scores["val_loss"]}

    monkeypatch.setattr(validation_mod, "caption_scores", _constant_scores)
    monkeypatch.setattr(loop_mod, "validate", validate)


def _equal_weights(a: Path, b: Path) -> bool:
    x, y = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _epochs(run: RunDir) -> list[int]:
    return [json.loads(line)["epoch"] for line in run.metrics.read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(data_root, tmp_path_factory) -> dict[str, RunDir]:
    """Uninterrupted runs to compare with: three epochs (each one better), and one that stops by patience."""
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        _scored_by_val_loss(mp)
        runs["improving"] = RunDir(train(_cfg(data_root, tmp_path_factory.mktemp("straight"), *KEEP)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validation_mod, "caption_scores", _constant_scores)
        runs["patience"] = RunDir(train(_cfg(data_root, tmp_path_factory.mktemp("patient"), *KEEP,
                                             "train.patience=1")))
    return runs


def _die_at(monkeypatch, name: str, nth: int) -> None:
    """The process dies as it starts its ``nth`` write of the file ``name`` (a checkpoint, or the metrics log)."""
    counts = {"n": 0}

    def at(path: Path) -> None:
        if Path(path).name == name:
            counts["n"] += 1
            if counts["n"] == nth:
                raise Killed(f"{name} #{nth}")

    real_save, real_metrics = checkpoint_mod.save_checkpoint, run_files_mod.write_metrics

    def save_checkpoint(path, payload):
        at(path)
        real_save(path, payload)

    def write_metrics(path, entries):
        at(path)
        real_metrics(path, entries)

    monkeypatch.setattr(checkpoint_mod, "save_checkpoint", save_checkpoint)
    monkeypatch.setattr(run_files_mod, "write_metrics", write_metrics)  # the end of an epoch's (save_epoch)


@pytest.mark.slow
@pytest.mark.parametrize("kind, name, nth", [
    ("improving", "epoch-002.pt", 1),  # before last.pt of epoch 2 (it was written first: the snapshot was lost)
    ("improving", "best.pt", 2),  # epoch 2's best.pt (after last.pt, it was lost and best.pt stayed at epoch 1)
    ("improving", "last.pt", 2),
    ("improving", "metrics.jsonl", 2),  # the log after epoch 2's last.pt
    ("improving", "averaged.pt", 1),  # after the last epoch, before the average
    ("patience", "averaged.pt", 1),  # a run stopped by patience: the resume used to train one epoch more
])
def test_a_run_interrupted_at_each_write_resumes_to_the_uninterrupted_runs_files(
        data_root, tmp_path, monkeypatch, straight, kind, name, nth):
    reference = straight[kind]
    if kind == "improving":
        _scored_by_val_loss(monkeypatch)
        scores = [e["CIDEr-D"] for e in load_checkpoint(reference.last)["metrics"]["history"]]
        assert scores == sorted(set(scores)), "every epoch should improve, so that each writes best.pt"
    else:
        monkeypatch.setattr(validation_mod, "caption_scores", _constant_scores)
    sets = [*KEEP] + (["train.patience=1"] if kind == "patience" else [])
    with monkeypatch.context() as mp:
        _die_at(mp, name, nth)
        with pytest.raises(Killed):
            train(_cfg(data_root, tmp_path / "run", *sets))
    run = RunDir(train(_cfg(data_root, tmp_path / "run", *sets), resume=str(tmp_path / "run")))
    assert _epochs(run) == _epochs(reference) == ([1, 2, 3] if kind == "improving" else [1, 2])
    for path in ("last", "best", "averaged"):
        assert _equal_weights(getattr(run, path), getattr(reference, path)), path
    assert load_checkpoint(run.best)["epoch"] == load_checkpoint(reference.best)["epoch"]
    assert [p.name for p in run.epoch_snapshots()] == [p.name for p in reference.epoch_snapshots()]
    for mine, theirs in zip(run.epoch_snapshots(), reference.epoch_snapshots()):
        assert _equal_weights(mine, theirs), mine.name
    assert load_checkpoint(run.averaged)["averaged_from"] == [str(p) for p in run.epoch_snapshots()[-2:]]


def test_a_snapshot_lost_by_an_earlier_version_is_written_again_on_resume(data_root, tmp_path, monkeypatch):
    """Earlier versions wrote last.pt before the epoch's snapshot: a kill between the two lost the snapshot, and the
    average silently took an older epoch. A resume writes it again from last.pt (the same weights)."""
    monkeypatch.setattr(validation_mod, "caption_scores", _constant_scores)
    run = RunDir(train(_cfg(data_root, tmp_path / "run", "train.epochs=1", "train.keep_epochs=true")))
    run.epoch(1).unlink()
    train(_cfg(data_root, run.root, "train.epochs=2", "train.keep_epochs=true", "train.average_last=2"),
          resume=str(run.root))
    assert [p.name for p in run.epoch_snapshots()] == ["epoch-001.pt", "epoch-002.pt"]
    assert load_checkpoint(run.averaged)["averaged_from"] == [str(p) for p in run.epoch_snapshots()]


# --------------------------------------------------------------------------- real SIGKILLs


def _command(run_dir: Path, data_root: Path) -> list[str]:
    cmd = [sys.executable, "-m", "captioner", "train", "--config", str(SMOKE)]
    # last.pt inside epochs too, about every batch: kills land between such saves as well as between epochs
    for setting in (f"data.root={data_root}", f"train.run_dir={run_dir}", "train.num_threads=1",
                    "train.tensorboard=off", "train.save_every_min=0.001", *KEEP):
        cmd += ["--set", setting]
    return cmd


def _run(cmd: list[str], log: Path, kill_after: float | None = None) -> int:
    """Run ``cmd``; SIGKILL it after ``kill_after`` seconds if it is still running. Returns its exit status."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return proc.returncode


@pytest.mark.slow
def test_sigkills_at_random_moments_then_resume_give_the_uninterrupted_run(tmp_path):
    """An uninterrupted run of three epochs (kept, the last two averaged) is measured; then runs are SIGKILLed after
    delays drawn uniformly within its duration (start-up, training, validation, every save; stretched when a late
    kill still finds no last.pt: the machine got slower, as beside other tests) and resumed with
    --resume until they complete, at least three kills in all. Each is restarted as a scheduler's requeue does: the
    same command, --resume included, every time (train.save_every_min writes last.pt inside epochs too): a kill before
    the first last.pt starts the run again there, one after a save continues from the batch after it. Each completed
    run logged epochs 1, 2, 3 once each, ends on the uninterrupted run's weights bit for bit, and its averaged.pt
    is the mean of its own epoch 2 and 3 snapshots, which carry its run id."""
    data_root, log = tmp_path / "data", tmp_path / "stderr.log"
    reference = RunDir(tmp_path / "straight")
    start = time.monotonic()
    assert _run(_command(reference.root, data_root), log) == 0, log.read_text()[-3000:]
    duration = time.monotonic() - start  # the data and feature cache are made here: later runs read them
    rng, kills, runs = random.Random(45), [], 0
    while len(kills) < 3:
        run = RunDir(tmp_path / f"killed-{runs}")
        while True:
            assert len(kills) < 40, "\n".join(kills)  # a machine so slow that no resume ever completes
            cmd = _command(run.root, data_root) + ["--resume", str(run)]  # a requeue: always the same command
            delay = rng.uniform(0, duration)
            status = _run(cmd, log, kill_after=delay)
            if status == 0:
                break
            assert status == -signal.SIGKILL, log.read_text()[-3000:]
            last = load_checkpoint(run.last) if run.last.is_file() else None
            saved = None if last is None else (last["epoch"], (last.get("in_epoch") or {}).get("batches"))
            kills.append(f"run {runs}: killed after {delay:.1f} s, last.pt at (epochs done, batches) {saved}")
            if saved is None and delay > duration / 2:  # the machine got slower than when it was measured
                duration *= 1.25
        runs += 1
        print("\n".join(kills))  # where the kills landed (pytest -s)
        assert _epochs(run) == [1, 2, 3]
        assert _equal_weights(run.last, reference.last)
        run_id = json.loads(run.run_file.read_text())["run_id"]
        kept = run.epoch_snapshots()
        assert [p.name for p in kept] == ["epoch-001.pt", "epoch-002.pt", "epoch-003.pt"]
        assert all(load_checkpoint(p)["run_id"] == run_id for p in (*kept, run.last))
        assert all(_equal_weights(mine, theirs) for mine, theirs in zip(kept, reference.epoch_snapshots()))
        assert [e["epoch"] for e in load_checkpoint(run.last)["metrics"]["history"]] == [1, 2, 3]
        averaged, mean = load_checkpoint(run.averaged), average_checkpoints(kept[1:])
        assert averaged["averaged_from"] == [str(p) for p in kept[1:]] and averaged["run_id"] == run_id
        assert all(torch.equal(v, mean["model"][k]) for k, v in averaged["model"].items())


def _timeless(run: RunDir) -> list[dict]:
    """The metrics log without its clock readings (what a resumed run cannot repeat)."""
    return [{k: v for k, v in json.loads(line).items() if not k.endswith(("time_s", "per_s"))}
            for line in run.metrics.read_text().splitlines()]


@pytest.fixture(scope="module")
def straight_two(data_root, tmp_path_factory) -> RunDir:
    """An uninterrupted run of two epochs that never saves inside an epoch."""
    with pytest.MonkeyPatch.context() as mp:
        _scored_by_val_loss(mp)
        return RunDir(train(_cfg(data_root, tmp_path_factory.mktemp("straight_two"), "train.epochs=2")))


@pytest.mark.slow
def test_kills_inside_epochs_then_resume_give_the_uninterrupted_run_bit_for_bit(data_root, tmp_path, monkeypatch,
                                                                                straight_two):
    """train.save_every_min writes last.pt inside epochs (here after every batch): a run killed several times,
    inside epochs and at their ends, and resumed each time, ends with the uninterrupted run's weights, best.pt and
    metrics (clock readings aside), each epoch logged once; the saves themselves change nothing."""
    _scored_by_val_loss(monkeypatch)
    sets = ["train.epochs=2", "train.save_every_min=1e-9"]
    run = RunDir(tmp_path / "run")
    inside = 0
    for nth in (3, 4, 6, 2):  # the process dies as it starts its nth last.pt write of that session
        with monkeypatch.context() as mp:
            _die_at(mp, "last.pt", nth)
            with pytest.raises(Killed):
                train(_cfg(data_root, run.root, *sets), resume=str(run.root) if run.last.is_file() else None)
        inside += load_checkpoint(run.last).get("in_epoch") is not None
    assert inside >= 3  # most kills landed inside an epoch, after a save there
    train(_cfg(data_root, run.root, *sets), resume=str(run.root))
    assert _epochs(run) == [1, 2]
    assert load_checkpoint(run.last).get("in_epoch") is None  # an epoch's end holds no partial epoch
    for path in ("last", "best"):
        assert _equal_weights(getattr(run, path), getattr(straight_two, path)), path
    assert _timeless(run) == _timeless(straight_two)


@pytest.mark.slow
def test_a_preemption_signal_saves_inside_the_epoch_and_the_resume_is_exact(data_root, tmp_path, monkeypatch,
                                                                           straight_two, wrap_objective_loss):
    """SIGTERM (and Slurm's SIGUSR1) mid-epoch: last.pt is saved after the batch in progress and the run stops,
    saying how to continue; the same command with --resume ends on the uninterrupted run's weights."""
    _scored_by_val_loss(monkeypatch)
    steps = {"n": 0}

    def signal_at_fifth_step(loss, forward, batch):
        steps["n"] += 1
        if steps["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only notes it: the step finishes
        return loss(forward, batch)

    run = RunDir(tmp_path / "run")
    with monkeypatch.context() as mp:
        mp.setattr(loop_mod, "build_objective", loop_mod.build_objective)  # undone after: the wrap below
        wrap_objective_loss(signal_at_fifth_step)
        with pytest.raises(loop_mod.TrainingError, match=rf"stopped by SIGTERM inside epoch 1, after its batch 5: "
                                                         rf"{run.last} holds where it stopped"):
            train(_cfg(data_root, run.root, "train.epochs=2"))
    part = load_checkpoint(run.last)["in_epoch"]
    assert (part["epoch"], part["batches"], part["n_steps"]) == (0, 5, 5) and not run.metrics.read_text().strip()
    train(_cfg(data_root, run.root, "train.epochs=2"), resume=str(run.root))
    assert _equal_weights(run.last, straight_two.last) and _timeless(run) == _timeless(straight_two)
