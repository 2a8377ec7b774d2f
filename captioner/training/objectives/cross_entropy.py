"""Soft attention by backpropagation (Xu et al. 2015, §4.2): cross-entropy with the doubly stochastic penalty,
Eq. (14), and the optional sharpness term (``train.objective.kind: xe``; losses.soft_attention_loss)."""

from __future__ import annotations

from typing import Any

from torch import nn

from captioner.training.losses import LossOutput, soft_attention_loss
from captioner.training.objectives.base import Objective


class CrossEntropy(Objective):
    """Teacher-forced cross-entropy of every caption, read with the expected context; with scheduled sampling, a
    share of the input words (``sample_prob``, the section's schedule over the epochs) the model's own samples."""

    sample_prob = 0.0

    def on_epoch(self, epoch: int) -> None:
        self.sample_prob = self.section.sample_prob(epoch)

    def epoch_figures(self) -> dict[str, Any]:
        return {"ss_prob": self.sample_prob} if self.section.scheduled_sampling_start >= 0 else {}

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="expectation",
                      sample_prob=self.sample_prob)  # Captioner.forward passes it on only when > 0
        return soft_attention_loss(out, batch.captions[:, 1:], alpha_c=self.section.alpha_c,
                                   alpha_entropy=self.section.alpha_entropy,
                                   label_smoothing=self.section.label_smoothing)
