"""Configs that name a base (config_files.py): deep merge over a chain, a kinded section whose kind changes taken
whole, cycles and missing bases refused naming the chain, where each value came from, and every shipped config
resolving to exactly the values saved before the configs were rewritten as diffs (2026-12-05)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from captioner.commands.config import main as config_main
from captioner.config import ConfigError, config_to_dict, load_config, shipped_configs
from captioner.config_files import read_config_file
from captioner.objective_sections import OBJECTIVES
from captioner.training.recipes import load_recipes, plan

SAVED = Path(__file__).resolve().parent / "configs_resolved_2026-12-05.json"


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        out.update(_flat(value, path) if isinstance(value, dict) else {path: value})
    return out


# configs that existed only to chain, folded into a study's stages since (issue 72): (study, variant, stage)
FOLDED = {"flickr8k_updown_scst_steady": ("training_options", "updown_steady", "scst_steady"),
          "flickr8k_updown_scst_steady_more": ("training_options", "updown_steady", "scst_steady_more"),
          "flickr8k_updown_scst_tempered": ("training_options", "updown_tempered", "scst_tempered"),
          "flickr8k_updown_scst_tempered_more": ("training_options", "updown_tempered", "scst_tempered_more")}


def _resolved(name: str) -> dict:
    """A shipped config's values, or those of the recipe stage it was folded into (with the --init the stage
    passes, as its config's own train.init said)."""
    if name not in FOLDED:
        return config_to_dict(load_config(name))
    study, variant, stage = FOLDED[name]
    (recipe,) = load_recipes(study, [variant])
    return config_to_dict(next(p.cfg for p in plan(recipe) if p.name == stage))


def test_every_shipped_config_resolves_to_the_values_saved_before_the_rewrite():
    """Every saved value is unchanged (a config folded into a recipe's stage: that stage's); a key added since may
    appear, with its default only."""
    saved = json.loads(SAVED.read_text())
    assert set(saved) <= set(shipped_configs()) | set(FOLDED)  # none was lost
    assert not set(FOLDED) & set(shipped_configs())
    defaults = _flat(config_to_dict(load_config(None)))
    for name, values in saved.items():
        now, then = _flat(_resolved(name)), _flat(values)
        assert {k: now.get(k) for k in then} == then, name
        # the default of a key of the config's own objective section (the default config's is cross-entropy)
        section = OBJECTIVES.section(now["train.objective.kind"])()
        own = {**defaults, **{f"train.objective.{f.name}": getattr(section, f.name)
                              for f in dataclasses.fields(section)}}
        assert {k: v for k, v in now.items() if k not in then} == {k: own[k] for k in now if k not in then}, name


def test_a_chain_merges_mapping_by_mapping_and_the_nearest_file_wins(tmp_path):
    _write(tmp_path, "a", "train:\n  lr: 0.001\n  epochs: 3\n  objective:\n    alpha_c: 0.5\n")
    _write(tmp_path, "b", "base: a\ntrain:\n  epochs: 5\nmodel:\n  decoder:\n    dropout: 0.25\n")
    c = _write(tmp_path, "c", "base: b.yaml\ntrain:\n  objective:\n    alpha_entropy: 0.1\n")
    cfg = load_config(c)
    assert (cfg.train.lr, cfg.train.epochs) == (0.001, 5)
    assert (cfg.train.objective.alpha_c, cfg.train.objective.alpha_entropy) == (0.5, 0.1)
    assert cfg.model.decoder.dropout == 0.25
    file = read_config_file(c, {"train.objective": "xe", "model.decoder": "lstm"})
    assert [p.name for p in file.chain] == ["c.yaml", "b.yaml", "a.yaml"]
    assert file.origins["train.lr"].endswith("a.yaml") and file.origins["train.epochs"].endswith("b.yaml")
    assert file.origins["train.objective.alpha_entropy"].endswith("c.yaml")
    assert "base" not in file.data
    # --set still comes last
    assert load_config(c, ["train.epochs=7"]).train.epochs == 7


