"""The scene beside the attended read (model.decoder.scene, show_attend_tell.py): what the decoder reads, how a model
without it starts one with it, and the settings refused. The fast path's equality with the reference, with the
scene, is tests/test_fast_paths.py's (training gradients, projected values)."""

from __future__ import annotations

import pytest
import torch

from captioner.api import build_model
from captioner.config import ConfigError, config_to_dict, load_config
from captioner.data.vocab import Vocab
from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder, widen_for_scene
from captioner.training.resume import init_weights

ARGS = dict(vocab_size=17, feature_dim=6, embed_dim=5, hidden_dim=7, attention_dim=4, dropout=0.0)


@pytest.mark.parametrize("attention,mode", [("soft", "expectation"), ("hard", "argmax"), ("hard", "sample")])
def test_every_read_returns_the_grids_mean_beside_it(attention, mode):
    torch.manual_seed(0)
    dec = ShowAttendTellDecoder(**ARGS, attention=attention, scene="mean", gate="none").eval()
    grid = torch.randn(3, 5, 6)
    h, c, *memory = dec.init_state(grid)
    read = dec.attention(h, memory, mode)
    assert read.context.shape == (3, 12)
    torch.testing.assert_close(read.context[:, 6:], grid.mean(1))  # [read; ā]
    if mode == "argmax":  # one cell read: its own vector, then ā
        cells = read.alpha.argmax(1)
        torch.testing.assert_close(read.context[:, :6], grid[torch.arange(3), cells])


def test_a_model_widened_for_the_scene_computes_what_it_computed():
    torch.manual_seed(1)
    narrow = ShowAttendTellDecoder(**ARGS).eval()
    wide = ShowAttendTellDecoder(**ARGS, scene="mean").eval()
    state = {f"decoder.{k}": v for k, v in narrow.state_dict().items()}
    widened = widen_for_scene(state, feature_dim=6)
    wide.load_state_dict({k.removeprefix("decoder."): v for k, v in widened.items()})
    assert widened["decoder.lstm.weight_ih"].shape == (28, 5 + 12) and widened["decoder.out_z.weight"].shape == (5, 12)
    assert state["decoder.lstm.weight_ih"].shape == (28, 5 + 6)  # the input left as it was
    grid = torch.randn(2, 5, 6)
    captions = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 8, 2, 0]])
    lengths = torch.tensor([5, 4])
    torch.testing.assert_close(wide(grid, captions, lengths).logits, narrow(grid, captions, lengths).logits,
                               atol=1e-6, rtol=1e-6)
    # and the scene's weights are live: moved off zero, the logits change
    with torch.no_grad():
        wide.out_z.weight[:, 6:] += 0.5
    assert not torch.allclose(wide(grid, captions, lengths).logits, narrow(grid, captions, lengths).logits)


def test_train_init_widens_a_model_without_the_scene_and_refuses_the_other_way():
    vocab = Vocab.build([["a", "red", "circle"]])
    narrow_cfg = load_config("smoke")
    wide_cfg = load_config("smoke", ["model.decoder.scene=mean", "train.init=runs/x"])
    narrow = build_model(narrow_cfg, vocab, pretrained=False).eval()
    wide = build_model(wide_cfg, vocab, pretrained=False).eval()
    payload = {"config": config_to_dict(narrow_cfg), "model": narrow.state_dict(), "epoch": 3}
    init_weights(wide_cfg, wide, payload)
    for key, value in narrow.state_dict().items():
        got = wide.state_dict()[key]
        if key in ("decoder.lstm.weight_ih", "decoder.out_z.weight"):
            assert torch.equal(got[:, : value.shape[1]], value) and not got[:, value.shape[1]:].any()
        else:
            assert torch.equal(got, value), key
    back = {"config": config_to_dict(wide_cfg), "model": wide.state_dict(), "epoch": 3}
    with pytest.raises(ConfigError, match="model.decoder.scene"):
        init_weights(load_config("smoke", ["train.init=runs/y"]), narrow, back)


def test_a_scene_beside_a_read_without_one_value_per_cell_and_unknown_scenes_are_refused():
    with pytest.raises(ConfigError, match="model.decoder.scene"):
        load_config("smoke", ["model.decoder.scene=mean", "model.attention.attention=multi_head",
                              "model.attention.heads=2"])
    with pytest.raises(ConfigError, match="model.decoder.scene"):
        load_config("smoke", ["model.decoder.scene=max"])
    with pytest.raises(ValueError, match="model.decoder.scene"):
        ShowAttendTellDecoder(**ARGS, attention="multi_head", heads=2, scene="mean")
