"""How hard attention's location policy learns under cross-entropy (``train.hard.estimator``): one function per
estimator, registered by name in ``ESTIMATORS`` (checked against ``names.HARD_ESTIMATORS`` by
tests/test_config.py). Adding one is a function here and its name there.

Each takes the training forward, the batch, the config, the rows that read the expectation this step
(``expectation`` (B,) bool, §4.1's variance-reduction trick, drawn by the caller), the running REINFORCE
baseline and the "gumbel" read's temperature, and returns the batch's LossOutput.

- ``paper``: Xu et al. 2015 Eq. (10)-(12), REINFORCE against a moving-average baseline (losses.hard_attention_loss);
- ``loo``: K sampled cell paths per caption, each against the mean of the others (losses.loo_hard_attention_loss);
- ``gumbel``: the straight-through Gumbel-softmax read; the context carries the scorer's gradient, no REINFORCE
  term (losses.gumbel_attention_loss).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from captioner.training.losses import LossOutput, gumbel_attention_loss, hard_attention_loss, loo_hard_attention_loss

Estimator = Callable[[nn.Module, Any, Any, torch.Tensor, "float | None", float], LossOutput]


def paper(forward: nn.Module, batch: Any, cfg: Any, expectation: torch.Tensor, baseline: float | None,
          temperature: float) -> LossOutput:
    h = cfg.train.hard
    out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="sample", expectation_mask=expectation)
    return hard_attention_loss(out, batch.captions[:, 1:], baseline=baseline, alpha_c=cfg.train.alpha_c,
                               reinforce_weight=h.reinforce_weight, entropy_weight=h.entropy_weight,
                               sampled=~expectation, alpha_entropy=cfg.train.alpha_entropy)


def loo(forward: nn.Module, batch: Any, cfg: Any, expectation: torch.Tensor, baseline: float | None,
        temperature: float) -> LossOutput:
    """The expectation captions once, then K consecutive copies of each sampled one."""
    h = cfg.train.hard
    E = int(expectation.sum())
    index = torch.cat([expectation.nonzero().squeeze(1),
                       (~expectation).nonzero().squeeze(1).repeat_interleave(h.samples)])  # (E + S*K,)
    read_expectation = torch.arange(index.shape[0], device=index.device) < E
    out = forward(batch.inputs, batch.captions.index_select(0, index), batch.lengths.index_select(0, index),
                  attention_mode="sample", expectation_mask=read_expectation, rows=index)
    return loo_hard_attention_loss(out, batch.captions[:, 1:].index_select(0, index), samples=h.samples,
                                   n_expectation=E, reinforce_weight=h.reinforce_weight,
                                   entropy_weight=h.entropy_weight, discount=h.reward_discount,
                                   alpha_c=cfg.train.alpha_c, alpha_entropy=cfg.train.alpha_entropy)


def gumbel(forward: nn.Module, batch: Any, cfg: Any, expectation: torch.Tensor, baseline: float | None,
           temperature: float) -> LossOutput:
    out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="gumbel",
                  expectation_mask=expectation, temperature=temperature)
    res = gumbel_attention_loss(out, batch.captions[:, 1:], alpha_c=cfg.train.alpha_c,
                                alpha_entropy=cfg.train.alpha_entropy)
    res.parts["temperature"] = res.loss.new_tensor(temperature).detach()
    return res


ESTIMATORS: dict[str, Estimator] = {"paper": paper, "loo": loo, "gumbel": gumbel}