def test_a_section_whose_kind_changes_is_the_childs_alone(tmp_path):
    _write(tmp_path, "xe", "train:\n  objective:\n    alpha_c: 0.5\n    grounding_weight: 0.0\n")
    scst = _write(tmp_path, "scst", "base: xe\ntrain:\n  objective:\n    kind: scst\n    samples: 3\n")
    cfg = load_config(scst)  # alpha_c, an xe key, is not carried into the scst section (it would be unknown there)
    assert cfg.train.objective.kind == "scst" and cfg.train.objective.samples == 3
    same = _write(tmp_path, "same", "base: xe\ntrain:\n  objective:\n    kind: xe\n    alpha_entropy: 0.2\n")
    kept = load_config(same).train.objective  # the same kind, named: merged as any mapping
    assert (kept.alpha_c, kept.alpha_entropy) == (0.5, 0.2)


def test_a_base_is_looked_for_beside_its_file_then_by_shipped_name(tmp_path):
    child = _write(tmp_path, "child", "base: flickr8k_soft\ntrain:\n  epochs: 2\n")
    cfg = load_config(child)
    assert cfg.train.epochs == 2 and cfg.train.lr == load_config("flickr8k_soft").train.lr
    _write(tmp_path, "flickr8k_soft", "train:\n  lr: 0.125\n")  # a file beside it takes precedence
    assert load_config(child).train.lr == 0.125


def test_a_shipped_name_as_base_means_the_shipped_config_wherever_the_command_runs(tmp_path, monkeypatch):
    """A base not beside its file was looked up in the working directory before the shipped names: the same file
    meant another config when run from a folder holding a flickr8k_soft.yaml. Shipped names come first now."""
    folder = tmp_path / "mine"
    folder.mkdir()
    _write(tmp_path, "flickr8k_soft", "train:\n  lr: 0.125\n")  # in the working directory, not beside the file
    monkeypatch.chdir(tmp_path)
    for base in ("flickr8k_soft", "flickr8k_soft.yaml"):
        child = _write(folder, "child", f"base: {base}\ntrain:\n  epochs: 2\n")
        assert load_config(child).train.lr == load_config("flickr8k_soft").train.lr != 0.125
        assert load_config(child).train.epochs == 2
    _write(folder, "own_base", "train:\n  lr: 0.25\n")  # a base that is no shipped name: beside the file, then here
    assert load_config(_write(folder, "c2", "base: own_base\n")).train.lr == 0.25
    _write(tmp_path, "cwd_base", "train:\n  lr: 0.375\n")
    assert load_config(_write(folder, "c3", "base: cwd_base.yaml\n")).train.lr == 0.375
    assert load_config(tmp_path / "flickr8k_soft.yaml").train.lr == 0.125  # a --config path is the path given


@pytest.mark.parametrize("section, keys", [
    ("model:\n  decoder:\n    feature_dropout: 0.5\n    hidden_dim: 1024\n", ["model.decoder.kind=transformer"]),
    ("model:\n  decoder:\n    kind: transformer\n    hidden_dim: 1024\n    layers: 3\n", ["model.decoder.kind=lstm"]),
    ("model:\n  decoder:\n    feature_dropout: 0.5\n", ["model.decoder.kind=updown", "model.decoder.dropout=0.25"]),
])
def test_a_kind_change_by_set_means_what_the_same_change_in_a_file_means(tmp_path, section, keys):
    """`--set model.decoder.kind=transformer` over an LSTM section kept its keys of the same name (its
    feature_dropout 0.5; its hidden_dim, the LSTM's size, became the feed-forward width), where a file's kind
    change takes the section as the file's alone: both routes give one resolved config now."""
    base = _write(tmp_path, "base", section)
    sets = dict(key.split("=", 1) for key in keys)
    lines = "".join(f"    {k.rsplit('.', 1)[1]}: {v}\n" for k, v in sets.items())
    child = _write(tmp_path, "child", f"base: base\nmodel:\n  decoder:\n{lines}")
    by_file, by_set = load_config(child), load_config(base, keys)
    assert config_to_dict(by_set) == config_to_dict(by_file)
    kind = sets["model.decoder.kind"]
    fresh = load_config(None, keys).model.decoder
    assert by_set.model.decoder == fresh and fresh.kind == kind
    # the shipped soft model's LSTM section, its kind changed both ways
    soft = _write(tmp_path, "soft_transformer", "base: flickr8k_soft\nmodel:\n  decoder:\n    kind: transformer\n")
    assert config_to_dict(load_config("flickr8k_soft", ["model.decoder.kind=transformer"])) == \
        config_to_dict(load_config(soft))
    assert load_config("flickr8k_soft", ["model.decoder.kind=transformer"]).model.decoder.feature_dropout == 0.0
    # the same kind, set: the section's keys stay (no kind change)
    assert load_config("flickr8k_soft", ["model.decoder.kind=lstm"]).model.decoder.feature_dropout == 0.5


