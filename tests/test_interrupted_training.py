"""A training run SIGKILLed mid-epoch resumes from its last checkpoint with a consistent run directory."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from captioner.store.checkpoint import load_checkpoint

SMOKE = str(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml")


def _epochs(run_dir: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    # Enough images that an epoch takes a while, so the kill lands inside epoch 2's training steps.
    overrides = [f"data.root={tmp_path / 'data'}", f"train.run_dir={run_dir}", "train.epochs=3",
                 "data.shapes.n_train=160", "train.batch_size=8", "train.val_max_images=4",
                 "train.tensorboard_images=0"]  # overlays: tests/test_tblog.py
    cmd = [sys.executable, "-m", "captioner", "train", "--config", SMOKE]
    for o in overrides:
        cmd += ["--set", o]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "last.pt").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint after 240 s"
            time.sleep(0.05)
        time.sleep(1.0)  # inside epoch 2
        assert proc.poll() is None, "the run finished before it could be killed; make epochs longer"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    killed_at = load_checkpoint(run_dir / "last.pt")["epoch"]  # the checkpoint survived the kill
    assert killed_at in (1, 2)
    assert _epochs(run_dir) in ([1], [1, 2])

    resumed = subprocess.run(cmd[:4] + ["--resume", str(run_dir)], capture_output=True, text=True, env=env,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _epochs(run_dir) == [1, 2, 3]  # no epoch duplicated or lost
    final = load_checkpoint(run_dir / "last.pt")
    assert final["epoch"] == 3
    assert [e["epoch"] for e in final["metrics"]["history"]] == [1, 2, 3]
    assert not list(run_dir.glob("*.tmp"))
