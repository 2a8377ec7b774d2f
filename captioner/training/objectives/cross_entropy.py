"""Soft attention by backpropagation (Xu et al. 2015, §4.2): cross-entropy with the doubly stochastic penalty,
Eq. (14), and the optional sharpness term (``train.objective.kind: xe``; losses.soft_attention_loss)."""

from __future__ import annotations

from typing import Any

from torch import nn

from captioner.training.losses import LossOutput, soft_attention_loss
from captioner.training.objectives.base import Objective


class CrossEntropy(Objective):
    """Teacher-forced cross-entropy of every caption, read with the expected context."""

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="expectation")
        return soft_attention_loss(out, batch.captions[:, 1:], alpha_c=self.section.alpha_c,
                                   alpha_entropy=self.section.alpha_entropy)
