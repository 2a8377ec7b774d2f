"""``build_objective``: the objective ``train.objective`` names (its section's ``IMPLEMENTATION``,
objective_sections.py), built with what it needs (``Needs``), the box maps of supervised attention included.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from captioner.config import Config, ConfigError, hard_attention
from captioner.registration import build, implementation
from captioner.training.objectives.base import BoxTargets, Needs, Objective

log = logging.getLogger(__name__)


def objective_class(section: Any) -> type[Objective]:
    """The Objective class a ``train.objective`` section names (what a run asks of it before building it:
    ``per_image``)."""
    return implementation(section, Objective)


def box_targets(cfg: Config, model: nn.Module, train_set: Any) -> BoxTargets:
    """The box maps that ``train.objective.grounding_weight`` supervises, from ``data.entities``; refused when no
    training photo has an annotation or no caption word names a boxed phrase."""
    from captioner.data.records import DataError
    from captioner.evaluation.regions import open_entities

    try:
        entities = open_entities(cfg.data.entities, [r.image_id for r in train_set.records], "the training split")
    except DataError as err:
        raise ConfigError(f"train.objective.grounding_weight: {err}") from None
    section = cfg.train.objective
    targets = BoxTargets(train_set.records, entities, model.vocab, model.grid_hw, section.grounding_loss,
                         section.grounding_power)
    if not len(targets):
        raise ConfigError(f"train.objective.grounding_weight: no word of the training captions names a boxed phrase "
                          f"in {cfg.data.entities} ({entities.summary()}): is it these photos' Flickr30k Entities?")
    log.info("supervised attention: %s; %d (image, word) box maps", entities.summary(), len(targets))
    return targets


def build_objective(cfg: Config, model: nn.Module, train_set: Any, from_images: bool) -> Objective:
    """The objective ``cfg.train.objective`` names, for ``model`` trained on ``train_set``; refused (ConfigError)
    when the section leaves unset what this run must choose (its ``required``: also for a config built in Python,
    which no config file check has seen)."""
    section = cfg.train.objective
    try:
        section.required(hard_attention(cfg))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    needs = Needs(model=model, train_set=train_set, from_images=from_images, hard=hard_attention(cfg),
                  epochs=cfg.train.epochs, eval_batch_size=cfg.eval.batch_size,
                  box_targets=box_targets(cfg, model, train_set) if section.grounding_weight > 0 else None)
    return build(section, section, needs, of=Objective)
