"""Tests that need CUDA (marker ``gpu``): skipped without it (tests/conftest.py), run by `make test` and by
`make gpu-check` on a GPU machine. The CPU suite covers the same code paths (mixed precision under CPU autocast in
tests/test_amp.py, DDP under gloo in tests/test_train.py); these check what only a GPU can show.

- training in bf16 and fp16 (with its scaler) on CUDA through validation, resume and evaluate;
- every objective (xe, reinforce, loo, gumbel, scst from a cross-entropy run) and the Transformer decoder train an
  epoch on CUDA in bf16: every step under bf16 autocast with a finite loss, none skipped, the weights moved, and the
  checkpoint loads back to float32 parameters on the GPU and captions;
- decoding on CUDA gives the CPU's captions: identical words for at least 4 of the 5 photos with TF32 off (float32
  reductions run in another order on the GPU, so a near-tie between two words may break the other way), summed
  log-probabilities within 1e-3 where the words agree;
- two processes training on one GPU (gloo: NCCL refuses two ranks on one device) stay in lockstep;
- a process group of one rank over NCCL carries the training loop's collectives (DDP, the step's all-reduce, the
  flag broadcasts, the RNG-state gather) through two epochs;
- a checkpoint saved on the GPU loads and captions on the CPU, and one saved on the CPU loads and captions on the GPU.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioner.config import load_config
from captioner.store.checkpoint import load_checkpoint
from captioner.training.loop import WEIGHTS_HASH_ENV, train

pytestmark = pytest.mark.gpu
# CAPTIONER_GPU_TEST_DEVICE=cpu runs these on the CPU (conftest then does not skip them): a dry run of the tests'
# own logic on a machine without a GPU, which proves nothing about CUDA
DEVICE = os.environ.get("CAPTIONER_GPU_TEST_DEVICE", "cuda")

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
SMOKE_TRANSFORMER = REPO / "configs" / "smoke_transformer.yaml"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu_data")


def _cfg(data_root: Path, run_dir: Path, *overrides: str, config: Path = SMOKE):
    return load_config(config, [f"data.root={data_root}", f"train.run_dir={run_dir}", "train.tensorboard=off",
                               f"train.device={DEVICE}", *overrides])


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cpu_run(data_root, tmp_path_factory) -> Path:
    """One epoch of the smoke config trained on the CPU in float32: the checkpoint the GPU loads, the cross-entropy
    run SCST starts from (train.init), and the feature cache a process group reads (it refuses to extract one)."""
    return train(_cfg(data_root, tmp_path_factory.mktemp("cpu") / "run", "train.device=cpu", "train.epochs=1",
                      "train.num_threads=1"))


@pytest.mark.parametrize("amp", ["bf16", "fp16", "none"])
def test_training_on_cuda_validates_resumes_and_evaluates(data_root, tmp_path, amp):
    from captioner.api import load_captioner
    from captioner.data.datasets import load_records
    from captioner.evaluation.split import evaluate_model

    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1", f"train.amp={amp}"))
    assert load_checkpoint(run / "last.pt")["model"]  # saved
    train(_cfg(data_root, tmp_path / "run", "train.epochs=2", f"train.amp={amp}"), resume=str(run))
    log = _metrics(run)
    assert [e["epoch"] for e in log] == [1, 2] and all(e["skipped_steps"] < 8 for e in log)
    model = load_captioner(run / "best.pt", device=DEVICE)
    assert model.device.type == torch.device(DEVICE).type
    records = load_records(model.config.data, "val")
    result = evaluate_model(model, records, model.decode_options, tokenizer="simple", batch_size=8, meteor=False)
    assert result["n_images"] == len(records)


def test_a_checkpoint_saved_on_the_gpu_loads_and_captions_on_the_cpu(data_root, tmp_path):
    from captioner.api import load_captioner
    from captioner.demo import sample_photo

    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1"))
    model = load_captioner(run / "best.pt", device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    (result,) = model.caption([sample_photo("astronaut")], beam=2)
    assert isinstance(result["caption"], str)


def test_a_checkpoint_saved_on_the_cpu_loads_and_captions_on_the_gpu(cpu_run):
    from captioner.api import load_captioner
    from captioner.demo import sample_photo

    model = load_captioner(cpu_run / "best.pt", device=DEVICE)
    device_type = torch.device(DEVICE).type
    assert all(t.device.type == device_type for t in (*model.parameters(), *model.buffers()))
    (result,) = model.caption([sample_photo("astronaut")], beam=2)
    assert isinstance(result["caption"], str)


HARD = "model.attention.attention=hard"
# objective (or decoder) -> (config, overrides); scst also starts from cpu_run (train.init), as its configs do
BF16_CASES = {
    "xe": (SMOKE, []),
    "reinforce": (SMOKE, [HARD, "train.objective.kind=reinforce"]),
    "loo": (SMOKE, [HARD, "train.objective.kind=loo", "train.objective.samples=2"]),
    "gumbel": (SMOKE, [HARD, "train.objective.kind=gumbel"]),
    "scst": (SMOKE, ["train.objective={kind: scst, samples: 2, greedy_images: 8}"]),
    "transformer": (SMOKE_TRANSFORMER, []),
}


@pytest.mark.parametrize("case", list(BF16_CASES))
def test_every_objective_and_the_transformer_train_in_bf16(data_root, tmp_path, case, request, wrap_objective_loss):
    """One epoch (a few steps) on the device under bf16 autocast: each step's loss is watched where the loop asks
    the objective for it, with the weights the first step started from."""
    from captioner.api import load_captioner
    from captioner.demo import sample_photo

    config, sets = BF16_CASES[case]
    if case == "scst":
        sets = [*sets, f"train.init={request.getfixturevalue('cpu_run')}"]
    device_type = torch.device(DEVICE).type
    first: dict[str, torch.Tensor] = {}
    steps: list[tuple[bool, torch.dtype, torch.Tensor]] = []  # (autocast on, its dtype, the loss)

    def watch(loss, forward, batch):
        if not first:
            first.update({k: v.detach().clone() for k, v in forward.model.state_dict().items()})
        res = loss(forward, batch)
        steps.append((torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type),
                      res.loss.detach()))
        return res

    wrap_objective_loss(watch)
    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1", "train.amp=bf16", "train.num_threads=1", *sets,
                     config=config))
    (entry,) = _metrics(run)
    assert entry["skipped_steps"] == 0 and entry["step"] == len(steps) >= 2, (entry, len(steps))
    assert all(on and dtype == torch.bfloat16 for on, dtype, _ in steps)
    assert all(math.isfinite(float(loss)) for _, _, loss in steps) and math.isfinite(entry["train_loss"])
    saved = load_checkpoint(run / "last.pt")["model"]
    moved = [k for k, v in first.items() if not torch.equal(v.cpu(), saved[k].cpu())]
    assert any(k.startswith("decoder.") for k in moved), moved
    model = load_captioner(run / "best.pt", device=DEVICE)
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {(device_type, torch.float32)}
    (result,) = model.caption([sample_photo("astronaut")], beam=2)
    assert isinstance(result["caption"], str)


def test_decoding_on_cuda_gives_the_cpus_captions():
    from captioner.api import load_captioner
    from captioner.demo import sample_photo
    from captioner.runtime import enable_tf32

    enable_tf32(False)
    try:
        photos = [sample_photo(name) for name in ("astronaut", "chelsea", "coffee", "rocket", "camera")]
        cpu = load_captioner("flickr8k_soft", device="cpu").caption(photos, beam=3)
        gpu = load_captioner("flickr8k_soft", device=DEVICE).caption(photos, beam=3)
    finally:
        enable_tf32(True)
    same = [a["caption"] == b["caption"] for a, b in zip(cpu, gpu)]
    # at least 4 of the 5 photos: one may differ where two beams tie to within another device's rounding
    assert sum(same) >= len(photos) - 1, [(a["caption"], b["caption"]) for a, b in zip(cpu, gpu)]
    for a, b, equal in zip(cpu, gpu, same):
        if equal:
            assert abs(a["score"] - b["score"]) < 1e-3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_on_one_gpu_stay_in_lockstep(data_root, tmp_path):
    """Two ranks share GPU 0 over gloo (NCCL refuses two ranks on one device): each process is started as
    LOCAL_RANK 0 of its own view, so both take cuda:0."""
    train(_cfg(data_root, tmp_path / "warm", "train.epochs=1"))  # the data and the feature cache, made once
    run_dir = tmp_path / "ddp"
    port = str(_free_port())
    cmd = [sys.executable, "-m", "captioner", "train", "--config", str(SMOKE), "--set", f"data.root={data_root}",
           "--set", f"train.run_dir={run_dir}", "--set", "train.epochs=2", "--set", f"train.device={DEVICE}",
           "--set", "train.ddp_backend=gloo", "--set", "train.tensorboard=off"]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, **{WEIGHTS_HASH_ENV: "1"})
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:  # within the check's 240 s per test; a hang kills both ranks rather than leaving them running
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    hashes = [(run_dir / f"weights-rank{r}.sha256").read_text() for r in (0, 1)]
    assert hashes[0] == hashes[1]
    assert [e["epoch"] for e in _metrics(run_dir)] == [1, 2]


# `captioner train` (commands/train.main) as the one rank of a process group of one. The loop creates no group at
# WORLD_SIZE=1 and skips every collective there (`world > 1` / `world == 1`: distributed.py, loop.py, inputs.py),
# so this script creates the group after the loop's setup_distributed, as that function does at WORLD_SIZE > 1, and
# hands the loop a world size of 1 that reads as distributed at those two tests; it counts the collectives called.
ONE_RANK_GROUP = """
import collections, datetime, json, sys
import torch
import torch.distributed as dist
import captioner.training.loop as loop
from captioner.commands.train import main

