"""Hard attention under cross-entropy: how its location policy learns (Xu et al. 2015, §4.1).

Every caption reads sampled cells, except on a share of them (``expectation_prob``) where it reads the expected
context instead (§4.1's variance-reduction trick), drawn per caption on the CPU generator (restored on resume).

- ``Reinforce`` (``kind: reinforce``): the paper's estimator, Eq. (10)-(12), against a moving-average baseline that
  it keeps (and saves) itself (losses.hard_attention_loss);
- ``LeaveOneOut`` (``kind: loo``): K sampled cell paths per caption, each against the mean of the others
  (losses.loo_hard_attention_loss);
- ``Gumbel`` (``kind: gumbel``): the straight-through Gumbel-softmax read at a temperature it anneals over the
  epochs; the context carries the scorer's gradient, no REINFORCE term (losses.gumbel_attention_loss).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from captioner.training.losses import (
    LossOutput,
    gumbel_attention_loss,
    gumbel_temperature,
    hard_attention_loss,
    loo_hard_attention_loss,
    update_baseline,
)
from captioner.training.objectives.base import Needs, Objective


class _LocationPolicy(Objective):
    def reads_expectation(self, batch: Any) -> torch.Tensor:
        """(B,) bool: the captions that read the expectation this step (drawn on the CPU generator)."""
        B = batch.captions.shape[0]
        return (torch.rand(B) < self.section.expectation_prob).to(batch.captions.device)


class Reinforce(_LocationPolicy):
    """Eq. (10)-(12): REINFORCE with the moving-average baseline b <- decay * b + (1 - decay) * mean reward."""

    def __init__(self, section: Any, needs: Needs) -> None:
        super().__init__(section, needs)
        self.baseline: float | None = None  # none before the first step: that step's advantage has no baseline

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        s = self.section
        expectation = self.reads_expectation(batch)
        out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="sample",
                      expectation_mask=expectation)
        return hard_attention_loss(out, batch.captions[:, 1:], baseline=self.baseline, alpha_c=s.alpha_c,
                                   reinforce_weight=s.reinforce_weight, entropy_weight=s.entropy_weight,
                                   sampled=~expectation, alpha_entropy=s.alpha_entropy)

    def after_step(self, mean_reward: float | None) -> None:
        if mean_reward is not None:
            self.baseline = update_baseline(self.baseline, mean_reward, self.section.baseline_decay)

    def epoch_figures(self) -> dict[str, Any]:
        return {"baseline": self.baseline}

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a checkpoint of another objective (loo, gumbel and scst keep no state: {}) resumed as reinforce: the
        # moving baseline starts unset, as in a new run (its first step uses its own mean reward)
        self.baseline = state.get("baseline")


class LeaveOneOut(_LocationPolicy):
    """K = ``samples`` cell paths per sampled caption, each one's baseline the mean reward of the other K - 1."""

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        """The expectation captions once, then K consecutive copies of each sampled one."""
        s = self.section
        expectation = self.reads_expectation(batch)
        E = int(expectation.sum())
        index = torch.cat([expectation.nonzero().squeeze(1),
                           (~expectation).nonzero().squeeze(1).repeat_interleave(s.samples)])  # (E + S*K,)
        read_expectation = torch.arange(index.shape[0], device=index.device) < E
        out = forward(batch.inputs, batch.captions.index_select(0, index), batch.lengths.index_select(0, index),
                      attention_mode="sample", expectation_mask=read_expectation, rows=index)
        return loo_hard_attention_loss(out, batch.captions[:, 1:].index_select(0, index), samples=s.samples,
                                       n_expectation=E, reinforce_weight=s.reinforce_weight,
                                       entropy_weight=s.entropy_weight, discount=s.reward_discount,
                                       alpha_c=s.alpha_c, alpha_entropy=s.alpha_entropy)


class Gumbel(_LocationPolicy):
    """The straight-through Gumbel-softmax read at τ, from ``temperature`` in the first epoch geometrically down to
    ``temperature_min`` in the last (losses.gumbel_temperature over train.epochs)."""

    def __init__(self, section: Any, needs: Needs) -> None:
        super().__init__(section, needs)
        self.epochs = needs.epochs
        self.temperature = section.temperature

    def on_epoch(self, epoch: int) -> None:
        s = self.section
        self.temperature = gumbel_temperature(epoch, self.epochs, s.temperature, s.temperature_min)

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        s = self.section
        out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="gumbel",
                      expectation_mask=self.reads_expectation(batch), temperature=self.temperature)
        res = gumbel_attention_loss(out, batch.captions[:, 1:], alpha_c=s.alpha_c, alpha_entropy=s.alpha_entropy)
        res.parts["temperature"] = res.loss.new_tensor(self.temperature).detach()
        return res
