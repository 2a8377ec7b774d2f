"""scripts/attention_family.py, the attention family's driver, on the smoke config: two tiny rows write the table,
the JSON and the plots; a finished row is skipped on the next run; an interrupted one resumes from its last.pt.
Also the saturation figure on crafted attention maps and the pointer network's table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from captioner.evaluation.metrics import SATURATED_ALPHA, attention_sharpness

REPO = Path(__file__).resolve().parent.parent


def _driver():
    spec = importlib.util.spec_from_file_location("attention_family", REPO / "scripts" / "attention_family.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["attention_family"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """One smoke data set and feature cache for the module's driver runs: made by the first row trained, read after."""
    return tmp_path_factory.mktemp("family_data")


def _args(tmp_path: Path, data_root: Path, *extra: str) -> list[str]:
    return ["--config", str(REPO / "configs" / "smoke.yaml"), "--epochs", "1", "--runs", str(tmp_path / "runs"),
            "--json", str(tmp_path / "docs" / "family" / "family.json"), "--doc", str(tmp_path / "docs" / "family.md"),
            "--plots", str(tmp_path / "docs" / "family"), "--set", f"data.root={data_root}",
            "--set", "train.num_threads=1", "--scoring", "quick", "--entities", "", *extra]


@pytest.mark.slow
def test_the_driver_writes_the_table_json_and_plots_skips_a_finished_row_and_resumes_one(tmp_path, data_root, capsys):
    family = _driver()
    assert family.main(["run", "--rows", "soft_additive,soft_dot", *_args(tmp_path, data_root)]) == 0
    out = capsys.readouterr().out
    assert "[1/2] soft_additive" in out and "[2/2] soft_dot" in out and "left" in out  # progress and time left
    payload = json.loads((tmp_path / "docs" / "family" / "family.json").read_text())
    rows = {r["name"]: r for r in payload["rows"]}
    assert set(rows) == {"soft_additive", "soft_dot"} and payload["budget_epochs"] == 1
    for row in rows.values():
        assert row["epochs"] == 1 and row["parameters"] > 0 and row["CIDEr-D"] is not None
        assert 0.0 <= row["alpha_saturated"] <= 1.0 and row["train_wall_s"] >= 0
        assert "model.attention.scorer=" + row["scorer"] in row["sets"]
    assert rows["soft_additive"]["parameters"] != rows["soft_dot"]["parameters"]  # the scorers differ in weights
    page = (tmp_path / "docs" / "family.md").read_text()
    assert "| soft, additive (the paper's) |" in page and "| soft, dot product |" in page
    assert (tmp_path / "docs" / "family" / "quality-speed.png").stat().st_size > 1000

    # a second run skips both rows (no training: the checkpoints stay as they were)
    best = tmp_path / "runs" / "soft_dot" / "best.pt"
    stamp = best.stat().st_mtime_ns
    assert family.main(["run", "--rows", "soft_additive,soft_dot", *_args(tmp_path, data_root)]) == 0
    assert "soft_dot: done" in capsys.readouterr().out and best.stat().st_mtime_ns == stamp

    # the speed phase: the two rows taking turns, their figures in the table
    assert family.main(["speed", "--rows", "soft_additive,soft_dot", "--repeats", "2",
                        *_args(tmp_path, data_root)]) == 0
    speed = json.loads((tmp_path / "docs" / "family" / "speed.json").read_text())["rows"]
    assert set(speed) == {"soft_additive", "soft_dot"}
    assert all(v["train_captions_per_s"] > 0 and v["decode_images_per_s"] > 0 for v in speed.values())
    rows = {r["name"]: r for r in json.loads((tmp_path / "docs" / "family" / "family.json").read_text())["rows"]}
    assert rows["soft_dot"]["train_captions_per_s"] == speed["soft_dot"]["train_captions_per_s"]
    page = (tmp_path / "docs" / "family.md").read_text()

    # the page's own prose around the generated table survives a report
    doc = tmp_path / "docs" / "family.md"
    doc.write_text("# Family\n\nprose before\n\n" + page[page.index(family.TABLE_START):] + "\nprose after\n")
    (tmp_path / "docs" / "family" / "pointer.json").write_text(json.dumps(
        {"cpu": "test CPU", "rows": [{"length": 5, "steps": 30, "exact_match": 0.5, "train_s": 1.0}]}))
    assert family.main(["report", *_args(tmp_path, data_root)]) == 0
    text = doc.read_text()
    assert "prose before" in text and "prose after" in text and "| soft, dot product |" in text
    assert "| 5 | 30 | 50.0 % | 1 s |" in text  # the pointer table, from its JSON

    # an interrupted row (its evaluation lost, training one epoch short of a larger budget) resumes from last.pt
    (tmp_path / "docs" / "family" / "rows" / "soft_additive.json").unlink()
    assert family.main(["run", "--rows", "soft_additive", *_args(tmp_path, data_root, "--epochs", "2")]) == 0
    log = (tmp_path / "runs" / "soft_additive" / "family.log").read_text()
    assert "--resume" in log and "resuming" in log
    history = [json.loads(line) for line in
               (tmp_path / "runs" / "soft_additive" / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in history] == [1, 2]

    # --fresh trains and measures a finished row again (it used to print "done, skipped" and keep the old figures)
    capsys.readouterr()
    assert family.main(["run", "--rows", "soft_dot", "--fresh", *_args(tmp_path, data_root)]) == 0
    out = capsys.readouterr().out
    assert "soft_dot: done" not in out and "[1/1] soft_dot" in out and best.stat().st_mtime_ns != stamp
    row = json.loads((tmp_path / "docs" / "family" / "rows" / "soft_dot.json").read_text())
    assert row["evaluate"]["n_images"] > 0  # evaluate's whole result is kept for later columns
    assert "not measured" in doc.read_text()  # no boxes for the shapes photos: the columns say so

    # the boxes phase adds a finished row's box columns from its kept best.pt, without training it again
    from captioner.config import load_config
    from captioner.data.datasets import load_records
    from tests.entities_fixture import write_photo

    entities = tmp_path / "entities"
    cfg = load_config(REPO / "configs" / "smoke.yaml", [f"data.root={data_root}"])
    for record in load_records(cfg.data, "val"):
        write_photo(entities, record.image_id.split("_")[0],
                    ["[/EN#1/other a red circle] over [/EN#2/other a square] ."], (64, 64),
                    {"1": [(1, 1, 32, 64)], "2": [(33, 1, 64, 64)]})
    stamp = best.stat().st_mtime_ns
    assert family.main(["boxes", "--rows", "soft_dot", *_args(tmp_path, data_root), "--entities", str(entities)]) == 0
    row = json.loads((tmp_path / "docs" / "family" / "rows" / "soft_dot.json").read_text())
    assert best.stat().st_mtime_ns == stamp and row["evaluate"]["boxes"]["teacher_forced"]["words"] == 2 * 6
    assert 0 <= row["correctness_tf"] <= 1 and 0 <= row["pointing_tf"] <= 1
    assert "not measured" in _row_line(doc.read_text(), "soft, additive") and "not measured" not in _row_line(
        doc.read_text(), "soft, dot product")


def _row_line(page: str, label: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| {label}"))


def test_the_width_study_plot_and_the_saturated_share(tmp_path):
    family = _driver()
    fam = family.Family(config=Path("c.yaml"), runs=tmp_path, epochs=1, json_path=tmp_path / "f.json",
                        doc=tmp_path / "doc.md", plots=tmp_path / "plots")
    rows = [{"name": f"kv_{s}_{w}", "scorer": s, "attention": "key_value", "key_width": w, "CIDEr-D": 1.0,
             "in_run_captions_per_s": 10.0, "alpha_entropy": e, "alpha_saturated": sat}
            for s, w, e, sat in [("dot", 64, 0.5, 0.1), ("dot", 1024, 0.1, 0.8), ("scaled_dot", 64, 0.6, 0.0),
                                 ("scaled_dot", 1024, 0.5, 0.05)]]
    written = family.write_plots(fam, rows)
    assert [p.name for p in written] == ["quality-speed.png", "entropy-width.png"]


def test_the_saturated_share_counts_words_whose_largest_weight_passes_the_threshold():
    L = 49
    uniform = np.full((3, L), 1.0 / L)
    peaked = np.full((2, L), (1 - 0.995) / (L - 1))
    peaked[:, 7] = 0.995  # saturated: 0.995 > 0.99
    almost = np.full((1, L), (1 - 0.985) / (L - 1))
    almost[:, 3] = 0.985  # sharp but not saturated
    figures = attention_sharpness([uniform, peaked, almost])
    assert SATURATED_ALPHA == 0.99
    assert figures["alpha_saturated"] == pytest.approx(2 / 6)
    assert attention_sharpness([uniform])["alpha_saturated"] == 0.0
    assert attention_sharpness([])["alpha_saturated"] is None


def test_saturation_from_crafted_scores_grows_with_their_scale_unless_scaled():
    """Dot-product scores of unit-variance keys and query grow like sqrt(D): the softmax saturates at large D unless
    the scores are divided by sqrt(D) (Vaswani et al. 2017, Sec. 3.2.1) — the claim the width study measures."""
    rng = np.random.default_rng(0)

    def share(width: int, scaled: bool) -> float:
        keys = rng.standard_normal((200, 49, width))  # (B, L, D)
        query = rng.standard_normal((200, width))  # (B, D)
        scores = np.einsum("bld,bd->bl", keys, query) / (np.sqrt(width) if scaled else 1.0)
        alpha = np.exp(scores - scores.max(axis=1, keepdims=True))
        alpha /= alpha.sum(axis=1, keepdims=True)
        return attention_sharpness([alpha])["alpha_saturated"]

    assert share(1024, scaled=False) > 0.5 > share(1024, scaled=True)
    assert share(64, scaled=False) < share(1024, scaled=False)
    assert share(1024, scaled=True) < 0.05


def test_the_pointer_table_trains_and_scores_each_length():
    family = _driver()
    rows = family.pointer_table(lengths=(3, 4), steps=30, eval_size=50)
    assert [r["length"] for r in rows] == [3, 4]
    for row in rows:
        assert 0.0 <= row["exact_match"] <= 1.0 and row["train_s"] > 0 and row["steps"] == 30


def test_head_figures_on_crafted_maps_tell_heads_on_one_cell_from_heads_apart():
    import torch

    family = _driver()
    L, side = 16, 4
    one_hot = torch.zeros(L)
    one_hot[5] = 1.0
    same = one_hot.expand(3, 2, L)  # 3 words, 2 heads, both on cell 5
    figures = family.head_figures(same)
    assert figures["head_overlap"] == pytest.approx(1.0) and figures["heads_agree"] == 1.0
    assert figures["distinct_head_cells"] == 1.0 and figures["head_cell_distance"] == 0.0
    assert figures["head_alpha_max"] == pytest.approx(1.0) and figures["head_alpha_entropy"] == pytest.approx(0.0)
    assert figures["uniform_overlap"] == pytest.approx(1 / L)

    apart = torch.zeros(1, 2, L)
    apart[0, 0, 0] = 1.0  # cell (0, 0)
    apart[0, 1, 3 * side + 3] = 1.0  # cell (3, 3): 3√2 cells away
    figures = family.head_figures(apart)
    assert figures["head_overlap"] == 0.0 and figures["heads_agree"] == 0.0 and figures["distinct_head_cells"] == 2
    assert figures["head_cell_distance"] == pytest.approx(3 * 2 ** 0.5)
    assert figures["mean_map_alpha_max"] == pytest.approx(0.5)

    flat = torch.full((4, 3, L), 1.0 / L)
    figures = family.head_figures(flat)
    assert figures["head_overlap"] == pytest.approx(1.0) and figures["uniform_overlap"] == pytest.approx(1.0)
    assert figures["head_alpha_entropy"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="square grid"):
        family.head_figures(torch.full((2, 2, 15), 1 / 15))
    with pytest.raises(ValueError, match="M >= 2"):
        family.head_figures(torch.full((2, 1, 16), 1 / 16))


@pytest.mark.slow
def test_the_heads_phase_measures_a_trained_multi_head_row_and_reports_it(tmp_path, data_root, capsys):
    import shutil

    family = _driver()
    args = _args(tmp_path, data_root)
    assert family.main(["run", "--rows", "multi_head_4", *args]) == 0
    # a finished single-map row: its folder holds a best.pt (a copy: its kind, not its weights, leaves it out)
    shutil.copytree(tmp_path / "runs" / "multi_head_4", tmp_path / "runs" / "soft_dot")
    assert family.main(["heads", "--rows", "multi_head_4,soft_dot", "--head-images", "6", *args]) == 0
    heads = json.loads((tmp_path / "docs" / "family" / "heads.json").read_text())["rows"]
    assert set(heads) == {"multi_head_4"}  # a single-map row has no heads to compare
    figures = heads["multi_head_4"]
    assert figures["heads"] == 4 and figures["images"] == 6 and figures["words"] > 0
    assert 1.0 <= figures["distinct_head_cells"] <= 4.0 and 0.0 <= figures["head_overlap"] <= 1.0
    page = (tmp_path / "docs" / "family.md").read_text()
    assert "what the heads read apart" in page and f"{figures['distinct_head_cells']:.2f} of 4" in page
