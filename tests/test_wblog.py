"""Weights & Biases logging (captioner/training/wblog.py): a run with `train.wandb: offline` writes the scalars and
overlay images TensorBoard gets into its local run files, and asking for W&B without the package is a clear error."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from captioner.training.errors import TrainingError
from captioner.training.wblog import RUN_ID_FILE, open_wandb

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
BLOCK = 32768  # W&B's run file: a LevelDB-style log of 32 KiB blocks, each record chunk behind a 7-byte header


def wandb_records(path: Path):
    """The protobuf records of an offline run's .wandb file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, pending = 7, b""  # file header: magic, version
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_offline_run_logs_the_tensorboard_scalars_and_overlays(tmp_path):
    """In a process of its own, as `captioner train` runs: W&B keeps process-wide state (its service, settings and
    loggers), which a test run earlier in the same interpreter could leave changed."""
    run_dir = tmp_path / "run"
    sets = [f"data.root={tmp_path / 'data'}", f"train.run_dir={run_dir}", "train.num_threads=1", "train.epochs=2",
            "train.tensorboard=off", "train.wandb=offline", "train.log_every=1", "train.tensorboard_images=1"]
    proc = subprocess.run([sys.executable, "-m", "captioner", "train", "--config", str(SMOKE),
                           *(arg for s in sets for arg in ("--set", s))], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    history, config = [], {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "run":  # the run's start, with its config
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    keys = {key for row in history for key in row}
    assert {"train/loss", "train/xe", "train/lr", "train/alpha_penalty", "global_step"} <= keys
    assert {"epoch/CIDEr-D", "epoch/BLEU-4", "epoch/val_loss", "epoch/lr", "epoch/alpha_max"} <= keys
    assert [row["epoch"] for row in history if "epoch/CIDEr-D" in row] == [1, 2]
    overlays = sorted({key.split("/")[1] for key in keys if key.startswith("val/") and key.endswith("/_type")})
    assert len(overlays) == 1  # train.tensorboard_images
    images = [row for row in history if f"val/{overlays[0]}/_type" in row]
    assert [row["epoch"] for row in images] == [1, 2] and images[0][f"val/{overlays[0]}/_type"] == "image-file"
    media = run_file.parent / "files" / images[0][f"val/{overlays[0]}/path"]
    assert media.is_file() and media.stat().st_size > 0
    assert config["data"]["format"] == "shapes" and config["train"]["wandb"] == "offline"  # the resolved config
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_file.stem.removeprefix("run-")


def test_asking_for_wandb_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    for mode in ("offline", "online"):
        with pytest.raises(TrainingError, match=rf"train.wandb={mode} but the wandb package is not installed: "
                                                r"pip install 'captioner\[wandb\]'"):
            open_wandb(tmp_path, mode, {})
    assert open_wandb(tmp_path, "off", {}) is None
