"""What DDP is told about the model (training/loop.py): no per-step search for unused parameters where every
parameter gets a gradient, no per-step broadcast of buffers that never change. The two-process gloo run itself is
tests/test_train.py::test_ddp_two_cpu_processes_agree; tests/test_gpu.py runs two processes on one GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from captioner.api import build_model
from captioner.config import load_config
from captioner.data.datasets import pad_batch
from captioner.data.vocab import Vocab
from captioner.training.loop import _buffers_change, _TrainForward
from captioner.training.objectives.registry import build_objective

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"
SMOKE_TRANSFORMER = REPO / "configs" / "smoke_transformer.yaml"

# Every cross-entropy variant: each decoder kind, attention, scorer and hard-attention estimator, and the refiner
XE_VARIANTS = {
    "soft additive": (SMOKE, []),
    "soft dot": (SMOKE, ["model.attention.scorer=dot"]),
    "soft scaled dot": (SMOKE, ["model.attention.scorer=scaled_dot"]),
    "soft bilinear": (SMOKE, ["model.attention.scorer=bilinear"]),
    "key-value": (SMOKE, ["model.attention.attention=key_value"]),
    "multi-head": (SMOKE, ["model.attention.attention=multi_head", "model.attention.heads=2"]),
    "self-attention refiner": (SMOKE, ["model.encoder.self_attention_layers=1"]),
    "no gate": (SMOKE, ["model.decoder.gate=none"]),
    "hard, paper": (SMOKE, ["model.attention.attention=hard", "train.objective.kind=reinforce"]),
    "hard, paper, never the expectation": (SMOKE, ["model.attention.attention=hard", "train.objective.kind=reinforce",
                                                   "train.objective.expectation_prob=0.0"]),
    "hard, leave-one-out": (SMOKE, ["model.attention.attention=hard", "train.objective.kind=loo"]),
    "hard, gumbel": (SMOKE, ["model.attention.attention=hard", "train.objective.kind=gumbel"]),
    "transformer": (SMOKE_TRANSFORMER, []),
}


@pytest.mark.parametrize("name", list(XE_VARIANTS))
def test_every_cross_entropy_variant_gives_every_parameter_a_gradient(name):
    """What lets DDP run without find_unused_parameters for cross-entropy (Objective.may_leave_parameters_out)."""
    path, sets = XE_VARIANTS[name]
    cfg = load_config(path, sets)
    torch.manual_seed(0)
    vocab = Vocab.build([["a", "b", "c", "d"]] * 5, min_count=1)
    model = build_model(cfg, vocab).train()
    H, W, C = model.encoder.cache_shape
    rows = torch.randn(4, H * W, C)  # (B, L, C): what the feature cache serves
    batch = pad_batch(rows, [[1, 4, 5, 6, 2], [1, 5, 6, 2], [1, 4, 4, 5, 7, 2], [1, 6, 2]], [0, 1, 2, 3])
    forward = _TrainForward(model, from_images=False)
    objective = build_objective(cfg, model, train_set=None, from_images=False)
    assert not objective.may_leave_parameters_out
    if "baseline" in objective.state_dict():
        objective.load_state_dict({"baseline": 0.0})  # the paper's estimator after its first step
    objective.loss(forward, batch).loss.backward()
    trainable = [n for n, p in forward.named_parameters() if p.requires_grad]
    assert trainable
    assert [n for n, p in forward.named_parameters() if p.requires_grad and p.grad is None] == []


def test_scst_searches_for_unused_parameters():
    """Hard attention reading its arg-max cell under SCST trains no scorer (without its xe_weight)."""
    from captioner.objective_sections import OBJECTIVES
    from captioner.registration import implementation

    classes = {kind: implementation(section) for kind, section in OBJECTIVES.items()}
    assert classes["scst"].may_leave_parameters_out
    assert [kind for kind, cls in classes.items() if cls.may_leave_parameters_out] == ["scst"]


def test_buffers_are_broadcast_only_when_training_changes_them():
    assert not _buffers_change(load_config(SMOKE))
    assert not _buffers_change(load_config(SMOKE, ["model.encoder.finetune_blocks=1"]))
    assert _buffers_change(load_config(SMOKE, ["model.encoder.finetune_blocks=1",
                                               "model.encoder.update_bn_stats=true"]))
