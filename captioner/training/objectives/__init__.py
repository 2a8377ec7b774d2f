"""Training objectives: what a training step minimises, one module per objective, as the decoder families are.

    sections.py        ObjectiveConfig and each objective's ``train.objective`` section (torch-free)
    base.py            Objective: the verbs the training loop calls (loss, after_step, on_epoch, state_dict)
    cross_entropy.py   CrossEntropy: soft attention by backpropagation (Xu et al. 2015, Eq. 14)
    location.py        hard attention under cross-entropy: Reinforce (the paper's Eq. 10-12), LeaveOneOut, Gumbel
    self_critical.py   SelfCritical: SCST on the CIDEr-D reward (Rennie et al. 2017)
    registry.py        OBJECTIVES (kind -> class), build_objective

This package's own module is torch-free: ``OBJECTIVE_CONFIGS`` (sections.py) maps ``train.objective.kind`` to the
objective's config dataclass, which ``captioner/config.py`` reads without importing torch or the training code.
``registry.OBJECTIVES`` maps the same kinds to the classes the training loop builds (a test holds the two equal).
Adding an objective: its section in sections.py, its class, and an entry in each table.
"""

from __future__ import annotations

from typing import Any

from captioner.training.objectives.sections import (
    OBJECTIVE_CONFIGS,
    CrossEntropyConfig,
    GumbelConfig,
    LeaveOneOutConfig,
    ObjectiveConfig,
    ReinforceConfig,
    SelfCriticalConfig,
)

DEFAULT_OBJECTIVE = "xe"


def objective_config(kind: Any) -> type[ObjectiveConfig]:
    """The config dataclass of objective ``kind`` (ValueError naming the valid kinds, for any other value)."""
    if not isinstance(kind, str) or kind not in OBJECTIVE_CONFIGS:
        raise ValueError(f"train.objective.kind: {kind!r} is not one of {', '.join(OBJECTIVE_CONFIGS)}")
    return OBJECTIVE_CONFIGS[kind]


__all__ = ["DEFAULT_OBJECTIVE", "OBJECTIVE_CONFIGS", "CrossEntropyConfig", "GumbelConfig", "LeaveOneOutConfig",
           "ObjectiveConfig", "ReinforceConfig", "SelfCriticalConfig", "objective_config"]
