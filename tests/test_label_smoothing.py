"""Label smoothing (``train.objective.label_smoothing``, xe and scst's xe_weight term): the objective's word term
is F.cross_entropy's label-smoothed cross-entropy of the decoder's logits, the fused path and the reference
agree on it, and the settings a run would ignore are refused (hard attention's objectives, scst without an
xe_weight term, a value outside [0, 1))."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from captioner import fast
from captioner.config import ConfigError, load_config
from captioner.training.loop import _TrainForward
from tests.test_objective_contract import SMOKE, _built, _cfg


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("smoothing_data")


@pytest.mark.parametrize("reference", [False, True])
def test_the_xe_term_is_the_label_smoothed_cross_entropy_of_the_logits(data_root, tmp_path, reference):
    eps = 0.1
    model, objective, batch = _built(_cfg(data_root, tmp_path / "run", "xe", f"train.objective.label_smoothing={eps}"))
    model.eval()  # no dropout: the forward below is the same twice
    forward = _TrainForward(model, from_images=True)
    with fast.reference() if reference else torch.enable_grad():
        res = objective.loss(forward, batch)
        out = forward(batch.inputs, batch.captions, batch.lengths, attention_mode="expectation")
    targets = batch.captions[:, 1:].reshape(-1).index_select(0, out.rows)
    logits = F.linear(out.packed_features, out.output_weight, out.output_bias)
    smoothed = F.cross_entropy(logits, targets, label_smoothing=eps)
    plain = F.cross_entropy(logits, targets)
    assert res.parts["xe"].item() == pytest.approx(smoothed.item(), rel=1e-5)
    assert smoothed.item() != pytest.approx(plain.item(), rel=1e-3)


def test_scst_smooths_its_xe_weight_term(data_root, tmp_path):
    model, objective, batch = _built(_cfg(data_root, tmp_path / "run", "scst", "train.objective.xe_weight=0.5",
                                          "train.objective.label_smoothing=0.2", "train.objective.samples=2"))
    model.eval()
    forward = _TrainForward(model, from_images=True)
    torch.manual_seed(3)
    smoothed = objective.cross_entropy(forward, batch)
    objective.section.label_smoothing = 0.0
    torch.manual_seed(3)  # the same reference drawn per image
    plain = objective.cross_entropy(forward, batch)
    assert torch.isfinite(smoothed) and smoothed.item() != pytest.approx(plain.item(), rel=1e-3)


def test_settings_a_run_would_ignore_or_cannot_use_are_refused():
    with pytest.raises(ConfigError, match="train.objective.label_smoothing: set to 0.1, but this run would ignore "
                                          "it \\(the location policy's reward"):
        load_config(SMOKE, ["model.attention.attention=hard", "train.objective.kind=reinforce",
                            "train.objective.label_smoothing=0.1"])
    with pytest.raises(ConfigError, match="label_smoothing: set to 0.1, but this run would ignore it \\(it smooths "
                                          "the xe_weight term, which is 0"):
        load_config(SMOKE, ["train.objective.kind=scst", "train.objective.label_smoothing=0.1"])
    for bad in ("1.0", "-0.1"):
        with pytest.raises(ConfigError, match="train.objective.label_smoothing"):
            load_config(SMOKE, [f"train.objective.label_smoothing={bad}"])
    assert load_config(SMOKE, ["train.objective.label_smoothing=0.1"]).train.objective.label_smoothing == 0.1
