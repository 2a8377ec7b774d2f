"""Mixed precision (train.amp) on the CPU: the code a GPU runs under autocast, run here by the suite.

bf16 trains the smoke config through validation, save, resume and evaluate; fp16 does the same with its gradient
scaler, whose state travels in the checkpoint. Validation decodes in float32 as `captioner evaluate` does, so best.pt
is chosen on the captions evaluate later scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captioner.config import load_config
from captioner.store.checkpoint import load_checkpoint
from captioner.training.loop import train

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("amp_data")  # one shapes data set and feature cache for the module


def _cfg(data_root: Path, run_dir: Path, *overrides: str):
    return load_config(SMOKE, [f"data.root={data_root}", f"train.run_dir={run_dir}", "train.num_threads=1",
                               "train.tensorboard=off", "train.device=cpu", *overrides])


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def autocast_seen(wrap_objective_loss):
    """The autocast dtype each training step's loss was computed under (None: autocast off)."""
    seen: list = []

    def spy(loss, forward, batch):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return loss(forward, batch)

    wrap_objective_loss(spy)
    return seen


@pytest.mark.parametrize("amp, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_trains_validates_saves_resumes_and_evaluates_on_the_cpu(data_root, tmp_path, amp, dtype,
                                                                                autocast_seen):
    from captioner.api import load_captioner
    from captioner.data.datasets import load_records
    from captioner.evaluation.split import evaluate_model

    run = train(_cfg(data_root, tmp_path / "run", "train.epochs=1", f"train.amp={amp}"))
    assert autocast_seen and set(autocast_seen) == {dtype}  # every step ran under autocast, none in float32
    first = _metrics(run)
    assert [e["epoch"] for e in first] == [1] and torch.isfinite(torch.tensor(first[0]["val_loss"]))
    payload = load_checkpoint(run / "last.pt")
    if amp == "fp16":  # the scaler was on and its state is saved for the resume
        assert payload["scaler"] and payload["scaler"]["scale"] > 0
    else:
        assert not payload["scaler"]
    train(_cfg(data_root, tmp_path / "run", "train.epochs=2", f"train.amp={amp}"), resume=str(run))
    assert [e["epoch"] for e in _metrics(run)] == [1, 2]
    assert _metrics(run)[0] == first[0]  # the resumed run kept the first epoch's line as it was

    model = load_captioner(run / "best.pt", device="cpu")
    records = load_records(model.config.data, "val")
    result = evaluate_model(model, records, model.decode_options.replace_given(beam=1), tokenizer="simple",
                            batch_size=8, meteor=False)
    assert result["n_images"] == len(records) and "CIDEr-D" in result["scores"]


def test_a_resumed_bf16_run_gives_the_uninterrupted_runs_weights(data_root, tmp_path):
    straight = train(_cfg(data_root, tmp_path / "straight", "train.epochs=2", "train.amp=bf16"))
    split = tmp_path / "split"
    train(_cfg(data_root, split, "train.epochs=1", "train.amp=bf16"))
    train(_cfg(data_root, split, "train.epochs=2", "train.amp=bf16"), resume=str(split))
    a, b = load_checkpoint(straight / "last.pt")["model"], load_checkpoint(split / "last.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_validation_decodes_in_float32_like_evaluate(data_root, tmp_path, monkeypatch):
    """Under train.amp the per-epoch decode runs outside autocast: its greedy captions are evaluate's."""
    from captioner.models.captioner import Captioner

    modes = []
    real = Captioner.generate

    def spy(self, *args, **kwargs):
        modes.append(torch.is_autocast_enabled("cpu"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Captioner, "generate", spy)
    train(_cfg(data_root, tmp_path / "run", "train.epochs=1", "train.amp=bf16"))
    assert modes and not any(modes)
