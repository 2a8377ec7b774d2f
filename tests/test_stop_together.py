"""Ranks that stop together (issue 61): under torchrun the decision to stop (a preemption signal that reached any one
rank) and a failed save inside an epoch are the whole job's, taken at a step boundary, so no rank is left waiting at a
collective until the process group's timeout (an hour) and no signal to a non-zero rank is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import captioner.training.loop as loop_mod
from captioner.store.checkpoint import load_checkpoint
from captioner.store.rundir import RunDir
from captioner.training.distributed import max_over_ranks
from captioner.training.errors import TrainingError
from captioner.training.preemption import Preemption

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


def test_max_over_ranks_in_one_process_is_the_values_themselves():
    assert max_over_ranks([0, True, 15], 1, torch.device("cpu")) == [0, 1, 15]


def test_every_rank_stops_when_any_rank_was_signalled_and_says_which_signal(tmp_path):
    """The job's signal (the largest over the ranks) stops a rank that got none too, naming it as another rank's;
    a rank that got it names it as its own; no signal anywhere stops nothing."""
    run = RunDir(tmp_path / "run")
    quiet, signalled = Preemption(), Preemption()
    signalled.note(signal.SIGTERM, None)
    assert (quiet.number, signalled.number) == (0, int(signal.SIGTERM))
    quiet.stop_if_noted(run, "inside epoch 1, after its batch 2", job_signal=0)  # nothing noted anywhere
    with pytest.raises(TrainingError, match=r"stopped inside epoch 1, after its batch 2: another rank of the job "
                                            rf"received SIGTERM: {run.last} holds where it stopped; the same "
                                            rf"command with --resume {run.root} continues it exactly"):
        quiet.stop_if_noted(run, "inside epoch 1, after its batch 2", job_signal=int(signal.SIGTERM))
    with pytest.raises(TrainingError, match=r"stopped by SIGTERM after epoch 3: "):
        signalled.stop_if_noted(run, "after epoch 3", job_signal=int(signal.SIGTERM))


def _rank(rank: int, model: nn.Module, tmp_path: Path) -> SimpleNamespace:
    """What _save_inside_epoch reads of a run, as rank ``rank`` of two."""
    return SimpleNamespace(rank=rank, world=2, is_main=rank == 0, device=torch.device("cpu"), model=model,
                           run_dir=RunDir(tmp_path / "run"))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_failed_save_inside_an_epoch_stops_every_rank(rank, tmp_path, monkeypatch):
    """Rank 0's save fails (here non-finite weights; a full disk alike): rank 0 raises its error and rank 1, told by
    the one broadcast that follows every save inside an epoch, raises too, instead of going on to its next step's
    collective and waiting there for the process group's timeout. The collectives are played by one process."""
    told = []

    def broadcast_flag(flag, world, device):  # rank 0's flag reaches every rank: here rank 0 failed
        told.append(flag)
        return flag if rank == 0 else True

    monkeypatch.setattr(loop_mod, "gather_rng_states", lambda world, device: [{}, {}])
    monkeypatch.setattr(loop_mod, "broadcast_flag", broadcast_flag)
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    part = {"epoch": 2, "batches": 7}
    expected = (r"non-finite weights inside epoch 3; not saving them" if rank == 0 else
                r"rank 0 failed while saving last.pt inside epoch 3 \(its error is in its own output\); rank 1 stops")
    with pytest.raises(TrainingError, match=expected):
        loop_mod._save_inside_epoch(_rank(rank, model, tmp_path), part)
    assert told == [rank == 0]  # one broadcast, from every rank: rank 0 tells of its failure
    assert not (tmp_path / "run" / "last.pt").exists()


