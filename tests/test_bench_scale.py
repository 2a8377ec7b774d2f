"""scripts/bench_scale.py at its --quick size: what it writes is a data set and a feature cache the package reads
(COCO's 5 captions per image and ~10.5 words, 7x7x1280 float16 rows, every byte on disk), and every figure it
reports is present and positive. Timings themselves are not asserted (the machine is shared)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_scale.py"


def load_bench_scale():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scale"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_run_writes_a_readable_data_set_and_reports_positive_rates(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--tiny-model", "--dir", str(tmp_path), "--keep",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loader (2 workers) / step" in proc.stdout  # the table
    results = json.loads(out.read_text())
    folder = Path(results["folder"])
    assert folder.parent == tmp_path and folder.is_dir()  # --keep

    # the data set: Karpathy JSON, as data.format: karpathy reads it
    from captioner.config import DataConfig
    from captioner.data.datasets import load_records
    from captioner.data.features import FeatureCache

    data = json.loads((folder / "dataset_coco.json").read_text())
    images = data["images"]
    captions = [s for im in images for s in im["sentences"]]
    assert len(images) == 2000 and 5.0 <= len(captions) / len(images) < 5.01
    assert 10.2 < np.mean([len(s["tokens"]) for s in captions]) < 10.8
    config = DataConfig(format="karpathy", root=str(folder / "images"), captions=str(folder / "dataset_coco.json"))
    train = load_records(config, "train")
    assert len(train) == 1800  # train + restval

    # the cache: every image's 49 x 1280 float16 row, complete, written to the last byte (not sparse)
    cache = FeatureCache.open(folder / "cache")
    assert cache.shape == (2000, 49, 1280) and cache.complete
    assert all(im["filename"].removesuffix(".jpg") in cache for im in images)
    grids = folder / "cache" / "grids.f16"
    assert grids.stat().st_size == 2000 * 49 * 1280 * 2 <= grids.stat().st_blocks * 512
    rows = cache.get_batch([train[0].image_id, train[-1].image_id])
    assert rows.dtype == np.float16 and np.isfinite(rows).all() and np.abs(rows).max() < 1 and rows.std() > 0.1

    # the figures
    assert results["dataset"]["captions"] == 10_005 and results["open"]["vocab_words"] > 100
    for workers in ("0", "2", "4"):
        loader = results["loader"][workers]
        assert loader["batches_per_s"] > 0 and loader["first_batch_s"] > 0
        assert len(loader["worker_memory_mb"]) == int(workers)
    steps = results["steps"]  # the step at batch 64 and 256, with COCO's vocabulary size
    assert sorted(steps) == ["256", "64"] and all(s["batch"] == int(b) for b, s in steps.items())
    for s in steps.values():
        assert s["batches_per_s"] > 0 and s["vocab"] == 9_487 and s["hidden_dim"] == 32
        assert s["ops_per_step"] > 100 and s["gpu_busy_share"] is None  # CPU: no GPU figures
    # the recurrence dispatches per word, not per caption: a 4x larger batch adds few operations
    assert steps["256"]["ops_per_step"] < 1.5 * steps["64"]["ops_per_step"]
    epoch = results["epoch"]  # one whole epoch with 2 workers: every training caption once
    assert epoch["batches"] == -(-results["open"]["train_captions"] // 64) and epoch["seconds"] > 0
    assert len(epoch["worker_memory_mb"]) == 2 and all(m["Private"] > 0 for m in epoch["worker_memory_mb"])
    for read in ("pread", "memmap"):
        for world in ("1", "2"):
            ranks = results["rss"][read][world]
            assert [r["rank"] for r in ranks] == list(range(int(world)))
            assert all(r["VmHWM"] > 0 and r["RssAnon"] > 0 and r["RssFile"] > 0 for r in ranks)
    projection = results["projection"]
    assert projection["coco_epoch_projected_from_quick_data"] is True
    assert all(m > 0 for m in projection["coco_epoch_minutes_by_batch"].values())
    assert projection["loader2_over_step"] > 0 and all(h > 0 for h in projection["epoch_hours_by_workers"].values())
    assert all(g["workers"] >= 1 for g in projection["gpu_steps_per_s"].values())


def test_the_folder_is_deleted_unless_kept(tmp_path, monkeypatch, capsys):
    bench = load_bench_scale()
    seen = []

    def run(folder, quick, log=print, device="cpu", tiny=False, compile_mode="off", steps_only=False, on_part=None):
        (folder / "file").write_text("x")
        seen.append(folder)
        return {"quick": quick}

    monkeypatch.setattr(bench, "run", run)
    assert bench.main(["--quick", "--dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quick"] is True
    assert not seen[0].exists()
    assert bench.main(["--quick", "--dir", str(tmp_path), "--json", "--keep"]) == 0
    assert (seen[1] / "file").exists()


def test_caption_lengths_follow_the_stated_distribution():
    bench = load_bench_scale()
    lengths = bench.caption_lengths(200_000, np.random.default_rng(1))
    assert abs(lengths.mean() - 10.5) < 0.05 and abs(lengths.std() - 2.5) < 0.1
    assert lengths.min() >= 5 and lengths.max() <= 30


def test_steps_only_measures_the_training_steps_alone_and_writes_each_as_it_ends(tmp_path, capsys):
    """--steps-only (the GPU check's): the training step at each batch size and nothing of the loader or the
    processes; --out holds the results after each step (a time limit keeps them), the report a verdict per step."""
    bench = load_bench_scale()
    out = tmp_path / "steps.json"
    written = []
    real_write_text = Path.write_text

    def spy(self, text, *args, **kwargs):
        if self == out:
            written.append(json.loads(text))
        return real_write_text(self, text, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "STEP_BATCHES", (4, 8))
        mp.setattr(Path, "write_text", spy)
        assert bench.main(["--quick", "--tiny-model", "--steps-only", "--dir", str(tmp_path), "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results["steps"]) == {"4", "8"} and results["loader"] == {}
    assert "epoch" not in results and "rss" not in results and "projection" not in results
    assert [sorted(w["steps"]) for w in written] == [["4"], ["4", "8"], ["4", "8"]]  # after each step, then the end
    for r in results["steps"].values():
        assert r["batches_per_s"] > 0 and r["gpu_busy_share"] is None and r["graph_replays_per_step"] is None
    report = capsys.readouterr().out.splitlines()
    assert report[-2:] == [f"verdict: step batch {b} eager: ok ({results['steps'][b]['batches_per_s']:.2f} batches/s "
                           f"on cpu)" for b in ("4", "8")]


def test_a_compiled_step_without_graph_replays_is_called_a_fall_back():
    bench = load_bench_scale()
    step = {"batch": 64, "compile": "cudagraphs", "batches_per_s": 10.0, "device": "cuda", "gpu_busy_share": 0.9,
            "launches_per_step": 300.0, "graph_replays_per_step": 0.0}
    assert "no CUDA-graph replay: fell back to eager" in bench.step_verdict(step)
    assert bench.step_verdict({**step, "graph_replays_per_step": 1.0, "launches_per_step": 2.0}).startswith(
        "verdict: step batch 64 cudagraphs: ok (10.00 batches/s, busy 90 %, 2 launches and 1 graph replays per step")
    assert "GPU busy only 30 %" in bench.step_verdict({**step, "graph_replays_per_step": 1.0, "gpu_busy_share": 0.3})
