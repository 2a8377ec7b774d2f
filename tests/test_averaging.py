"""Checkpoint averaging: checkpoint.average_checkpoints, `captioner average`, and train.keep_epochs /
train.average_last (a run keeps each epoch's weights and writes the mean of the last k)."""

from pathlib import Path

import pytest
import torch

from captioner.commands import average
from captioner.config import ConfigError, load_config
from captioner.store.checkpoint import CheckpointError, average_checkpoints, load_checkpoint, save_checkpoint
from captioner.store.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
VOCAB = {"words": ["<pad>", "<start>", "<end>", "<unk>", "a"]}


def _save(path: Path, weight: torch.Tensor, counter: int = 3, vocab=VOCAB, model_section=None, ids=(1, 2)) -> Path:
    save_checkpoint(path, {"model": {"w": weight, "bn.num_batches_tracked": torch.tensor(counter),
                                     "ids": torch.tensor(ids)},
                           "config": {"model": model_section or {"decoder": {"hidden_dim": 4}}},
                           "vocab": vocab, "epoch": int(weight.flatten()[0])})
    return path


def test_the_average_is_the_mean_of_the_weights_in_their_dtype(tmp_path):
    a = _save(tmp_path / "a.pt", torch.tensor([1.0, 2.0, 4.0]))
    b = _save(tmp_path / "b.pt", torch.tensor([3.0, 2.0, 5.0]))
    c = _save(tmp_path / "c.pt", torch.tensor([5.0, 2.0, 0.0]))
    out = average_checkpoints([a, b, c])
    torch.testing.assert_close(out["model"]["w"], torch.tensor([3.0, 2.0, 3.0]))
    assert out["model"]["w"].dtype == torch.float32
    assert int(out["model"]["bn.num_batches_tracked"]) == 3  # counters are not averaged
    assert torch.equal(out["model"]["ids"], torch.tensor([1, 2]))
    assert out["epoch"] == 5 and out["averaged_from"] == [str(a), str(b), str(c)]  # the last file's epoch
    half = _save(tmp_path / "half.pt", torch.tensor([1.0, 2.0, 4.0]).half())
    assert average_checkpoints([half, half])["model"]["w"].dtype == torch.float16


@pytest.mark.parametrize("kind, match", [
    ("shape", "shape"), ("integer", "integer tensor 'ids' differs"),
    ("vocab", "vocabulary mismatch"), ("model", "model sections differ")])
def test_checkpoints_of_other_models_are_refused_naming_the_file(tmp_path, kind, match):
    a = _save(tmp_path / "a.pt", torch.ones(3))
    other = {"shape": lambda p: _save(p, torch.ones(4)), "integer": lambda p: _save(p, torch.ones(3), ids=(1, 3)),
             "vocab": lambda p: _save(p, torch.ones(3), vocab={"words": VOCAB["words"][:-1] + ["b"]}),
             "model": lambda p: _save(p, torch.ones(3), model_section={"decoder": {"hidden_dim": 8}})}[kind]
    b = other(tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match=match) as info:
        average_checkpoints([a, b])
    assert str(info.value).startswith(f"{b} cannot be averaged with {a}")


