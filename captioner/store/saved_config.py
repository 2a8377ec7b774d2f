"""Configs this project wrote to disk (beside a checkpoint, in a model folder's config.json, as a run's
config.yaml), read back in the current format whatever version wrote them.

Files a person writes and ``--set`` overrides use the current keys only (captioner/config.py). What earlier
versions saved differs in two ways, both upgraded here and nowhere else:

- ``model.attention.kind`` is today's ``model.attention.attention`` (saved before the field took its
  constructor argument's name);
- ``model.decoder`` held the keys of every decoder family in one section, each family's unread ones at their
  defaults. A key another family owns, at that family's default, is dropped; any other value is kept, and the
  config refuses it as the unknown key it is, naming the file.

- ``train`` held the objective as a name (``objective: xe | scst``) beside sections for each (``hard``: the
  estimator of hard attention under cross-entropy and its settings, ``scst``) and cross-entropy's ``alpha_c`` and
  ``alpha_entropy``; today ``train.objective`` is the section of one objective, its kind ``xe``, ``reinforce``
  (the old estimator ``paper``), ``loo``, ``gumbel`` or ``scst``, holding only the keys that objective reads
  (``upgrade_objective``).

A config saved before ``tf32`` existed is read with it off (``_keep_full_float32``): the precision it ran with.

And one upgrade keeps how a model decodes: before soft models could read one cell per word (issue 35: "hard
attention from soft", commit ffa4944), a soft model (any attention but ``hard``) whose ``eval.attention_mode`` was
``argmax`` or ``sample`` (a soft ablation of a hard config, ``--set model.attention.attention=soft``) ignored
it and decoded softly; today's code would read one cell per word. Such a config is read with
``eval.attention_mode: expectation``, the read that version made (``--attention-mode argmax`` still asks for
one cell). What marks a config saved before that change: its ``train.scst`` section has no ``attention_mode``,
the key that change added (every saved config holds every key of the version that saved it; one without a
``train`` section is not a saved config and is left as it is).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from captioner.config import Config, ConfigError, config_from_dict, config_from_file_data, kinded_section
from captioner.models.decoders import DECODERS

# The decoding reads of one grid cell per word (models/attention.py's ONE_CELL_MODES less training's gumbel; this
# module stays torch-free, as the config is).
ONE_CELL_READS = ("argmax", "sample")


def upgrade_saved_config(data: Any) -> Any:
    """``data`` (a saved config as a nested dict) in the current format. It never raises: what it cannot
    upgrade (not a mapping, an unknown kind, both ``kind`` and ``attention``) is left as it is, for the config's
    reader to refuse by name. The input is not changed."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return data
    data = copy.deepcopy(data)
    attention = data["model"].get("attention")
    if isinstance(attention, dict) and "kind" in attention and "attention" not in attention:
        attention["attention"] = attention.pop("kind")
    _keep_soft_reads_soft(data)
    upgrade_objective(data)
    _keep_full_float32(data)
    decoder = data["model"].get("decoder")
    if not isinstance(decoder, dict):
        return data
    try:
        own = {f.name for f in dataclasses.fields(DECODERS.section(decoder.get("kind", DECODERS.default)))}
    except ValueError:
        return data
    for key in [k for k in decoder if k not in own]:
        if any(decoder[key] == default for default in _defaults_elsewhere(key)):
            del decoder[key]
    return data


def _keep_full_float32(data: dict) -> None:
    """A config saved before ``tf32`` existed (issue 43) ran its float32 matmuls in full precision on CUDA (PyTorch's
    default): read with ``tf32: false`` in train and eval, so that a resume (or a decode) keeps the precision the run
    had, rather than turning TF32 on midway. A section without a mapping is left for the reader to refuse."""
    for section in ("train", "eval"):
        if isinstance(data.get(section), dict) and "tf32" not in data[section]:
            data[section]["tf32"] = False


# the cross-entropy estimators of hard attention, by their old train.hard.estimator names
_ESTIMATOR_KINDS = {"paper": "reinforce", "loo": "loo", "gumbel": "gumbel"}


def upgrade_objective(data: dict) -> None:
    """A train section saved before objectives were sections (``objective`` a name, ``hard``, ``scst``,
    ``alpha_c``, ``alpha_entropy``): the same run's ``train.objective`` section today, in place. The kind is what
    that version trained with: scst, or for hard attention under cross-entropy its estimator, else xe; the section
    takes the old keys that kind reads (the others were unread, and dropped)."""
    train = data.get("train")
    if not isinstance(train, dict) or isinstance(train.get("objective"), dict):
        return
    if not any(key in train for key in ("objective", "hard", "scst", "alpha_c", "alpha_entropy")):
        return
    hard, scst = train.pop("hard", None) or {}, train.pop("scst", None) or {}
    attention = (data.get("model") or {}).get("attention")
    is_hard = isinstance(attention, dict) and attention.get("attention") == "hard"
    if train.get("objective", "xe") == "scst":
        kind, old = "scst", scst
    elif is_hard:
        kind, old = _ESTIMATOR_KINDS.get(hard.get("estimator", "paper"), hard.get("estimator")), hard
    else:
        kind, old = "xe", {}
    old = {**{key: train.pop(key) for key in ("alpha_c", "alpha_entropy") if key in train}, **old}
    try:
        own = {f.name for f in dataclasses.fields(kinded_section("train.objective", kind))}
    except ConfigError:  # an estimator no version had: kept for the config's reader to refuse by name
        own = set(old)
    train["objective"] = {"kind": kind, **{key: value for key, value in old.items() if key in own and key != "kind"}}


def saved_before_one_cell_soft_reads(data: dict) -> bool:
    """Whether a saved config (a nested dict) was written before soft models could read one cell per word:
    its train section lacks train.scst.attention_mode, which the same change added (module docstring)."""
    train = data.get("train")
    if not isinstance(train, dict):
        return False  # not a whole saved config: nothing to tell its version by
    if isinstance(train.get("objective"), dict):
        return False  # objectives as sections came after that change
    scst = train.get("scst")
    return not (isinstance(scst, dict) and "attention_mode" in scst)


def _keep_soft_reads_soft(data: dict) -> None:
    """A soft model saved before one-cell soft reads decoded softly whatever eval.attention_mode said: say so."""
    attention, evaluation = data["model"].get("attention"), data.get("eval")
    kind = attention.get("attention", "soft") if isinstance(attention, dict) else "soft"
    if (isinstance(evaluation, dict) and evaluation.get("attention_mode") in ONE_CELL_READS and kind != "hard"
            and saved_before_one_cell_soft_reads(data)):
        evaluation["attention_mode"] = "expectation"


def _defaults_elsewhere(key: str) -> list[Any]:
    """The defaults the decoder families that have ``key`` give it."""
    return [f.default for family in DECODERS.sections.values() for f in dataclasses.fields(family) if f.name == key]


def read_saved_config(data: Any, source: str | Path | None = None) -> Config:
    """A saved config (``data``, as a nested dict) as a validated Config; a ConfigError names ``source`` when
    given."""
    try:
        return config_from_dict(upgrade_saved_config(data))
    except ConfigError as err:
        raise ConfigError(f"{source}: the stored config is invalid: {err}" if source is not None else str(err)
                          ) from None


def load_run_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A run folder's config.yaml (``train --resume``) with ``overrides`` applied, checked as ``load_config``
    checks a config file."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the run's config ({err})") from None
    return config_from_file_data(upgrade_saved_config(data), overrides, source=path)
