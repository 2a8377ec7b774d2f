"""`captioner demo`, `evaluate` and `caption` end to end on the smoke config (tiny, seconds)."""

import json
from pathlib import Path

import pytest

from captioner.cli import main as cli

SMOKE = str(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml")
# Eight smoke epochs (about 20 s) reach val (beam 2) BLEU-4 24.7 and CIDEr-D 38.7, where the same model
# before training scores BLEU-4 0.0 and CIDEr-D 17.3 (random words now and then hit a reference n-gram).
EPOCHS = 8
MIN_BLEU4, MIN_CIDER = 10.0, 25.0


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    run_dir = root / "run"
    code = cli(["demo", "--config", SMOKE, "--run-dir", str(run_dir), "--n-captions", "2", "--no-meteor",
                "--set", f"data.root={root / 'data'}", "--set", f"train.epochs={EPOCHS}",
                "--set", "train.tensorboard_images=0"])  # per-epoch overlays: tests/test_tblog.py
    assert code == 0
    return root, run_dir


@pytest.mark.slow
def test_demo_writes_checkpoint_summary_and_overlays(demo_run, capsys):
    root, run_dir = demo_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["test"]["scores"]) >= {"BLEU-4", "CIDEr-D", "ROUGE-L"}
    assert summary["test"]["split"] == "test"
    overlays = sorted((run_dir / "overlays").glob("*.png"))
    assert len(overlays) == 2 and all(p.stat().st_size > 1000 for p in overlays)
    assert (run_dir / "best.pt").exists() and (run_dir / "metrics.jsonl").exists()
    # step 0: real photographs captioned by the shipped model, each with its overlay
    from captioner.demo import PHOTOS

    for name in PHOTOS:
        assert (run_dir / "photos" / f"{name}.png").is_file(), name
        assert (run_dir / "photos" / f"{name}_attention.png").stat().st_size > 1000, name
    # every entry the demo wrote is one RunDir names: a new run moves them aside, the shipped model's photos stay
    from captioner.store.rundir import RunDir

    run = RunDir(run_dir)
    assert sorted(run_dir.iterdir()) == sorted([*run.run_outputs(), run.photos])
    # a second run reuses the finished training instead of training again
    mtime = (run_dir / "best.pt").stat().st_mtime_ns
    assert cli(["demo", "--config", SMOKE, "--run-dir", str(run_dir), "--n-captions", "1", "--no-meteor",
                "--no-photos", "--set", f"data.root={root / 'data'}", "--set", "train.epochs=1"]) == 0
    assert (run_dir / "best.pt").stat().st_mtime_ns == mtime
    assert "reusing" in capsys.readouterr().out


@pytest.mark.slow
def test_evaluate_json(demo_run, capsys):
    _, run_dir = demo_run
    capsys.readouterr()
    assert cli(["evaluate", "--checkpoint", str(run_dir), "--split", "val", "--beam", "2", "--no-meteor",
                "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "val" and result["beam_size"] == 2 and result["attention_mode"] == "expectation"
    assert result["scores"]["METEOR"] is None  # skipped, reported as unavailable rather than 0
    for name in ("BLEU-1", "BLEU-4", "ROUGE-L"):
        assert 0.0 <= result["scores"][name] <= 100.0
    assert result["scores"]["BLEU-4"] >= MIN_BLEU4 and result["scores"]["CIDEr-D"] >= MIN_CIDER
    assert result["grounding"] is None or 0.0 <= result["grounding"] <= 1.0
    assert result["tokenizer"] in ("ptb", "simple")
    assert result["grids"] == "feature cache"  # the demo's frozen encoder cached every grid
    L = result["locations"]
    assert 1.0 / L - 1e-6 <= result["alpha_max"] <= 1.0 and 0.0 <= result["alpha_entropy"] <= 1.0 + 1e-6
    # The table says the same, with the tokenizer named.
    assert cli(["evaluate", "--checkpoint", str(run_dir), "--split", "val", "--beam", "2", "--no-meteor",
                "--tokenizer", "simple", "--length-penalty", "0.5"]) == 0
    table = capsys.readouterr().out
    assert "tokenizer=simple" in table and "length_penalty=0.5" in table
    assert "alpha max" in table and "alpha ent" in table


@pytest.mark.slow
def test_caption_cli_writes_overlays_and_json(demo_run, tmp_path, capsys):
    root, run_dir = demo_run
    images = sorted((root / "data" / "images").glob("*.png"))[:3]
    out_dir = tmp_path / "overlays"
    capsys.readouterr()
    code = cli(["caption", *map(str, images), "--checkpoint", str(run_dir), "--beam", "2", "--n-best", "2",
                "--attention-out", str(out_dir), "--gif", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in doc["results"]] == list(map(str, images))
    assert doc["failed"] == []
    for r in doc["results"]:
        assert len(r["n_best"]) == 2 and r["grid_hw"] and Path(r["overlay"]).exists()
    assert len(list(out_dir.glob("*.gif"))) == 3


@pytest.mark.slow
def test_training_beats_the_untrained_model(demo_run):
    """The checkpoint against the very model training started from (same seed, same config): on the
    same images, with the same decoding, training must have bought a real margin."""
    import torch

    from captioner import load_captioner
    from captioner.api import build_model
    from captioner.data.datasets import load_records
    from captioner.evaluation.split import cached_grids, evaluate_model
    from captioner.training.distributed import seed_everything

    _, run_dir = demo_run
    trained = load_captioner(run_dir)
    cfg = trained.config
    seed_everything(cfg.train.seed)  # what train() does right before it builds the model
    untrained = build_model(cfg, trained.vocab).eval()
    records = load_records(cfg.data, "val")
    scores = {}
    for name, model in (("trained", trained), ("untrained", untrained)):
        with torch.no_grad():
            result = evaluate_model(model, records, model.decode_options.replace_given(beam=2),
                                    cache=cached_grids(model, records), meteor=False, progress=False)
        scores[name] = result["scores"]
    assert scores["trained"]["CIDEr-D"] >= scores["untrained"]["CIDEr-D"] + 10.0, scores
    assert scores["trained"]["BLEU-4"] >= scores["untrained"]["BLEU-4"] + MIN_BLEU4, scores


@pytest.mark.slow
def test_the_demo_trains_its_epochs_and_says_when_a_run_stopped_early(demo_run, tmp_path):
    """`make demo` on a busy machine stopped after one epoch on its 10-minute budget and showed a weak model with no
    word of why: the budget is the config's epochs now (--time-budget is optional), and the summary says it."""
    from captioner.commands.demo import stopped_early
    from captioner.store.checkpoint import load_checkpoint, save_checkpoint
    from captioner.store.rundir import RunDir

    _, run_dir = demo_run
    assert json.loads((run_dir / "summary.json").read_text())["stopped_early"] is None  # every epoch trained
    payload = load_checkpoint(run_dir / "last.pt")
    short = RunDir(tmp_path / "short")
    short.root.mkdir()
    save_checkpoint(short.last, {**payload, "epoch": 1, "stop": "time budget"})
    assert stopped_early(short, 12) == ("stopped after epoch 1 of 12: --time-budget ended it; without one the demo "
                                        "trains every epoch; the scores are those of a shorter run")
    save_checkpoint(short.last, {**payload, "epoch": 4, "stop": "patience"})
    assert "stopped after epoch 4 of 12: validation stopped improving" in stopped_early(short, 12)
    assert stopped_early(short, 4) is None
