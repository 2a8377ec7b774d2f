"""Recipes (issue 72): a model's chain of runs declared once (captioner/training/recipes.py), run stage by stage with
its records (captioner/training/recipe_runs.py), from `captioner recipe` (captioner/commands/recipe.py).

Fast: the shipped recipes follow their configs' chains and every shipped model's card names its recipe; the default's
dry run prints exactly today's chain; a malformed recipe is named with its file and key; a stage whose inputs changed
since its record is refused, naming the change, and --redo accepts it. Slow (about 40 s): a small recipe on the
shapes data from a scratch working folder, end to end: the first stage alone, a SIGTERM inside the second (passed on to
the training, which saves), the run again (the first stage skipped, the second continued from its last.pt,
averaged, evaluated, recorded), once more (nothing to do), the report, a refused change and its --redo."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml

import captioner.training.recipe_runs as recipe_runs
from captioner.cli import main as cli
from captioner.config import config_to_dict, load_config
from captioner.store.rundir import RunDir
from captioner.store.zoo import SHIPPED_DIR, scan_models
from captioner.training.recipes import RecipeError, load_recipe, load_recipes, plan, shipped_recipes

DEFAULT_CHAIN = [
    "captioner train --config flickr8k_soft",
    "captioner train --config flickr8k_soft_scst --init runs/flickr8k_soft",
    "captioner train --config flickr8k_soft_scst_more --init runs/flickr8k_soft_scst",
    "captioner evaluate --checkpoint runs/flickr8k_soft_scst_more/averaged.pt --split val --beam 3 --json",
]
# the evaluation keeps its captions, and the shipped file is evaluated alike for the paired intervals
RESULTS = "runs/recipes/flickr8k_soft/results"
DEFAULT_EVALUATION = [
    f"captioner evaluate --checkpoint runs/flickr8k_soft_scst_more/averaged.pt --split val --beam 3 --results-file "
    f"{RESULTS}/flickr8k_soft.beam3.json --json",
    f"captioner evaluate --checkpoint flickr8k_soft --split val --beam 3 --results-file {RESULTS}/compared.beam3.json "
    "--json"]


def _commands(out: str) -> list[str]:
    """A dry run's commands (its other lines are shell comments)."""
    return [line for line in out.splitlines() if line and not line.startswith("#")]


