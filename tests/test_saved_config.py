"""Configs an earlier version saved (checkpoints, model folders, a run's config.yaml) read in today's format
(store/saved_config.py): model.attention.kind is model.attention.attention, and the one model.decoder section
that held every decoder family's keys becomes the family's own. A person's files and --set use today's keys
only (tests/test_config.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from captioner.config import ConfigError, config_to_dict, load_config
from captioner.store.checkpoint import average_checkpoints, save_checkpoint
from captioner.store.saved_config import load_run_config, read_saved_config

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "captioner" / "pretrained"

# model.attention and model.decoder as every run saved them before the decoder families owned their sections
UNION_DECODER = {"embed_dim": 512, "hidden_dim": 512, "gate": "scalar", "dropout": 0.5, "feature_dropout": 0.0,
                 "layers": 2, "overlay_layer": -1}


# the train section's objective keys as every run saved them before objectives were sections: a name, and a
# section for hard attention's estimators and one for SCST, each at its defaults (the unread ones too)
OLD_HARD = {"estimator": "paper", "reinforce_weight": 1.0, "entropy_weight": 0.01, "baseline_decay": 0.9,
            "expectation_prob": 0.5, "samples": 4, "reward_discount": 1.0, "temperature": 1.0, "temperature_min": 0.5}
OLD_SCST = {"samples": 5, "baseline": "mean", "reward_end": True, "max_length": 0, "forbid_unk": True,
            "greedy_images": 500, "attention_mode": "sample", "entropy_weight": -1.0, "xe_weight": 0.0}


def _old_objective(saved: dict, objective: str = "xe", alpha_c: float = 1.0, alpha_entropy: float = 0.0,
                   hard: dict | None = None, scst: dict | None = None) -> dict:
    """``saved`` with its train section's objective as versions before objective sections saved it."""
    train = saved["train"]
    del train["objective"]
    train.update(objective=objective, alpha_c=alpha_c, alpha_entropy=alpha_entropy, hard={**OLD_HARD, **(hard or {})},
                 scst={**OLD_SCST, **(scst or {})})
    return saved


def _old(kind: str = "lstm", attention: str = "hard", **decoder) -> dict:
    saved = _old_objective(config_to_dict(load_config("smoke")))
    saved["model"]["attention"] = {"scorer": "additive", "kind": attention, "heads": 1, "attention_dim": 512}
    saved["model"]["decoder"] = {"kind": kind, **UNION_DECODER, **decoder}
    return saved


def test_an_old_lstm_config_reads_as_the_lstm_family_and_is_left_unchanged():
    old = _old()
    before = json.dumps(old, sort_keys=True)
    cfg = read_saved_config(old, "old.pt")
    assert cfg.model.attention.attention == "hard"
    assert config_to_dict(cfg)["model"]["decoder"] == {"kind": "lstm", "embed_dim": 512, "hidden_dim": 512,
                                                       "gate": "scalar", "dropout": 0.5, "feature_dropout": 0.0,
                                                       "scene": "none", "sentinel": False}  # added since: the paper's
    assert json.dumps(old, sort_keys=True) == before  # the payload itself is not changed


def test_an_old_transformer_config_drops_the_lstm_keys():
    cfg = read_saved_config(_old("transformer", attention="soft", layers=3, overlay_layer=0))
    section = config_to_dict(cfg)["model"]["decoder"]
    assert "gate" not in section and section["layers"] == 3 and section["overlay_layer"] == 0


def test_another_familys_key_at_a_value_it_never_had_there_is_refused_naming_the_file():
    with pytest.raises(ConfigError, match=r"old.pt: the stored config is invalid: unknown config key "
                                          r"'model.decoder.layers' \(valid keys at model.decoder for kind lstm"):
        read_saved_config(_old(layers=3), "old.pt")
    both = _old()
    both["model"]["attention"]["attention"] = "soft"
    with pytest.raises(ConfigError, match="old.pt: the stored config is invalid: unknown config key "
                                          "'model.attention.kind'"):
        read_saved_config(both, "old.pt")


@pytest.mark.parametrize("name", ["flickr8k_soft", "flickr8k_hard"])
def test_the_shipped_models_config_json_reads(name):
    """Both shipped LSTM models' config.json, written with today's sections, read as lstm models."""
    meta = json.loads((SHIPPED / name / "config.json").read_text())
    cfg = read_saved_config(meta["config"])
    assert cfg.model.decoder.kind == "lstm" and not hasattr(cfg.model.decoder, "layers")
    assert cfg.model.attention.attention == name.split("_")[1]