_WORKER = '''
"""`captioner` as torchrun runs it, with a hook for the test: with PAUSE_DIR set, each rank writes its pid at its
second step, and rank 1 holds that step until it has been signalled, so the signal lands mid-epoch on one rank."""
import os
import sys
import time
from pathlib import Path

import captioner.training.loop as loop
from captioner.cli import main

pause_dir = os.environ.get("PAUSE_DIR")
train_step = loop._train_step
steps = {"n": 0}


def step(run, objective, batch):
    steps["n"] += 1
    if pause_dir and steps["n"] == 2:
        pid_file = Path(pause_dir, f"rank{run.rank}.pid")
        pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
        pid_file.with_suffix(".tmp").replace(pid_file)  # whole, when the test reads it
        deadline = time.monotonic() + 120
        while run.rank == 1 and not loop.PREEMPTION.noted and time.monotonic() < deadline:
            time.sleep(0.02)
    return train_step(run, objective, batch)


loop._train_step = step
sys.exit(main())
'''


@pytest.mark.slow
def test_a_signal_to_one_nonzero_rank_stops_every_rank_and_the_requeue_finishes_the_run(tmp_path):
    """Two gloo ranks under torchrun; SIGTERM to rank 1 alone, inside epoch 1. Before, rank 0's flag alone was
    broadcast: the signal was lost and the run trained on. Now every rank saves at the same step (last.pt, written
    after the signal, holds epoch 1 after its batch 2) and stops by itself within seconds, each saying why; the
    requeue (the same command, --resume included) finishes the run, each epoch logged once, the ranks' weights equal.
    """
    from captioner.commands.extract import main as extract

    data_root, run, pauses = tmp_path / "data", RunDir(tmp_path / "run"), tmp_path / "pauses"
    pauses.mkdir()
    sets = [f"data.root={data_root}", "train.num_threads=1", "train.tensorboard=off", "train.device=cpu"]
    # under torchrun an incomplete feature cache is refused: extracted first, in one process (docs/usage.md)
    assert extract(["--config", str(SMOKE), "--set", f"data.root={data_root}", "--device", "cpu",
                    "--no-progress"]) == 0
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    # --monitor-interval: torchrun looks at its workers every 2 s, so a rank that stops by itself has printed its
    # reason before torchrun would end it for another rank's exit
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--monitor-interval", "2", str(worker), "train", "--config", str(SMOKE),
               *[a for s in sets for a in ("--set", s)], "--resume", str(run)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PAUSE_DIR=str(pauses))
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240  # two processes starting up beside other tests
        while not all((pauses / f"rank{r}.pid").is_file() for r in (0, 1)):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.05)
        pids = [int((pauses / f"rank{r}.pid").read_text()) for r in (0, 1)]
        signalled_at = time.time()
        os.kill(pids[1], signal.SIGTERM)
        out, err = first.communicate(timeout=90)
        stopped_in = time.time() - signalled_at
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode != 0 and stopped_in < 90, err[-3000:]
    assert f"stopped by SIGTERM inside epoch 1, after its batch 2: {run.last} holds where it stopped" in err, \
        err[-3000:]  # rank 1, which got it
    assert "stopped inside epoch 1, after its batch 2: another rank of the job received SIGTERM" in err, \
        err[-3000:]  # rank 0, which did not
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # every rank has ended
    assert run.last.stat().st_mtime >= signalled_at - 1.0  # mtime's resolution aside: written after the signal
    part = load_checkpoint(run.last)["in_epoch"]
    assert (part["epoch"], part["batches"], part["train_items"]) == (0, 2, 120)
    assert not run.metrics.read_text().strip()  # no epoch ended

    env = dict(os.environ, OMP_NUM_THREADS="1", **{loop_mod.WEIGHTS_HASH_ENV: "1"})  # the requeue: no pause
    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    epochs = [json.loads(line)["epoch"] for line in run.metrics.read_text().splitlines()]
    assert epochs == [1, 2]
    assert load_checkpoint(run.last)["in_epoch"] is None
    hashes = {(run.root / f"weights-rank{r}.sha256").read_text() for r in (0, 1)}
    assert len(hashes) == 1