def test_the_default_dry_run_prints_todays_chain_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no data, no runs: a dry run needs neither
    assert cli(["recipe", "run", "flickr8k_soft", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _commands(out) == DEFAULT_CHAIN[:3] + DEFAULT_EVALUATION
    assert DEFAULT_EVALUATION[0].replace(f" --results-file {RESULTS}/flickr8k_soft.beam3.json", "") == DEFAULT_CHAIN[3]
    assert "budget 1 h 0 min (train.time_budget_s)" in out and "budget 56 min 40 s" in out
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_every_shipped_model_has_a_recipe_that_its_card_names():
    models, _ = scan_models()
    assert len(models) >= 3
    for name in models:
        assert name in shipped_recipes(), name
        card = (SHIPPED_DIR / name / "README.md").read_text()
        assert f"Rebuild: `captioner recipe run {name}`" in card, name


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_a_shipped_recipe_follows_its_configs_chain(name):
    """Each stage after the first starts from the one before, as its config's own header and train.init say; the
    shipped models' recipes keep their configs' run folders (so they rebuild what the cards name). In a study, two
    variants' stages that share a run folder are the same run (one config), so neither overwrites the other's."""
    runs: dict[str, dict] = {}
    for recipe in load_recipes(name):
        stages = plan(recipe)
        for before, stage in zip(stages, stages[1:]):
            assert stage.init == before.weights and stage.cfg.train.init == before.weights
            if not stage.stage.sets:  # a config as it ships: its own train.init names the stage before
                assert load_config(stage.config_file).train.init == before.weights, (recipe.title, stage.name)
        if name.startswith("flickr8k"):
            assert all(s.stage.sets == () for s in stages)  # the configs as they ship
            assert recipe.evaluation.split == "val" and recipe.evaluation.beam == 3
        assert len({str(s.run) for s in stages}) == len(stages)
        for stage in stages:
            config = config_to_dict(stage.cfg)
            assert runs.setdefault(str(stage.run), config) == config, (recipe.title, str(stage.run))


def test_the_shipped_chains():
    soft, hard, grounded = (plan(load_recipe(n)) for n in ("flickr8k_soft", "flickr8k_hard", "flickr8k_grounded"))
    assert [s.name for s in hard] == ["flickr8k_soft_pointing", "flickr8k_soft_pointing_scst",
                                      "flickr8k_soft_pointing_scst_more", "flickr8k_hard_pointing_from_soft",
                                      "flickr8k_hard_pointing_from_soft_scst",
                                      "flickr8k_hard_pointing_from_soft_scst_more"]
    assert hard[3].init == "runs/flickr8k_soft_pointing_scst_more/averaged.pt"  # the averaged soft model
    assert soft[-1].weights.endswith("averaged.pt") and hard[-1].weights.endswith("averaged.pt")
    assert [s.name for s in grounded] == ["flickr8k_soft_grounded", "flickr8k_soft_grounded_scst"]
    assert grounded[-1].weights == "runs/flickr8k_soft_grounded_scst"  # its best epoch, not averaged
    e = load_recipe("flickr8k_hard").evaluation
    assert (e.attention_mode, e.mirror_check, e.entities) == ("argmax", True, "data/flickr8k/flickr30k_entities")


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("data, expected", [
    ({"stages": [{"config": "smoke"}], "extra": 1}, "the top level: unknown key 'extra' (valid: description, set"),
    ({"stages": [{"config": "smoke", "sett": {}}]}, "stages[0]: unknown key 'sett' (valid: config, name, set"),
    ({"stages": []}, "stages: expected a list of stages"),
    ({"stages": [{"name": "a"}]}, "stages[0].config: expected a config's name or path"),
    ({"stages": [{"config": "smokey"}]}, "no shipped config is named 'smokey' (shipped: "),
    ({"stages": [{"config": "missing.yaml"}]}, "config file not found: "),
    ({"stages": [{"config": "smoke", "set": {"train.lrr": 1}}]}, "train.lrr"),
    ({"stages": [{"config": "smoke"}, {"config": "smoke", "name": "b"}]}, "writes runs/smoke (train.run_dir), as "
                                                                          "stage 'smoke' does"),
    ({"stages": [{"config": "smoke"}, {"config": "smoke"}]}, "two stages are named 'smoke'"),
    ({"stages": [{"config": "smoke"}], "evaluate": {"split": "dev"}}, "evaluate.split: expected one of train, val"),
    ({"stages": [{"config": "smoke"}], "evaluate": {"beams": 3}}, "evaluate: unknown key 'beams' (valid: split, beam"),
    ({"stages": [{"config": "smoke", "average_last": -1}]}, "stages[0].average_last"),
    ({"stages": [{"config": "smoke"}], "evaluate": {"compare": ""}}, "evaluate.compare: expected a model's name or "
                                                                     "path"),
])
def test_a_malformed_recipe_is_named_with_its_file_and_key(tmp_path, data, expected):
    path = _write(tmp_path / "bad.yaml", data)
    with pytest.raises(RecipeError) as err:
        plan(load_recipe(path))
    assert str(path) in str(err.value) and expected in str(err.value)


STUDY = {"records": "rows", "stages": [{"config": "smoke"}], "set": {"train.run_dir": "runs/s/{variant}"},
         "variants": {"a": {}, "b": {"set": {"train.lr": 0.002}}}}


@pytest.mark.parametrize("change, expected", [
    ({"record": "r.json"}, "record: a study writes one record per variant"),
    ({"records": None}, "records: expected the folder of the variants' records"),
    ({"variants": {}}, "variants: expected at least one"),
    ({"variants": {"a": {"sets": {}}}}, "variants.a: unknown key 'sets' (valid: info, set, stages, evaluate)"),
    ({"variants": {"a": {"stages": []}}}, "variants.a.stages: expected a list of stages"),
    ({"variants": {"a": {"evaluate": {"model": "flickr8k_soft"}}}}, "evaluate.model: evaluates a given model, so "
                                                                     "the recipe has no stages"),
    ({"variants": {"a": {"evaluate": {"gvd": True}}}}, "variants.a.evaluate.gvd: expected true or false (true "
                                                        "needs entities"),
    ({"variants": {"a": {"evaluate": {"gvd": True, "entities": "e", "default": "c"}}}},
     "variants.a.evaluate.default: no variant is named 'c'"),
])
def test_a_malformed_study_is_named_with_its_file_and_key(tmp_path, change, expected):
    path = _write(tmp_path / "study.yaml", {**STUDY, **change})
    with pytest.raises(RecipeError) as err:
        load_recipes(path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_a_study_gives_each_variant_its_own_runs_and_record_and_refuses_an_unknown_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path / "study.yaml", STUDY)
    a, b = load_recipes(path)
    assert (a.title, b.title) == ("study/a", "study/b") and (a.record, b.record) == ("rows/a.json", "rows/b.json")
    assert plan(a)[0].cfg.train.run_dir == "runs/s/a" and plan(b)[0].cfg.train.lr == 0.002
    assert [r.variant for r in load_recipes(path, ["b"])] == ["b"]
    with pytest.raises(RecipeError, match="no variant is named 'c' .*its variants: a, b"):
        load_recipes(path, ["c"])
    with pytest.raises(RecipeError, match="a study of 2 variants .*name one with --variant"):
        load_recipe(path)
    assert cli(["recipe", "run", str(path), "--dry-run"]) == 0
    commands = _commands(capsys.readouterr().out)
    assert commands[0] == "captioner train --config smoke --set train.run_dir=runs/s/a"
    assert commands[2] == "captioner train --config smoke --set train.run_dir=runs/s/b --set train.lr=0.002"
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a.json").write_text(json.dumps({"scores": {}}))  # recorded before recipes existed
    assert cli(["recipe", "run", str(path), "--variant", "a", "--dry-run"]) == 0
    assert "[recipe study/a] recorded before recipes existed (rows/a.json): kept" in capsys.readouterr().out
    assert cli(["recipe", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "a  recorded (before recipes)" in shown and "b  to do" in shown


def test_unknown_recipes_and_stages_list_the_valid_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["recipe", "run", "flickr8k_sotf", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "recipe not found: flickr8k_sotf" in err and ", ".join(shipped_recipes()) in err
    assert cli(["recipe", "run", "flickr8k_soft", "--only", "scst", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "--only scst: no such stage" in err and "flickr8k_soft, flickr8k_soft_scst, flickr8k_soft_scst_more, " \
                                                   "evaluate" in err


def _two_stage_recipe(tmp_path: Path, lr: str = "1.0e-3") -> Path:
    """A recipe of the smoke config's two stages in tmp_path (nothing trained by the fast tests that use it)."""
    return _write(tmp_path / "smoke_two.yaml", {"stages": [
        {"name": "xe", "config": "smoke", "set": {"train.run_dir": "runs/two/xe"}},
        {"name": "scst", "config": "smoke", "set": {"train.run_dir": "runs/two/scst", "train.lr": float(lr)}}]})


def _fake_done(p) -> None:
    """``p``'s run folder as a finished stage leaves it: its run.json, a weights file and a record of its inputs."""
    run = p.run
    run.root.mkdir(parents=True)
    run.run_file.write_text(json.dumps({"run_id": f"id-{p.name}"}))
    run.best.write_bytes(b"weights of " + p.name.encode())
    record = {"inputs": recipe_runs.stage_inputs(p), "finished": "now", "run_id": f"id-{p.name}", "wall_s": 1.0}
    run.stage.write_text(json.dumps(record))


def test_a_changed_stage_is_refused_naming_the_change_and_redo_accepts_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recipe_runs, "run_child", lambda *a, **k: pytest.fail("nothing may run"))
    path = _two_stage_recipe(tmp_path)
    xe, scst = plan(load_recipe(path))
    _fake_done(xe)
    _fake_done(scst)
    assert cli(["recipe", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage 1/2 xe: done" in out and "stage 2/2 scst: done" in out and _commands(out) == [
        "captioner evaluate --checkpoint runs/two/scst --split val --beam 3 --json"]
    _two_stage_recipe(tmp_path, lr="2.0e-3")
    assert cli(["recipe", "run", str(path)]) == 1
    out = capsys.readouterr().out
    assert "stage 'scst': refused: its inputs changed since its record" in out
    assert "train.lr: 0.001 -> 0.002" in out and f"captioner recipe run {path} --redo scst" in out
    assert cli(["recipe", "run", str(path), "--redo", "scst", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "xe: done" in out and _commands(out)[0].startswith("captioner train --config smoke --set "
                                                              "train.run_dir=runs/two/scst --set train.lr=0.002")
    # the weights a stage started from are part of its inputs: xe trained again -> scst refused
    RunDir("runs/two/xe").best.write_bytes(b"other weights")
    _two_stage_recipe(tmp_path)
    assert cli(["recipe", "run", str(path)]) == 1
    assert "the weights it starts from: runs/two/xe (best.pt, sha256 " in capsys.readouterr().out


def test_the_report_is_a_table_of_the_records(tmp_path, capsys):
    record = {"recipe": "smoke_x", "wall_s": 83.0, "provenance": {"date": "2026-12-06T04:00:00+00:00"},
              "split": "val", "beam_size": 2, "scores": {"BLEU-4": 12.345, "METEOR": None, "CIDEr-D": 40.0}}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "record.json").write_text(json.dumps(record))
    assert cli(["recipe", "report", str(tmp_path), "--out", str(tmp_path / "table.md")]) == 0
    out = capsys.readouterr().out
    row = f"| smoke_x | val | 2 | 12.35 | – | 40.00 | 1 min 23 s | 2026-12-06 | {tmp_path / 'a' / 'record.json'} |"
    assert row in out.splitlines() and row in (tmp_path / "table.md").read_text()


# --------------------------------------------------------------------------- end to end, on the shapes data


def _smoke_recipe(folder: Path) -> Path:
    """The shipped smoke recipe, its second stage given 4 epochs (a SIGTERM lands inside it) and folders of its own."""
    data = yaml.safe_load(shipped_recipes()["smoke"].read_text())
    for stage in data["stages"]:
        stage["set"]["train.run_dir"] = f"runs/recipes/smoke_resume/{stage['name']}"
    data["stages"][1]["set"]["train.epochs"] = 4
    data["evaluate"]["compare"] = "runs/recipes/smoke_resume/xe"
    del data["record"]  # the default: runs/recipes/smoke_resume/record.json
    return _write(folder / "smoke_resume.yaml", data)


def _sigterm_when(path: Path, timeout_s: float = 300.0) -> threading.Thread:
    """SIGTERM to this process once ``path`` exists (the second stage's first last.pt): `recipe run` passes it on."""
    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_smoke_recipe_end_to_end_resumes_and_records(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # any working folder: data, runs and the record land here
    path = _smoke_recipe(tmp_path)
    xe, scst = (RunDir(f"runs/recipes/smoke_resume/{name}") for name in ("xe", "scst"))

    assert cli(["recipe", "run", str(path), "--only", "xe"]) == 0  # the data drawn, the grids extracted
    assert json.loads(xe.stage.read_text())["finished"] and not scst.root.exists()
    assert (tmp_path / "data" / "smoke" / "dataset_shapes.json").is_file()
    xe_weights = xe.best.stat().st_mtime_ns

    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # should the signal come late, it must not end pytest
    try:
        watcher = _sigterm_when(tmp_path / scst.last)
        code = cli(["recipe", "run", str(path)])
        watcher.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = capsys.readouterr().out
    assert code == 1 and "stage 2/2 scst: stopped by SIGTERM" in out
    stage = json.loads(scst.stage.read_text())
    assert "finished" not in stage and scst.last.is_file() and stage["sessions"][0]["exit"] == 1
    assert "commit" in stage["sessions"][0]  # which code ran each session (None outside a git checkout)

    assert cli(["recipe", "run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "stage 1/2 xe: done" in out and "skipped" in out
    assert f"stage 2/2 scst: continues from {scst.last}" in out and "of at most 4 epochs done" in out
    assert xe.best.stat().st_mtime_ns == xe_weights  # the first stage was not trained again
    assert [json.loads(line)["epoch"] for line in scst.metrics.read_text().splitlines()] == [1, 2, 3, 4]
    assert scst.averaged.is_file()
    record = json.loads(Path("runs/recipes/smoke_resume/record.json").read_text())
    assert record["split"] == "val" and record["beam_size"] == 2 and record["parameters"] > 0
    assert record["scores"]["CIDEr-D"] is not None and "mirror_follow" in record
    assert [s["name"] for s in record["stages"]] == ["xe", "scst"] and record["stages"][1]["sessions"] == 2
    assert record["stages"][1]["commits"] == ([record["provenance"]["commit"]] if record["provenance"]["commit"]
                                              else [])  # both sessions and the evaluation ran this checkout
    assert record["stages"][1]["command"].endswith("--init runs/recipes/smoke_resume/xe")
    assert record["train_commands"] == [s["command"] for s in record["stages"]]
    assert record["evaluate_command"].startswith("captioner evaluate --checkpoint "
                                                 "runs/recipes/smoke_resume/scst/averaged.pt --split val --beam 2")
    assert [e["epoch"] for e in record["last_stage_epochs"]] == [1, 2, 3, 4]
    # the first stage's weights evaluated alike (evaluate.compare), and the paired intervals from both results files
    compared, paired = record["compared"], record["compared"]["paired"]
    assert compared["model"] == "runs/recipes/smoke_resume/xe" and "--checkpoint runs/recipes/smoke_resume/xe " in \
        compared["command"] and compared["n_images"] == record["n_images"]
    assert paired["CIDEr-D"]["B"] == pytest.approx(record["scores"]["CIDEr-D"], abs=1e-6)
    assert paired["CIDEr-D"]["A"] == pytest.approx(compared["result"]["scores"]["CIDEr-D"], abs=1e-6)
    assert paired["CIDEr-D"]["difference"] == pytest.approx(paired["CIDEr-D"]["B"] - paired["CIDEr-D"]["A"])
    assert paired["CIDEr-D"]["low"] <= paired["CIDEr-D"]["difference"] <= paired["CIDEr-D"]["high"]
    assert Path(compared["A"]).is_file() and Path(compared["B"]).is_file() and compared["A"] != compared["B"]
    provenance = record["provenance"]
    assert provenance["cpu"] and provenance["date"] and "commit" in provenance and record["wall_s"] > 0

    monkeypatch.setattr(recipe_runs, "run_child", lambda *a, **k: pytest.fail("a finished recipe runs nothing"))
    assert cli(["recipe", "run", str(path)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert cli(["recipe", "report"]) == 0
    assert "| smoke_resume | val | 2 |" in capsys.readouterr().out

    text = path.read_text()
    path.write_text(text.replace("train.lr: 0.001", "train.lr: 0.002"))
    assert cli(["recipe", "run", str(path)]) == 1
    out = capsys.readouterr().out
    assert "train.lr: 0.001 -> 0.002" in out and "--redo scst" in out
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert cli(["recipe", "run", str(path), "--redo", "scst", "--only", "scst"]) == 0
    assert "stage 2/2 scst: trains" in capsys.readouterr().out
    assert json.loads(scst.stage.read_text())["inputs"]["config"]["train"]["lr"] == 0.002
    assert list(scst.root.glob("previous-*"))  # the earlier run moved aside by training, not mixed in
    assert cli(["recipe", "run", str(path), "--dry-run"]) == 0  # new weights: the evaluation is due again
    assert _commands(capsys.readouterr().out) == [record["evaluation"]["command"], compared["command"]]


def test_the_recipes_ship_with_the_package():
    """pyproject.toml's package-data takes every recipe file, as it takes the configs."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["captioner"]
    recipes = [p.relative_to(root / "captioner").as_posix() for p in shipped_recipes().values()]
    assert {"flickr8k_soft", "flickr8k_hard", "flickr8k_grounded", "smoke"} <= set(shipped_recipes())
    assert all(any(fnmatch.fnmatch(r, pattern) for pattern in patterns) for r in recipes)
