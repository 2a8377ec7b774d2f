"""The training objectives by ``train.objective.kind``: ``OBJECTIVES`` (kind -> class) and ``build_objective``.

A test holds ``OBJECTIVES`` equal to the torch-free ``OBJECTIVE_CONFIGS`` (this package's ``__init__``), whose
sections the config reads.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from captioner.config import Config, ConfigError, hard_attention
from captioner.training.objectives.base import Needs, Objective
from captioner.training.objectives.cross_entropy import CrossEntropy
from captioner.training.objectives.location import Gumbel, LeaveOneOut, Reinforce
from captioner.training.objectives.self_critical import SelfCritical

OBJECTIVES: dict[str, type[Objective]] = {
    "xe": CrossEntropy,
    "reinforce": Reinforce,
    "loo": LeaveOneOut,
    "gumbel": Gumbel,
    "scst": SelfCritical,
}


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
                  epochs=cfg.train.epochs, eval_batch_size=cfg.eval.batch_size)
    return OBJECTIVES[section.kind](section, needs)
