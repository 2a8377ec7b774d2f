"""The attention family as a study (captioner/recipes/attention_family.yaml) on the shapes data: a small study of the
same form trains and records its variants, renders the page's table from the records, and runs nothing when run
again; a variant without stages evaluates another's weights at GVD's beams with the paired intervals against it
(the same weights: every difference exactly 0); the speed and heads measurements (scripts/bench_attention_family.py).
Also the saturation figure on crafted attention maps, the heads' figures, the plots and the pointer network's table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from captioner.cli import main as cli
from captioner.evaluation.metrics import SATURATED_ALPHA, attention_sharpness
from captioner.reports import family as family_report
from captioner.training.recipes import load_recipes, plan

REPO = Path(__file__).resolve().parent.parent


def _bench():
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_attention_family

    return bench_attention_family


def _study(folder: Path) -> Path:
    """The family's form on the smoke config: two variants that differ in their attention, and one that evaluates
    the first's weights again (no stages) with GVD's beams and the paired intervals against it."""
    smoke = {"train.epochs": 1, "train.num_threads": 1, "train.tensorboard": "off", "train.tensorboard_images": 0,
             "train.run_dir": "runs/family/{variant}"}
    data = {"description": "two variants of the family, tiny", "records": "docs/attention-family/rows",
            "set": smoke, "stages": [{"config": "smoke"}],
            "evaluate": {"split": "val", "beam": 2, "mirror_check": True, "meteor": False},
            "variants": {
                "soft_additive": {"info": {"label": "soft, additive", "study": "family", "scorer": "additive",
                                           "attention": "soft", "key_width": None},
                                  "set": {"model.attention.scorer": "additive"},
                                  "evaluate": {"entities": "entities", "gvd": True}},
                "multi_head_4": {"info": {"label": "multi-head, 4 heads", "study": "family", "scorer": "additive",
                                          "attention": "multi_head", "key_width": None},
                                 "set": {"model.attention.attention": "multi_head", "model.attention.heads": 4}},
                "again": {"info": {"label": "the first again", "study": "check"}, "stages": [],
                          "evaluate": {"model": "runs/family/soft_additive", "entities": "entities", "gvd": True,
                                       "default": "soft_additive", "references": "data/smoke/dataset_shapes.json"}}}}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _write_entities(folder: Path) -> None:
    """Flickr30k Entities files for the smoke val photos: two boxed phrases each."""
    from captioner.config import load_config
    from captioner.data.datasets import load_records
    from tests.entities_fixture import write_photo

    cfg = load_config(REPO / "configs" / "smoke.yaml")
    for record in load_records(cfg.data, "val"):
        write_photo(folder, record.image_id.split("_")[0],
                    ["[/EN#1/other a red circle] over [/EN#2/other a square] ."], (64, 64),
                    {"1": [(1, 1, 32, 64)], "2": [(33, 1, 64, 64)]})


@pytest.mark.slow
def test_a_study_records_its_variants_renders_the_table_and_measures_speed_and_heads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # data, runs and records land here
    study = _study(tmp_path)
    assert cli(["recipe", "run", str(study), "--variant", "multi_head_4"]) == 0  # the data drawn, the grids made
    _write_entities(tmp_path / "entities")
    assert cli(["recipe", "run", str(study)]) == 0
    out = capsys.readouterr().out
    assert "[recipe study/multi_head_4] every stage done and evaluated" in out  # the first variant is not redone
    rows = {name: json.loads((tmp_path / "docs/attention-family/rows" / f"{name}.json").read_text())
            for name in ("soft_additive", "multi_head_4", "again")}
    for name in ("soft_additive", "multi_head_4"):
        row = rows[name]
        assert row["name"] == name and row["split"] == "val" and row["beam_size"] == 2 and row["parameters"] > 0
        own = (["model.attention.scorer=additive"] if name == "soft_additive" else
               ["model.attention.attention=multi_head", "model.attention.heads=4"])
        assert row["train_commands"] == [
            "captioner train --config smoke --set train.epochs=1 --set train.num_threads=1 --set train.tensorboard=off "
            f"--set train.tensorboard_images=0 --set train.run_dir=runs/family/{name} "
            + " ".join(f"--set {k}" for k in own)]
        assert [e["epoch"] for e in row["last_stage_epochs"]] == [1] and row["provenance"]["cpu"]
    assert rows["soft_additive"]["parameters"] != rows["multi_head_4"]["parameters"]

    # GVD's beams with their results files, and the paired intervals of the same weights: every difference 0
    gvd = rows["soft_additive"]["gvd"]
    assert set(gvd) == {"beam3", "beam1"} and "--beam 1 " in gvd["beam1"]["command"]
    assert Path("runs/recipes/study/results/soft_additive.beam1.json").is_file()
    again = rows["again"]
    assert again["train_commands"] == [] and again["scores"] == rows["soft_additive"]["scores"]
    assert again["vs_default"]["CIDEr-D"]["difference"] == 0.0
    assert again["vs_default"]["CIDEr-D"]["low"] == again["vs_default"]["CIDEr-D"]["high"] == 0.0

    # the page's table, from the records (the variants not in the shipped study come after its own, by name)
    table = family_report.format_tables(tmp_path)
    assert "| soft, additive |" in table and "| multi-head, 4 heads |" in table and "the first again" not in table
    line = next(line for line in table.splitlines() if line.startswith("| soft, additive |"))
    assert f"| {rows['soft_additive']['scores']['CIDEr-D']:.1f} |" in line and "not measured" not in line

    # once done, the study runs nothing
    monkeypatch.setattr("captioner.training.recipe_runs.run_child",
                        lambda *a, **k: pytest.fail("a recorded study runs nothing"))
    assert cli(["recipe", "run", str(study)]) == 0
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)

    # speed: the variants taking turns; heads: the multi-head variant's alone
    bench = _bench()
    out_dir = tmp_path / "docs" / "attention-family"
    assert bench.main(["speed", "--recipe", str(study), "--repeats", "2", "--out", str(out_dir)]) == 0
    speed = json.loads((out_dir / "speed.json").read_text())["rows"]
    assert set(speed) == {"soft_additive", "multi_head_4"}  # "again" trains nothing
    assert all(v["train_captions_per_s"] > 0 and v["decode_images_per_s"] > 0 for v in speed.values())
    assert bench.main(["heads", "--recipe", str(study), "--head-images", "6", "--out", str(out_dir)]) == 0
    heads = json.loads((out_dir / "heads.json").read_text())["rows"]
    assert set(heads) == {"multi_head_4"}  # a single-map variant has no heads to compare
    figures = heads["multi_head_4"]
    assert figures["heads"] == 4 and figures["images"] == 6 and figures["words"] > 0
    assert 1.0 <= figures["distinct_head_cells"] <= 4.0 and 0.0 <= figures["head_overlap"] <= 1.0
    table = family_report.format_tables(tmp_path)
    assert f"{figures['distinct_head_cells']:.2f} of 4" in table
    assert f"| {speed['multi_head_4']['train_captions_per_s']:.1f} |" in table


def test_the_shipped_study_plans_every_variant_as_its_table_names_them():
    """Every variant of the shipped family study plans (its config loads with its sets) and has a record whose label
    is the variant's; the page's rows come in the study's order."""
    recipes = load_recipes("attention_family")
    assert len(recipes) == 16
    for recipe in recipes:
        stage = plan(recipe)[-1]
        assert stage.cfg.train.run_dir == f"runs/family/{recipe.variant}" and stage.cfg.train.epochs == 2
        record = json.loads((REPO / recipe.record).read_text())
        assert record["label"] == dict(recipe.info)["label"]
    tables = family_report.format_tables(REPO).split("**Multi-head")[0]  # the family's and the widths' tables
    labels = [line.split("|")[1].strip() for line in tables.splitlines()
              if line.startswith("| ") and "BLEU-4" not in line]
    assert labels == [dict(r.info)["label"] for r in recipes]