def test_batch_norm_counters_take_the_last_files_and_running_statistics_average(tmp_path):
    """Snapshots of a run whose fine-tuned batch norms update their statistics (model.encoder.update_bn_stats)
    differ in num_batches_tracked: averaging them used to stop at the very end of training ("the integer tensor
    ... differs"). The counter is the last file's; the running mean and variance are averaged like weights."""
    from captioner.api import build_model
    from captioner.config import config_to_dict
    from captioner.data.vocab import Vocab

    cfg = load_config(SMOKE, ["model.encoder.finetune_blocks=1", "model.encoder.update_bn_stats=true"])
    model = build_model(cfg, Vocab.build([["a", "red", "circle"]])).train()
    paths = []
    for epoch in (1, 2, 3):
        with torch.no_grad():
            for _ in range(epoch):  # each epoch sees more batches: the counters differ
                model.encode(torch.randn(2, 3, 64, 64) * epoch)
        paths.append(tmp_path / f"epoch-{epoch}.pt")
        save_checkpoint(paths[-1], {"model": {k: v.clone() for k, v in model.state_dict().items()},
                                    "config": config_to_dict(cfg), "vocab": model.vocab.to_dict(), "epoch": epoch})
    states = [load_checkpoint(p)["model"] for p in paths]
    counters = [k for k in states[0]
                if k.endswith("num_batches_tracked") and not torch.equal(states[0][k], states[2][k])]
    assert counters, "the fine-tuned block's batch norms should have counted batches"
    out = average_checkpoints(paths)["model"]
    for counter in counters:
        assert torch.equal(out[counter], states[-1][counter])
        mean = counter.replace("num_batches_tracked", "running_mean")
        torch.testing.assert_close(out[mean], sum(s[mean] for s in states) / 3)


def test_average_needs_weights_only(tmp_path):
    save_checkpoint(tmp_path / "x.pt", {"config": {}, "vocab": VOCAB})
    with pytest.raises(CheckpointError, match="no 'model' entry"):
        average_checkpoints([tmp_path / "x.pt"])


def test_average_last_needs_kept_epochs():
    with pytest.raises(ConfigError, match="train.keep_epochs=true"):
        load_config(SMOKE, ["train.average_last=2"])
    with pytest.raises(ConfigError, match="train.average_last: must be >= 0"):
        load_config(SMOKE, ["train.average_last=-1", "train.keep_epochs=true"])


@pytest.mark.slow
def test_a_run_keeps_its_epochs_and_averages_the_last_ones(tmp_path, capsys):
    """Three smoke epochs: three weights-only snapshots, averaged.pt the mean of the last two (the same as
    `captioner average --run RUN --last 2`), and the averaged model loads and captions."""
    from captioner.api import load_captioner
    from captioner.training.loop import train

    run_dir = train(load_config(SMOKE, [f"data.root={tmp_path / 'data'}", f"train.run_dir={tmp_path / 'run'}",
                                        "train.num_threads=1", "train.tensorboard_images=0", "train.epochs=3",
                                        "train.keep_epochs=true", "train.average_last=2"]))
    kept = RunDir(run_dir).epoch_snapshots()
    assert [p.name for p in kept] == ["epoch-001.pt", "epoch-002.pt", "epoch-003.pt"]
    # every entry the run wrote is one RunDir names, so a new run in this folder moves them all aside
    assert sorted(run_dir.iterdir()) == sorted(RunDir(run_dir).run_outputs())
    snapshot = load_checkpoint(kept[-1])
    assert "optimizer" not in snapshot and snapshot["epoch"] == 3
    last = load_checkpoint(run_dir / "last.pt")
    assert all(torch.equal(v, last["model"][k]) for k, v in snapshot["model"].items())
    averaged = load_checkpoint(RunDir(run_dir).averaged)
    key = next(k for k, v in snapshot["model"].items() if v.is_floating_point() and k.startswith("decoder."))
    two = [load_checkpoint(p)["model"][key] for p in kept[1:]]
    torch.testing.assert_close(averaged["model"][key], (two[0] + two[1]) / 2)
    assert not torch.equal(two[0], two[1])

    assert average.main(["--run", str(run_dir), "--last", "2", "--out", str(tmp_path / "cli.pt")]) == 0
    cli = load_checkpoint(tmp_path / "cli.pt")
    assert all(torch.equal(v, averaged["model"][k]) for k, v in cli["model"].items())
    assert average.main(["--run", str(run_dir), "--last", "4", "--out", str(tmp_path / "x.pt")]) == 1
    assert "kept only 3 epochs" in capsys.readouterr().err
    words = load_captioner(RunDir(run_dir).averaged).caption([str(next((tmp_path / "data").rglob("*.png")))],
                                                                   beam=2)[0]["words"]
    assert isinstance(words, list)
