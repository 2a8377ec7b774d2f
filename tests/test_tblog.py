"""TensorBoard logging (captioner/training/tblog.py): the scalars and images a person watches, and a clear
error when asked for without the package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from captioner.config import load_config
from captioner.training.errors import TrainingError
from captioner.training.loop import train
from captioner.training.tblog import open_tensorboard

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def test_training_writes_scalars_and_overlays(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(SMOKE, [f"data.root={tmp_path / 'data'}", f"train.run_dir={tmp_path / 'run'}",
                              "train.num_threads=1", "train.epochs=2", "train.tensorboard=on", "train.log_every=1",
                              "train.tensorboard_images=2"])
    run = train(cfg)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/xe", "train/lr", "train/alpha_penalty"} <= scalars
    assert {"epoch/CIDEr-D", "epoch/BLEU-4", "epoch/val_loss", "epoch/lr", "epoch/alpha_max"} <= scalars
    assert [e.step for e in acc.Scalars("epoch/CIDEr-D")] == [1, 2]
    images = acc.Tags()["images"]
    assert len(images) == 2 and all(t.startswith("val/") for t in images)
    assert len(acc.Images(images[0])) == 2  # one overlay per epoch


def test_on_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    with pytest.raises(TrainingError, match=r"pip install 'captioner\[tensorboard\]'"):
        open_tensorboard(tmp_path, "on")
    assert open_tensorboard(tmp_path, "auto") is None  # auto: logged as off, training goes on
    assert open_tensorboard(tmp_path, "off") is None
