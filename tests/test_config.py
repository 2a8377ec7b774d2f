"""Config strictness, overrides and the YAML round trip."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from captioner.config import (
    Config,
    ConfigError,
    config_from_dict,
    config_to_dict,
    get_path,
    load_config,
    parse_override,
    save_config,
)

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_defaults_validate():
    cfg = config_from_dict({})
    assert cfg == Config()
    assert cfg.model.attention.scorer == "additive"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_and_says_how_to_run(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    first = path.read_text().splitlines()[0]
    assert first.startswith("#")
    assert "captioner train --config configs/" + path.name in path.read_text()


def test_expected_configs_ship():
    names = {p.name for p in CONFIGS}
    assert {"shapes.yaml", "smoke.yaml", "flickr8k_soft.yaml", "flickr8k_hard.yaml",
            "coco_soft.yaml", "coco_hard.yaml"} <= names


def test_overrides_apply_with_types():
    cfg = load_config(None, ["model.attention.scorer=dot", "train.lr=0.002", "train.epochs=3",
                             "data.restval=false"])
    assert cfg.model.attention.scorer == "dot"
    assert cfg.train.lr == 0.002 and isinstance(cfg.train.lr, float)
    assert cfg.train.epochs == 3
    assert cfg.data.restval is False


def test_int_accepted_for_float():
    assert load_config(None, ["train.lr=1"]).train.lr == 1.0


def test_unknown_key_names_path_and_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.attention.scorr=dot"])
    msg = str(err.value)
    assert "model.attention.scorr" in msg and "scorer" in msg and "heads" in msg


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "train.learning_rate" in str(err.value) and str(path) in str(err.value)
    assert "lr" in str(err.value)


@pytest.mark.parametrize("override, key", [
    ("train.lr=-0.1", "train.lr"),
    ("eval.beam_size=0", "eval.beam_size"),
    ("train.epochs=two", "train.epochs"),
    ("train.epochs=2.5", "train.epochs"),
    ("model.decoder.dropout=1.5", "model.decoder.dropout"),
    ("model.attention.scorer=cosine", "model.attention.scorer"),
    ("data.restval=maybe", "data.restval"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert key in str(err.value)


def test_section_cannot_be_set_to_scalar():
    with pytest.raises(ConfigError, match="model.attention"):
        load_config(None, ["model.attention=soft"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError):
        parse_override("no_equals_sign")
    with pytest.raises(ConfigError):
        parse_override("a..b=1")


def test_multi_head_dim_divisible():
    with pytest.raises(ConfigError, match="heads"):
        load_config(None, ["model.attention.attention=multi_head", "model.attention.heads=3"])


def test_round_trip_yaml(tmp_path):
    cfg = load_config(None, ["model.attention.attention=hard", "train.lr=0.0003", "eval.beam_size=5",
                             "data.captions=some/file.json"])
    save_config(cfg, tmp_path / "cfg.yaml")
    again = load_config(tmp_path / "cfg.yaml")
    assert again == cfg
    assert config_to_dict(again) == config_to_dict(cfg)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("does/not/exist.yaml")


def test_shipped_configs_load_by_name_and_travel_with_the_package():
    from captioner.config import CONFIG_DIR, shipped_configs

    assert CONFIG_DIR.parent.name == "captioner"  # inside the package: a wheel carries them
    assert {"shapes", "flickr8k_soft", "flickr8k_soft_scst"} <= set(shipped_configs())
    by_name = load_config("flickr8k_soft", ["train.lr=1e-3"])
    by_path = load_config(CONFIG_DIR / "flickr8k_soft.yaml", ["train.lr=1e-3"])
    assert by_name == by_path and by_name.train.lr == 1e-3
    assert load_config("flickr8k_soft.yaml", ["train.lr=1e-3"]) == by_path
    with pytest.raises(ConfigError, match="shipped configs, usable by name"):
        load_config("no_such_config")


def test_config_show_prints_every_key_resolved(capsys):
    import yaml

    from captioner.cli import main as cli_main
    from captioner.config import config_to_dict

    assert cli_main(["config", "show", "shapes", "--set", "train.epochs=3"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown == config_to_dict(load_config("shapes", ["train.epochs=3"]))
    assert shown["train"]["scst"]["samples"] == 5  # a default the file never mentions
    assert cli_main(["config", "list"]) == 0
    assert "flickr8k_soft" in capsys.readouterr().out
    assert cli_main(["config", "show", "nope"]) == 1


def test_attention_field_is_named_after_the_decoder_argument_and_the_old_key_is_unknown_in_a_file(tmp_path):
    """A file or --set uses today's keys: model.attention.kind is refused naming the valid keys (a config an
    earlier version saved still reads: tests/test_saved_config.py)."""
    import inspect

    from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder

    assert "attention" in inspect.signature(ShowAttendTellDecoder).parameters
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  attention:\n    kind: hard\n")
    with pytest.raises(ConfigError, match=r"old.yaml: unknown config key 'model.attention.kind' \(valid keys at "
                                          r"model.attention: scorer, attention, heads, attention_dim\)"):
        load_config(old)
    with pytest.raises(ConfigError, match="unknown config key 'model.attention.kind'"):
        load_config(None, ["model.attention.kind=hard"])
    saved = tmp_path / "saved.yaml"
    save_config(load_config(None, ["model.attention.attention=hard"]), saved)
    assert yaml.safe_load(saved.read_text())["model"]["attention"]["attention"] == "hard"


def test_choices_are_the_model_code_tables():
    """The config checks names against captioner/names.py (torch-free); every registry beside the code holds
    exactly its table's names, in the same order (the order error messages list them in), so they cannot drift."""
    import inspect

    from captioner import names
    from captioner.config import CHOICES
    from captioner.data.datasets import LOADERS, SPLITS
    from captioner.models.attention import ATTENTIONS
    from captioner.models.decoders import DECODER_CONFIGS
    from captioner.models.decoders.registry import DECODERS, REFERENCES
    from captioner.models.scorers import SCORERS
    from captioner.training.estimators import ESTIMATORS
    from captioner.training.optim import OPTIMIZERS
    from captioner.training.wblog import MODES as WANDB_MODES

    assert tuple(SCORERS) == names.SCORER_NAMES == CHOICES["model.attention.scorer"]
    assert tuple(ATTENTIONS) == names.ATTENTION_NAMES == CHOICES["model.attention.attention"]
    # the decoder families: the torch-free configs the config reads and the classes, one registry each
    assert tuple(DECODERS) == tuple(REFERENCES) == tuple(DECODER_CONFIGS)
    assert {"lstm", "transformer"} <= set(DECODERS)
    for kind, family in DECODER_CONFIGS.items():
        assert family().kind == kind
        # the keys a family reads are its constructor's arguments, fast and reference alike (besides the sizes
        # the vocabulary and the encoder fix)
        reads = {f.name for f in dataclasses.fields(family)} - {"kind"} | set(family.ATTENTION_KEYS)
        for cls in (DECODERS[kind], REFERENCES[kind]):
            assert cls.config_class is family
            assert set(inspect.signature(cls).parameters) == reads | {"vocab_size", "feature_dim", "pad_id"}
    assert tuple(LOADERS) == names.DATA_FORMATS == CHOICES["data.format"]
    assert SPLITS == names.SPLITS == CHOICES["eval.split"]
    assert OPTIMIZERS == CHOICES["train.optimizer"] and WANDB_MODES == CHOICES["train.wandb"]
    assert tuple(ESTIMATORS) == names.HARD_ESTIMATORS == CHOICES["train.hard.estimator"] == ("paper", "loo", "gumbel")
    assert names.DECODING_MODES == CHOICES["eval.attention_mode"]