def test_the_plots_are_drawn_from_the_records(tmp_path):
    folder = tmp_path / family_report.FOLDER / "rows"
    folder.mkdir(parents=True)
    for s, w, e, sat in [("dot", 64, 0.5, 0.1), ("dot", 1024, 0.1, 0.8), ("scaled_dot", 64, 0.6, 0.0),
                         ("scaled_dot", 1024, 0.5, 0.05)]:
        (folder / f"kv_{s}_{w}.json").write_text(json.dumps(
            {"name": f"kv_{s}_{w}", "scorer": s, "attention": "key_value", "key_width": w, "CIDEr-D": 1.0,
             "in_run_captions_per_s": 10.0, "alpha_entropy": e, "alpha_saturated": sat}))
    written = family_report.write_plots(tmp_path)
    assert [p.name for p in written] == ["quality-speed.png", "entropy-width.png"]
    assert all(p.stat().st_size > 1000 for p in written)


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
    family = _bench()
    rows = family.pointer_table(lengths=(3, 4), steps=30, eval_size=50)
    assert [r["length"] for r in rows] == [3, 4]
    for row in rows:
        assert 0.0 <= row["exact_match"] <= 1.0 and row["train_s"] > 0 and row["steps"] == 30


def test_head_figures_on_crafted_maps_tell_heads_on_one_cell_from_heads_apart():
    import torch

    family = _bench()
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