def _ending(rank: int, tmp_path: Path) -> SimpleNamespace:
    """What the end of training (loop._finish) reads of a run, as rank ``rank`` of two, with train.average_last."""
    return SimpleNamespace(rank=rank, world=2, is_main=rank == 0, device=torch.device("cpu"), writer=None,
                           cfg=SimpleNamespace(train=SimpleNamespace(average_last=2)),
                           progress=SimpleNamespace(run_id="r", epoch=3), run_dir=RunDir(tmp_path / "run"))


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("error", ["disk", "refused", None])
def test_averaging_at_the_end_fails_on_every_rank_together(rank, error, tmp_path, monkeypatch):
    """train.average_last on rank 0 that raised anything but a checkpoint error (a full disk) skipped the final
    barrier, and the other ranks waited there for the process group's timeout: now rank 0's outcome reaches every
    rank in one broadcast, and every rank raises (rank 0 its own error). A refusal (too few kept epochs) and a
    success alike. The collectives are played by one process; a barrier here is one rank 0 never reaches."""
    from captioner.store.checkpoint import CheckpointError

    told = []

    def broadcast_flag(flag, world, device):  # rank 0's flag reaches every rank
        told.append(flag)
        return flag if rank == 0 else error is not None

    reached = []

    def barrier(world):  # noqa: ARG001 - a rank 0 whose disk is full never arrives: the process group's timeout
        if error == "disk":
            raise AssertionError("rank 0 never reaches this barrier: it failed before it")
        reached.append(True)

    def write_average(run_dir, last, run_id, epoch):
        assert rank == 0, "only rank 0 averages"
        if error == "disk":
            raise OSError(28, "No space left on device")
        if error == "refused":
            raise CheckpointError("train.average_last=2: only 1 kept epoch")

    monkeypatch.setattr(loop_mod, "broadcast_flag", broadcast_flag)
    monkeypatch.setattr(loop_mod, "barrier", barrier, raising=False)
    monkeypatch.setattr(loop_mod, "write_average", write_average)
    run = _ending(rank, tmp_path)
    if error is None:
        loop_mod._finish(run)
    else:
        expected = {"disk": r"No space left on device",
                    "refused": r"training finished .* averaged.pt was not written: train.average_last=2"}[error]
        with pytest.raises((OSError, TrainingError),
                           match=expected if rank == 0 else r"rank 0 failed while writing averaged.pt .*; rank 1 "
                                                            r"stops too"):
            loop_mod._finish(run)
    assert told == [rank == 0 and error is not None]  # one broadcast, from every rank
    assert reached == ([True] if error is None else [])  # the final barrier: once every rank is known to succeed


_ENDING = '''
"""One rank of two (gloo) at the end of training with train.average_last, rank 0's disk full: prints how it ended."""
import datetime
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

import captioner.training.loop as loop
from captioner.store.rundir import RunDir

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))


def write_average(run_dir, last, run_id, epoch):
    raise OSError(28, "No space left on device")


loop.write_average = write_average
run = SimpleNamespace(rank=rank, world=2, is_main=rank == 0, device=torch.device("cpu"), writer=None,
                      cfg=SimpleNamespace(train=SimpleNamespace(average_last=2)),
                      progress=SimpleNamespace(run_id="r", epoch=3), run_dir=RunDir(Path(sys.argv[1])))
try:
    loop._finish(run)
    print(f"rank {rank} finished", flush=True)
except Exception as err:
    print(f"rank {rank} raised {type(err).__name__}: {err}", flush=True)
dist.destroy_process_group()
'''


def test_two_gloo_ranks_end_together_when_rank_0s_average_fails(tmp_path):
    """The same with two real gloo processes: rank 1 raises, saying that rank 0 failed. Before, it sat in a barrier
    rank 0 never reached, and learned of it only when rank 0's process ended (gloo: "Connection closed by peer";
    NCCL notices no such thing, and waits for the process group's timeout)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ending.py"
    script.write_text(_ENDING)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    ranks = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "run")], cwd=REPO,
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=90) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert "rank 0 raised OSError: [Errno 28] No space left on device" in outs[0][0], outs[0]
    assert ("rank 1 raised TrainingError: rank 0 failed while writing averaged.pt (its error is in its own output); "
            "rank 1 stops too") in outs[1][0], outs[1]