def test_config_show_says_a_kind_change_by_set_left_the_files_keys_behind(capsys):
    assert config_main(["show", "flickr8k_soft", "--origin", "--set", "model.decoder.kind=transformer"]) == 0
    lines = capsys.readouterr().out.splitlines()
    dropout = next(line for line in lines if line.startswith("model.decoder.feature_dropout:"))
    assert dropout == "model.decoder.feature_dropout: 0.0  # default"
    assert next(line for line in lines if line.startswith("model.decoder.kind:")).endswith("# --set")


def test_a_cycle_and_a_missing_base_are_refused_naming_the_chain(tmp_path):
    _write(tmp_path, "p", "base: q\n")
    _write(tmp_path, "q", "base: r\n")
    _write(tmp_path, "r", "base: p\n")
    with pytest.raises(ConfigError, match=r"cycle: .*p\.yaml -> .*q\.yaml -> .*r\.yaml -> .*p\.yaml"):
        load_config(tmp_path / "p.yaml")
    _write(tmp_path, "s", "base: nowhere_to_be_found\n")
    t = _write(tmp_path, "t", "base: s\n")
    with pytest.raises(ConfigError, match=r"t\.yaml -> .*s\.yaml\).*nowhere_to_be_found|nowhere_to_be_found.*chain: "
                                          r".*t\.yaml -> .*s\.yaml"):
        load_config(t)
    bad = _write(tmp_path, "bad", "base: [a, b]\n")
    with pytest.raises(ConfigError, match="bad.yaml: base: expected a config's name or path"):
        load_config(bad)


def test_config_show_prints_where_each_value_came_from(tmp_path, capsys):
    child = _write(tmp_path, "child", "base: flickr8k_soft\ntrain:\n  epochs: 2\n")
    assert config_main(["show", str(child), "--origin", "--set", "train.lr=0.002"]) == 0
    lines = capsys.readouterr().out.splitlines()
    epochs = next(line for line in lines if line.startswith("train.epochs:"))
    lr = next(line for line in lines if line.startswith("train.lr:"))
    batch = next(line for line in lines if line.startswith("train.batch_size:"))
    seed = next(line for line in lines if line.startswith("train.seed:"))
    assert epochs.split("#")[1].strip() == str(child) and "2" in epochs.split("#")[0]
    assert lr.split("#")[1].strip() == "--set"
    assert batch.split("#")[1].strip().endswith("flickr8k_soft.yaml")
    assert seed.split("#")[1].strip() == "default"


def test_no_two_shipped_configs_write_the_same_run_folder():
    """A stage written as a diff against the one it continues still names its own run folder (inheriting the
    base's would train over the base's checkpoints)."""
    folders = {name: load_config(name).train.run_dir for name in shipped_configs()}
    shared = {f for f in folders.values() if list(folders.values()).count(f) > 1}
    assert not shared, {name: f for name, f in folders.items() if f in shared}


def test_the_shipped_configs_stay_short():
    """Issue 63's target: the shipped configs, as diffs against their bases, hold at most 550 lines that are
    neither comments nor blank (1,322 before the rewrite, with 41 files)."""
    lines = [line for path in shipped_configs().values() for line in path.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 550, len(lines)
