"""Tests that need CUDA (marker ``gpu``): skipped without it (tests/conftest.py), run by `make test` and by
`make gpu-check` on a GPU machine. The CPU suite covers the same code paths (mixed precision under CPU autocast in
tests/test_amp.py, DDP under gloo in tests/test_train.py); these check what only a GPU can show.

- training in bf16 and fp16 (with its scaler) on CUDA through validation, resume and evaluate;
- decoding on CUDA gives the CPU's captions: identical words for at least 4 of the 5 photos with TF32 off (float32
  reductions run in another order on the GPU, so a near-tie between two words may break the other way), summed
  log-probabilities within 1e-3 where the words agree;
- two processes training on one GPU (gloo: NCCL refuses two ranks on one device) stay in lockstep;
- a checkpoint saved on the GPU loads and captions on the CPU.
"""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu_data")


def _cfg(data_root: Path, run_dir: Path, *overrides: str):
    return load_config(SMOKE, [f"data.root={data_root}", f"train.run_dir={run_dir}", "train.tensorboard=off",
                               f"train.device={DEVICE}", *overrides])


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


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