# Every key an objective does not read, by (attention, objective, estimator): set to a non-default value,
# each is refused with its name; the keys that are read load.
_RUNS = {
    "soft xe": ["model.attention.attention=soft"],
    "hard xe paper": ["model.attention.attention=hard", "train.hard.estimator=paper"],
    "hard xe loo": ["model.attention.attention=hard", "train.hard.estimator=loo"],
    "hard xe gumbel": ["model.attention.attention=hard", "train.hard.estimator=gumbel"],
    "soft scst": ["model.attention.attention=soft", "train.objective=scst"],
    # hard-attention SCST that samples its cells needs its own entropy bonus set (config.check_scst_entropy)
    "hard scst": ["model.attention.attention=hard", "train.objective=scst", "train.scst.entropy_weight=0.01"],
}
_NON_DEFAULT = {
    "train.alpha_c": "0.5", "train.alpha_entropy": "0.5", "train.hard.estimator": "loo",
    "train.hard.reinforce_weight": "0.5", "train.hard.entropy_weight": "0.5", "train.hard.baseline_decay": "0.5",
    "train.hard.expectation_prob": "0.25", "train.hard.samples": "3", "train.hard.reward_discount": "0.5",
    "train.hard.temperature": "2.0", "train.hard.temperature_min": "0.25",
    "train.scst.samples": "3", "train.scst.baseline": "greedy", "train.scst.reward_end": "false",
    "train.scst.max_length": "9", "train.scst.forbid_unk": "false", "train.scst.greedy_images": "7",
    "train.scst.xe_weight": "0.5", "train.scst.entropy_weight": "0.5",
}
_READ = {
    "soft xe": {"train.alpha_c", "train.alpha_entropy"},
    "hard xe paper": {"train.alpha_c", "train.alpha_entropy", "train.hard.estimator", "train.hard.reinforce_weight",
                      "train.hard.entropy_weight", "train.hard.baseline_decay", "train.hard.expectation_prob"},
    "hard xe loo": {"train.alpha_c", "train.alpha_entropy", "train.hard.estimator", "train.hard.reinforce_weight",
                    "train.hard.entropy_weight", "train.hard.expectation_prob", "train.hard.samples",
                    "train.hard.reward_discount"},
    "hard xe gumbel": {"train.alpha_c", "train.alpha_entropy", "train.hard.estimator", "train.hard.expectation_prob",
                       "train.hard.temperature", "train.hard.temperature_min"},
    # soft attention has no location policy: no train.scst.entropy_weight; SCST reads none of train.hard
    "soft scst": {k for k in _NON_DEFAULT if k.startswith("train.scst.")} - {"train.scst.entropy_weight"},
    "hard scst": {k for k in _NON_DEFAULT if k.startswith("train.scst.")},
}