def test_the_config_the_first_shipped_soft_model_was_written_with_reads():
    """flickr8k_soft's config.json as shipped from 2026-12-02 to 2026-12-05 (its config section, kept as a test file
    when the model was re-exported in int8): the union decoder section (an lstm model with the transformer's keys),
    objective keys from before objectives were sections. The upgrade is what reads it, as the model it describes."""
    old = json.loads((REPO / "tests" / "flickr8k_soft_config_2026-12-02.json").read_text())
    assert "layers" in old["model"]["decoder"] and old["train"]["objective"] == "scst"  # the old shape
    cfg = read_saved_config(old)
    assert cfg.model.decoder.kind == "lstm" and not hasattr(cfg.model.decoder, "layers")
    assert cfg.model.attention.attention == "soft" and cfg.train.objective.kind == "scst"
    shipped = read_saved_config(json.loads((SHIPPED / "flickr8k_soft" / "config.json").read_text())["config"])
    assert config_to_dict(cfg)["model"] == config_to_dict(shipped)["model"]


def test_an_old_runs_config_yaml_resumes_with_overrides(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_old()))
    cfg = load_run_config(path, ["train.epochs=7"])
    assert cfg.train.epochs == 7 and cfg.model.attention.attention == "hard"
    with pytest.raises(ConfigError, match="unknown config key 'train.nope'"):
        load_run_config(path, ["train.nope=1"])


def test_snapshots_saved_by_two_versions_of_one_run_average(tmp_path):
    new = config_to_dict(read_saved_config(_old()))
    for name, config in (("old.pt", _old()), ("new.pt", new)):
        save_checkpoint(tmp_path / name, {"model": {"w": torch.ones(2)}, "config": config,
                                          "vocab": {"words": ["<pad>", "<start>", "<end>", "<unk>"]}})
    out = average_checkpoints([tmp_path / "old.pt", tmp_path / "new.pt"])
    torch.testing.assert_close(out["model"]["w"], torch.ones(2))


# --------------------------------------------------------------------------- a soft model's read, kept


def _before_issue_35(attention: str, mode: str) -> dict:
    """A config as versions before soft models could read one cell saved it: no train.scst.attention_mode (nor
    the entropy_weight and xe_weight that came with it)."""
    saved = _old_objective(config_to_dict(load_config("smoke", [f"eval.attention_mode={mode}"])))
    saved["model"]["attention"]["attention"] = attention
    for key in ("attention_mode", "entropy_weight", "xe_weight"):
        del saved["train"]["scst"][key]
    return saved


@pytest.mark.parametrize("mode", ["argmax", "sample"])
@pytest.mark.parametrize("attention", ["soft", "key_value", "multi_head"])
def test_an_old_soft_model_that_decoded_softly_still_does(attention, mode):
    """A soft ablation of a hard config (eval.attention_mode argmax) decoded softly when it was saved; today's
    code reads one cell per word for a soft model asked to. Its config is read with the read it made."""
    assert read_saved_config(_before_issue_35(attention, mode)).eval.attention_mode == "expectation"


@pytest.mark.parametrize("attention, mode", [("hard", "argmax"), ("hard", "sample"), ("soft", "expectation")])
def test_other_old_configs_keep_their_read(attention, mode):
    assert read_saved_config(_before_issue_35(attention, mode)).eval.attention_mode == mode


def test_a_soft_model_saved_since_one_cell_soft_reads_keeps_its_argmax():
    """Saved by a version whose soft models read one cell when asked: that is how it decoded, and decodes."""
    saved = config_to_dict(load_config("smoke", ["eval.attention_mode=argmax"]))
    assert read_saved_config(saved).eval.attention_mode == "argmax"
    no_scst = _before_issue_35("soft", "argmax")
    del no_scst["train"]["scst"]  # a version older still, before SCST: old all the same
    assert read_saved_config(no_scst).eval.attention_mode == "expectation"


def test_an_old_soft_checkpoint_captions_as_it_did(tmp_path):
    """Through load_captioner: the checkpoint's model decodes softly by default, as its version did; one cell
    per word only when asked."""
    from captioner.api import build_model, load_captioner
    from captioner.data.vocab import Vocab

    torch.manual_seed(0)
    saved = _before_issue_35("soft", "argmax")
    model = build_model(read_saved_config(saved), Vocab.build([["a", "red", "circle"]]))
    save_checkpoint(tmp_path / "old.pt", {"model": model.state_dict(), "config": saved,
                                          "vocab": model.vocab.to_dict(), "epoch": 1})
    loaded = load_captioner(tmp_path / "old.pt", device="cpu")
    assert loaded.decode_options.attention_mode == "expectation"
    grid = loaded.prepare_grid(torch.randn(1, 4, loaded.encoder.backbone_dim))
    greedy = loaded.decode_options.replace_given(beam=1)
    assert loaded.generate(grid, greedy)[0][0].locations is None
    assert loaded.generate(grid, greedy.replace_given(attention_mode="argmax"))[0][0].locations is not None


