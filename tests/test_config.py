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
    cfg = load_config(None, ["model.attention.attention=hard", "train.objective.kind=loo", "train.lr=0.0003",
                             "train.objective.samples=3", "eval.beam_size=5",
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
    assert shown["train"]["objective"]["alpha_entropy"] == 0.0  # a default the file never mentions
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
    save_config(load_config(None, ["model.attention.attention=hard", "train.objective.kind=reinforce"]), saved)
    assert yaml.safe_load(saved.read_text())["model"]["attention"]["attention"] == "hard"


def test_choices_are_the_model_code_tables():
    """The config checks names against captioner/names.py (torch-free), whose registries are the only tables of
    scorers, attention reads and data formats: every entry resolves to the code it names; the plain tuples the
    code imports are the config's choices."""
    import inspect

    from torch import nn

    from captioner import names
    from captioner.config import CHOICES
    from captioner.data.datasets import SPLITS
    from captioner.models.decoders import DECODERS
    from captioner.models.decoders.contract import CaptionDecoder
    from captioner.objective_sections import OBJECTIVES
    from captioner.registration import implementation
    from captioner.training.objectives.base import Objective
    from captioner.training.optim import OPTIMIZERS
    from captioner.training.wblog import MODES as WANDB_MODES

    assert tuple(names.SCORERS) == CHOICES["model.attention.scorer"]
    assert tuple(names.ATTENTIONS) == CHOICES["model.attention.attention"]
    assert tuple(names.DATA_FORMATS) == CHOICES["data.format"]
    for registry in (names.SCORERS, names.ATTENTIONS):
        assert all(issubclass(registry.get(name), nn.Module) for name in registry), registry.where
    assert all(callable(names.DATA_FORMATS.get(name)) for name in names.DATA_FORMATS)
    with pytest.raises(ValueError, match="model.attention.scorer: 'cosine' is not one of additive, dot"):
        names.SCORERS.get("cosine")
    # the decoder families: one registration each, the torch-free section the config reads, naming its class
    assert {"lstm", "transformer"} <= set(DECODERS)
    for kind, family in DECODERS.items():
        assert family().kind == kind
        # the keys a family reads are its constructor's arguments, fast and reference alike (a fast path subclasses
        # its family's plain decoder; besides the sizes the vocabulary and the encoder fix)
        reads = {f.name for f in dataclasses.fields(family)} - {"kind"} | set(family.ATTENTION_KEYS)
        built = implementation(family, CaptionDecoder)
        for cls in [c for c in built.__mro__ if issubclass(c, CaptionDecoder) and "__init__" in vars(c)]:
            assert set(inspect.signature(cls).parameters) == reads | {"vocab_size", "feature_dim", "pad_id"}
    assert SPLITS == names.SPLITS == CHOICES["eval.split"]
    assert OPTIMIZERS == CHOICES["train.optimizer"] and WANDB_MODES == CHOICES["train.wandb"]
    # the training objectives: one registration each, the torch-free section naming its class
    assert {"xe", "reinforce", "loo", "gumbel", "scst"} <= set(OBJECTIVES)
    assert all(section().kind == kind and issubclass(implementation(section), Objective)
               for kind, section in OBJECTIVES.items())
    assert names.DECODING_MODES == CHOICES["eval.attention_mode"]


# Each objective's section, as a run of that kind with its attention sets it: (overrides, its keys at non-default
# values). A key of another objective is an unknown key there, named with the keys this kind has.
_HARD = "model.attention.attention=hard"
_RUNS = {
    "xe": ([], {"alpha_c": "0.5", "alpha_entropy": "0.5"}),
    "reinforce": ([_HARD], {"alpha_c": "0.5", "alpha_entropy": "0.5", "expectation_prob": "0.25",
                            "reinforce_weight": "0.5", "entropy_weight": "0.5", "baseline_decay": "0.5"}),
    "loo": ([_HARD], {"alpha_c": "0.5", "alpha_entropy": "0.5", "expectation_prob": "0.25", "reinforce_weight": "0.5",
                      "entropy_weight": "0.5",
                      "samples": "3", "reward_discount": "0.5"}),
    "gumbel": ([_HARD], {"alpha_c": "0.5", "alpha_entropy": "0.5", "expectation_prob": "0.25",
                         "temperature": "2.0",
                         "temperature_min": "0.25"}),
    # hard-attention SCST that samples its cells needs its own entropy bonus set (the section's ``required``)
    "scst": ([_HARD, "train.objective.entropy_weight=0.01"],
             {"samples": "3", "baseline": "greedy", "reward_end": "false", "max_length": "9", "forbid_unk": "false",
              "greedy_images": "7", "xe_weight": "0.5", "entropy_weight": "0.5", "attention_mode": "sample"}),
}


@pytest.mark.parametrize("kind", list(_RUNS))
def test_each_objective_reads_its_own_section(kind):
    overrides, keys = _RUNS[kind]
    for key, value in keys.items():
        # the kind may come after its keys: it is applied first
        cfg = load_config(None, [*overrides, f"train.objective.{key}={value}", f"train.objective.kind={kind}"])
        assert str(get_path(cfg, f"train.objective.{key}")).lower() == value
    others = {key for other, (_, theirs) in _RUNS.items() if other != kind for key in theirs} - set(keys)
    assert others  # every kind here lacks some key of another
    for key in others:
        with pytest.raises(ConfigError, match=f"unknown config key 'train.objective.{key}' \\(valid keys at "
                                              f"train.objective for kind {kind}: kind, "):
            load_config(None, [*overrides, f"train.objective.kind={kind}", f"train.objective.{key}=1"])


def test_the_objective_must_fit_the_attention():
    """Hard attention has a location policy that cross-entropy alone cannot train, and only hard attention has
    one: each mismatch is refused, naming the kinds that fit. SCST trains either."""
    with pytest.raises(ConfigError, match="train.objective.kind: 'xe' cannot train hard attention .*use one of "
                                          "reinforce, loo, gumbel, scst"):
        load_config(None, [_HARD])
    for kind in ("reinforce", "loo", "gumbel"):
        with pytest.raises(ConfigError, match=f"'{kind}' trains hard attention's location policy, but "
                                              "model.attention.attention is not hard; use one of xe or scst"):
            load_config(None, [f"train.objective.kind={kind}"])
    assert load_config(None, ["train.objective.kind=scst"]).train.objective.kind == "scst"
    with pytest.raises(ConfigError, match="train.objective.kind: 'paper' is not one of xe, reinforce, loo, gumbel, "
                                          "scst"):
        load_config(None, ["train.objective.kind=paper"])


def test_scst_refuses_location_settings_a_run_would_ignore():
    """Soft attention has no location policy; argmax reads sample none: SCST's location keys are refused there,
    and a hard run that samples its cells must set its entropy bonus itself. A saved config is read for
    decoding all the same."""
    for overrides, key in [(["train.objective.attention_mode=argmax"], "attention_mode"),
                           (["train.objective.entropy_weight=0.1"], "entropy_weight"),
                           ([_HARD, "train.objective.attention_mode=argmax", "train.objective.entropy_weight=0.1"],
                            "entropy_weight")]:
        with pytest.raises(ConfigError, match=f"train.objective.{key}: set to .*would ignore it"):
            load_config(None, ["train.objective.kind=scst", *overrides])
    with pytest.raises(ConfigError, match="train.objective.entropy_weight: hard-attention SCST samples its cells"):
        load_config(None, ["train.objective.kind=scst", _HARD])
    saved = config_to_dict(load_config(None, ["train.objective.kind=scst"]))
    saved["train"]["objective"]["attention_mode"] = "argmax"  # unread by a soft model: a checkpoint still loads
    assert config_from_dict(saved).train.objective.attention_mode == "argmax"


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


def test_a_kind_change_by_set_refuses_the_old_kinds_keys_it_would_read_otherwise():
    """`--set train.objective.kind=scst` on a leave-one-out config kept loo's samples (2 location paths per caption)
    as SCST's captions per image, and loo's entropy weight as SCST's, which is never inherited: refused now, naming
    them. Keys both kinds read in one sense (declared by a class they share) stay."""
    from captioner.config import load_config

    with pytest.raises(ConfigError, match=r"train.objective.samples, train.objective.entropy_weight: set for kind "
                                          r"'loo', which kind 'scst' reads in another sense; .*set it whole"):
        load_config("flickr8k_hard", ["train.objective.kind=scst", "train.objective.entropy_weight=0.01"])
    whole = load_config("flickr8k_hard", ["train.objective={kind: scst, entropy_weight: 0.01}"])
    assert (whole.train.objective.samples, whole.train.objective.entropy_weight) == (5, 0.01)
    kept = load_config("flickr8k_soft", ["model.attention.attention=hard", "train.objective.kind=gumbel"])
    assert (kept.train.objective.alpha_c, kept.train.objective.alpha_entropy) == (0.05, 0.1)  # xe's, read alike
    grounded = load_config("flickr8k_soft_grounded", ["model.attention.attention=hard", "train.objective.kind=loo"])
    assert grounded.train.objective.grounding_weight == 1.0