@pytest.mark.parametrize("run", list(_RUNS))
def test_a_key_the_objective_does_not_read_is_refused(run):
    for key, value in _NON_DEFAULT.items():
        overrides = [*_RUNS[run], f"{key}={value}"]
        if key == "train.hard.estimator":  # the estimator itself: read by hard cross-entropy only
            overrides = [o for o in overrides if not o.startswith("train.hard.estimator")] + [f"{key}={value}"]
        if key in _READ[run]:
            assert get_path(load_config(None, overrides), key) is not None
        else:
            with pytest.raises(ConfigError, match=f"{key}: set to .*would ignore it"):
                load_config(None, overrides)
    # The defaults are never refused; a checkpoint's saved config is read for decoding, not refused.
    saved = config_to_dict(load_config(None, _RUNS[run]))
    saved["train"]["hard"]["samples"] = 9  # read by no run here but hard xe loo
    assert config_from_dict(saved).train.hard.samples == 9


@pytest.mark.parametrize("kind,read,refused", [
    ("lstm", {"model.decoder.gate": "vector", "model.attention.scorer": "dot", "model.attention.attention_dim": "64"},
     {"model.decoder.layers": "3", "model.decoder.overlay_layer": "0"}),
    ("transformer", {"model.decoder.layers": "3", "model.decoder.overlay_layer": "0", "model.attention.heads": "4"},
     {"model.decoder.gate": "vector", "model.attention.scorer": "dot", "model.attention.attention": "hard",
      "model.attention.attention_dim": "64"}),
])
def test_each_decoder_kind_reads_the_keys_its_constructor_takes(kind, read, refused):
    """model.decoder is the family's own section: another family's key is unknown there, named with the keys
    this kind has; a model.attention key the family does not read is refused when set."""
    for key, value in read.items():
        assert str(get_path(load_config(None, [f"model.decoder.kind={kind}", f"{key}={value}"]), key)) == value
        # the kind may be set after its keys: it is applied first
        assert str(get_path(load_config(None, [f"{key}={value}", f"model.decoder.kind={kind}"]), key)) == value
    for key, value in refused.items():
        why = (f"{key}: set to .*the {kind} decoder does not read it" if key.startswith("model.attention.") else
               f"unknown config key '{key}' \\(valid keys at model.decoder for kind {kind}: kind, embed_dim")
        with pytest.raises(ConfigError, match=why):
            load_config(None, [f"model.decoder.kind={kind}", f"{key}={value}"])
    with pytest.raises(ConfigError, match="model.decoder.kind: 'gru' is not one of lstm, transformer"):
        load_config(None, ["model.decoder.kind=gru"])


def test_transformer_sizes_are_checked():
    with pytest.raises(ConfigError, match="overlay_layer: 2 is not a layer of model.decoder.layers"):
        load_config(None, ["model.decoder.kind=transformer", "model.decoder.overlay_layer=2"])
    with pytest.raises(ConfigError, match=r"embed_dim \(100\) must be divisible by model.attention.heads \(8\)"):
        load_config(None, ["model.decoder.kind=transformer", "model.decoder.embed_dim=100", "model.attention.heads=8"])
    cfg = load_config(None, ["model.decoder.kind=transformer", "model.decoder.overlay_layer=-2"])
    assert cfg.model.decoder.layers == 2


def test_a_fine_tuned_timm_backbone_needs_images_not_the_cache():
    """A timm backbone cannot be split below its trainable blocks, so the feature cache cannot start it: the
    config refuses the combination at load, naming the three settings, instead of extraction failing later."""
    tuned = ["model.encoder.name=timm:resnet18", "model.encoder.finetune_blocks=1"]
    with pytest.raises(ConfigError, match=r"model.encoder.finetune_blocks=1 with model.encoder.name='timm:resnet18' "
                                          r"needs data.use_cache=false"):
        load_config("smoke", tuned)
    assert load_config("smoke", [*tuned, "data.use_cache=false"]).model.encoder.finetune_blocks == 1
    assert load_config("smoke", ["model.encoder.name=timm:resnet18"]).data.use_cache  # frozen: cached as ever
