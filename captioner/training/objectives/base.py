"""What the training loop calls on an objective: ``Objective``, the verbs every training objective has.

A step asks its objective for ``loss(forward, batch)``; once the step is taken (every rank alike), ``after_step``
gets the batch's mean reward, all-reduced over the ranks (None when the loss had none); ``on_epoch`` comes before
each epoch's first step. What an objective keeps between steps (a moving baseline) is its ``state_dict``, saved in
every checkpoint and restored on resume; what it adds to an epoch's metrics line is ``epoch_figures``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from captioner.training.losses import LossOutput


@dataclass
class Needs:
    """What an objective may be built from besides its section (registry.build_objective fills it)."""

    model: nn.Module  # the Captioner being trained
    train_set: Any  # the training dataset (SCST: per image, its record index is the reward's image index)
    from_images: bool  # batches carry images (fine-tuning) rather than cached grids
    hard: bool  # the attention is hard: it has a location policy (config.hard_attention)
    epochs: int  # train.epochs: what a schedule over the run spans
    eval_batch_size: int  # eval.batch_size: images per batch where an objective decodes for its figures


class Objective:
    """A training objective built from its ``train.objective`` section (``section``) and ``Needs``."""

    # DDP must search every step for parameters without a gradient (find_unused_parameters) when a step may
    # leave one out: every cross-entropy objective reaches every parameter (tests/test_ddp.py checks each)
    may_leave_parameters_out = False

    def __init__(self, section: Any, needs: Needs) -> None:
        self.section = section

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        """One batch's objective. ``forward`` is the training loop's _TrainForward (DDP-wrapped or not)."""
        raise NotImplementedError

    def after_step(self, mean_reward: float | None) -> None:
        """The step was taken; ``mean_reward``: the batch's mean reward over every rank (None: the loss had none)."""

    def on_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` (0-based) is about to train."""

    def epoch_figures(self) -> dict[str, Any]:
        """What this objective adds to the epoch's metrics line."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s values (a resume: then the run continues as if never stopped)."""
