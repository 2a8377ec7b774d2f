"""build_model: the config's options reach the model; the grid position embedding."""

import pytest
import torch

from captioner.config import load_config
from captioner.data.vocab import Vocab
from captioner.models.captioner import GridPositionEmbedding, build_model

SMOKE = "configs/smoke.yaml"


@pytest.fixture
def vocab():
    return Vocab.build([["a", "red", "circle"], ["a", "blue", "square"]])


def test_position_embedding_is_built_and_trains(vocab):
    cfg = load_config(SMOKE, ["model.encoder.position_embedding=true", "model.encoder.self_attention_layers=1"])
    model = build_model(cfg, vocab)
    pos = [m for m in model.refine.modules() if isinstance(m, GridPositionEmbedding)]
    assert len(pos) == 1
    H, W = model.grid_hw
    assert pos[0].weight.shape == (1, H * W, model.encoder.out_dim)
    grid = torch.randn(2, H * W, model.encoder.backbone_dim)
    captions = torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0]])
    out = model(model.prepare_grid(grid), captions, torch.tensor([4, 3]))
    out.logits.sum().backward()
    assert pos[0].weight.grad is not None and pos[0].weight.grad.abs().sum() > 0


def test_position_embedding_starts_as_identity_and_checks_locations():
    emb = GridPositionEmbedding(4, 3)
    grid = torch.randn(2, 4, 3)
    assert torch.equal(emb(grid), grid)
    with pytest.raises(ValueError, match="5 locations"):
        emb(torch.randn(2, 5, 3))


def test_default_model_has_no_refinement(vocab):
    model = build_model(load_config(SMOKE), vocab)
    assert isinstance(model.refine, torch.nn.Identity)