class GroupOfOne(int):  # 1 everywhere (the sampler's shards, the gathered list), but `> 1` and not `== 1`
    def __gt__(self, other): return True if other == 1 else int(self) > other
    def __eq__(self, other): return False if other == 1 else int(self) == other
    __hash__ = int.__hash__

calls = collections.Counter()
def counted(name):
    real = getattr(dist, name)
    def call(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)
    setattr(dist, name, call)
for name in ("all_reduce", "broadcast", "all_gather_object", "barrier"):
    counted(name)

class CountedDDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, *args, **kwargs):
        calls["ddp"] += 1
        super().__init__(*args, **kwargs)
torch.nn.parallel.DistributedDataParallel = CountedDDP

real_setup = loop.setup_distributed
def setup(device_name, timeout_min=60.0, backend="auto"):
    rank, world, device = real_setup(device_name, timeout_min, backend)
    calls["group_at_world_1"] = int(dist.is_initialized())  # what the loop does alone: 0
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_min))
    calls[dist.get_backend()] = dist.get_world_size()
    return rank, GroupOfOne(world), device
loop.setup_distributed = setup

status = main(sys.argv[1:])
print("COLLECTIVES " + json.dumps(calls))
sys.exit(status)
"""


def test_one_rank_process_group_carries_the_training_loops_collectives(data_root, tmp_path, cpu_run):
    """RANK 0 of WORLD_SIZE 1 over NCCL (ONE_RANK_GROUP above: at world size 1 the loop alone makes no group and
    calls no collective), two epochs: DDP wraps the step, each step all-reduces its figures and then the job's stop
    decision (a signal or a save due on any rank; not after an epoch's last batch, whose end decides instead), rank
    0's failures and stop are broadcast at each epoch's end, which gathers the RNG states. The CPU dry run uses
    gloo instead (NCCL needs CUDA), the same logic."""
    backend = "nccl" if torch.device(DEVICE).type == "cuda" else "gloo"
    run_dir = tmp_path / "one_rank"
    cmd = [sys.executable, "-c", ONE_RANK_GROUP, "--config", str(SMOKE), "--set", f"data.root={data_root}",
           "--set", f"train.run_dir={run_dir}", "--set", "train.epochs=2", "--set", f"train.device={DEVICE}",
           "--set", f"train.ddp_backend={backend}", "--set", "train.tensorboard=off", "--set", "train.num_threads=1"]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # within the check's 240 s per test; a hang is killed rather than left running
        output = proc.communicate(timeout=180)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    calls = json.loads(output.split("COLLECTIVES ", 1)[1].splitlines()[0])
    log = _metrics(run_dir)
    assert [e["epoch"] for e in log] == [1, 2] and all(e["skipped_steps"] == 0 for e in log)
    assert all(math.isfinite(e["train_loss"]) for e in log) and log[1]["step"] == 2 * log[0]["step"] > 0
    assert calls["group_at_world_1"] == 0 and calls[backend] == 1 and calls["ddp"] == 1, calls
    assert calls["all_reduce"] >= 2 * log[-1]["step"] and calls["all_gather_object"] == 2, calls
    assert calls["broadcast"] >= 2 * len(log) and calls["barrier"] >= 1, calls
    assert load_checkpoint(run_dir / "last.pt")["epoch"] == 2