# --------------------------------------------------------------------------- the objective, a section


@pytest.mark.parametrize("attention, old, section", [
    ("soft", {"alpha_c": 0.05, "alpha_entropy": 0.1}, {"kind": "xe", "alpha_c": 0.05, "alpha_entropy": 0.1}),
    ("hard", {"alpha_c": 0.0, "hard": {"reinforce_weight": 0.03, "entropy_weight": 0.001}},
     {"kind": "reinforce", "alpha_c": 0.0, "alpha_entropy": 0.0, "expectation_prob": 0.5, "reinforce_weight": 0.03,
      "entropy_weight": 0.001, "baseline_decay": 0.9}),
    ("hard", {"alpha_c": 0.2, "hard": {"estimator": "loo", "samples": 2}},
     {"kind": "loo", "alpha_c": 0.2, "alpha_entropy": 0.0, "expectation_prob": 0.5, "reinforce_weight": 1.0,
      "entropy_weight": 0.01, "samples": 2, "reward_discount": 1.0}),
    ("hard", {"hard": {"estimator": "gumbel", "temperature_min": 0.3, "expectation_prob": 0.25}},
     {"kind": "gumbel", "alpha_c": 1.0, "alpha_entropy": 0.0, "expectation_prob": 0.25, "temperature": 1.0,
      "temperature_min": 0.3}),
    ("hard", {"objective": "scst", "scst": {"entropy_weight": 0.01, "xe_weight": 0.1}},
     {"kind": "scst", **OLD_SCST, "entropy_weight": 0.01, "xe_weight": 0.1}),
    ("soft", {"objective": "scst", "scst": {"samples": 3}}, {"kind": "scst", **OLD_SCST, "samples": 3}),
])
def test_an_old_objective_reads_as_the_section_of_the_objective_it_trained_with(attention, old, section):
    """What a run trained with: SCST, else hard attention's estimator (the old "paper" is today's reinforce),
    else cross-entropy; the section keeps the old keys that objective reads and drops the unread ones."""
    saved = _old_objective(config_to_dict(load_config("smoke")), **old)
    saved["model"]["attention"]["attention"] = attention
    before = json.dumps(saved, sort_keys=True)
    # grounding_weight (issue 52), label smoothing and scheduled sampling (issue 55) and the grounding term's form
    # (issue 62) are newer than every old layout: their defaults (the schedule only where the cross-entropy
    # sections have it, the sampling temperature only in SCST's)
    newer = {"grounding_weight": 0.0, "grounding_loss": "cross_entropy", "grounding_power": 1.0,
             "label_smoothing": 0.0}
    if section["kind"] != "scst":
        newer.update(scheduled_sampling_start=-1, scheduled_sampling_increase_every=5,
                     scheduled_sampling_increase_prob=0.05, scheduled_sampling_max_prob=0.25)
    else:
        newer["sample_temperature"] = 1.0
    assert config_to_dict(read_saved_config(saved, "old.pt"))["train"]["objective"] == {**section, **newer}
    assert json.dumps(saved, sort_keys=True) == before  # the caller's dict is left as it was


def test_an_old_runs_config_yaml_with_its_objective_resumes(tmp_path):
    saved = _old_objective(config_to_dict(load_config("smoke")), hard={"estimator": "loo"})
    saved["model"]["attention"]["attention"] = "hard"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    cfg = load_run_config(tmp_path / "config.yaml", ["train.objective.samples=3"])
    assert (cfg.train.objective.kind, cfg.train.objective.samples) == ("loo", 3)


def test_a_config_saved_before_tf32_resumes_and_decodes_with_it_off(tmp_path):
    """A run saved before issue 43 has no tf32 key: resuming it on CUDA turned TF32 on mid-run (the default is on).
    It is read with tf32 off in train and eval, the precision it ran with; a saved value is kept."""
    import yaml

    from captioner.config import config_to_dict, load_config
    from captioner.store.saved_config import load_run_config, read_saved_config

    saved = config_to_dict(load_config(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"))
    del saved["train"]["tf32"], saved["eval"]["tf32"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    cfg = load_run_config(path)
    assert (cfg.train.tf32, cfg.eval.tf32) == (False, False)
    assert read_saved_config(saved).train.tf32 is False
    saved["train"]["tf32"] = True
    assert read_saved_config(saved).train.tf32 is True
