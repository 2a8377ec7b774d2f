"""Backbones for captioner/models/encoder.py: one builder per family, each returning the backbone's stages (a list
of modules run in order; the last one's output is the feature map), the preprocessing its weights expect and where
the weights came from; and per named backbone a ``Backbone`` (its builder and its stage table: output stride, D per
stage), registered by name in ``names.BACKBONES``. Weight files are found and checked by
captioner/models/weights.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from captioner.models.transform import IMAGENET_MEAN, IMAGENET_STD, TF_MEAN, TF_STD, ImageTransform
from captioner.models.weights import (
    EncoderWeightsError,
    efficientnet_lite_state_dict,
    hub_checkpoint,
    lite_wheel_file,
    load_weights_file,
)


class Block(nn.Sequential):
    """One fine-tuning unit made of several layers (a stem, a conv head): never split by finetune_blocks."""


class StagedBackbone(nn.Module):
    """Runs its stages in order; the output of the last one is the feature map (B, C, h, w)."""

    def __init__(self, stages: list[nn.Module]):
        super().__init__()
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class TimmFeatures(nn.Module):
    """A timm ``features_only`` model reduced to one feature map: the requested (last returned) stage."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[-1]


def _build_efficientnet_lite(name: str, pretrained: bool, weights_path: str | None, input_size: int,
                             allow_download: bool) -> tuple[list[nn.Module], ImageTransform, str]:
    """EfficientNet-Lite0/1/2 (the same seven block groups; Lite1/2 are deeper and wider inside them)."""
    import timm

    model = timm.create_model(f"tf_{name}", pretrained=False)
    source = "random"
    if pretrained or weights_path:
        path = Path(weights_path) if weights_path else lite_wheel_file(name)
        model.load_state_dict(efficientnet_lite_state_dict(name, str(path)))
        source = f"file {path.name}"
    b = model.blocks
    stages = [
        nn.Sequential(Block(model.conv_stem, model.bn1), b[0]),  # stride 2, 16
        b[1],  # stride 4, 24
        b[2],  # stride 8, 40
        nn.Sequential(b[3], b[4]),  # stride 16, 112 (Lite2: 120)
        nn.Sequential(b[5], b[6]),  # stride 32, 320 (Lite2: 352)
        nn.Sequential(Block(model.conv_head, model.bn2)),  # stride 32, 1280: what the classifier reads
    ]
    return stages, ImageTransform(input_size, TF_MEAN, TF_STD, "bicubic"), source


def _torchvision_state(name: str, pretrained: bool, weights_path: str | None,
                       allow_download: bool) -> tuple[dict | None, str]:
    """Resolve the weights before building anything, so a missing file fails in milliseconds."""
    import torchvision

    if weights_path:
        return load_weights_file(weights_path), f"file {Path(weights_path).name}"
    if pretrained:
        return hub_checkpoint(torchvision.models.get_model_weights(name), allow_download, name)
    return None, "random"


def _build_resnet(name: str, pretrained: bool, weights_path: str | None, input_size: int,
                  allow_download: bool) -> tuple[list[nn.Module], ImageTransform, str]:
    import torchvision

    state, source = _torchvision_state(name, pretrained, weights_path, allow_download)
    m = getattr(torchvision.models, name)(weights=None)
    if state is not None:
        m.load_state_dict(state)
    stages = [nn.Sequential(Block(m.conv1, m.bn1, m.relu, m.maxpool), m.layer1), m.layer2, m.layer3, m.layer4]
    return stages, ImageTransform(input_size, IMAGENET_MEAN, IMAGENET_STD, "bilinear"), source


_VGG_CONFIGS = {"vgg16": "D", "vgg19": "E"}  # torchvision's layer lists


def _build_vgg(name: str, pretrained: bool, weights_path: str | None, input_size: int,
               allow_download: bool) -> tuple[list[nn.Module], ImageTransform, str]:
    from torchvision.models import vgg

    state, source = _torchvision_state(name, pretrained, weights_path, allow_download)
    # only the conv layers: the 120M-parameter classifier would cost seconds to initialise and 0.5 GB to hold
    features = vgg.make_layers(vgg.cfgs[_VGG_CONFIGS[name]], batch_norm=False)
    if state is None:
        for m in features.modules():  # torchvision's own VGG initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
    else:
        feature_state = {k[len("features."):]: v for k, v in state.items() if k.startswith("features.")}
        features.load_state_dict(feature_state)
    layers = list(features)[:-1]  # drop the last max pool: conv5 at stride 16 (the paper's 14 x 14 x 512)
    stages, current = [], []
    for layer in layers:  # a new stage starts at every max pool (the pool belongs to the stage it feeds)
        if isinstance(layer, nn.MaxPool2d) and current:
            stages.append(nn.Sequential(*current))
            current = []
        current.append(layer)
    stages.append(nn.Sequential(*current))
    return stages, ImageTransform(input_size, IMAGENET_MEAN, IMAGENET_STD, "bilinear"), source


@dataclass(frozen=True)
class Backbone:
    """One named backbone (``model.encoder.name``, registered in ``names.BACKBONES``): its family's builder and its
    stage table, (output stride, D) per stage index, what build_encoder checks ``stage`` against and sizes the
    grid by."""

    build: Callable[..., tuple[list[nn.Module], ImageTransform, str]]
    stages: tuple[tuple[int, int], ...]


_LITE = ((2, 16), (4, 24), (8, 40), (16, 112), (32, 320), (32, 1280))
_RESNET = ((4, 256), (8, 512), (16, 1024), (32, 2048))
_VGG = ((1, 64), (2, 128), (4, 256), (8, 512), (16, 512))
EFFICIENTNET_LITE0 = Backbone(_build_efficientnet_lite, _LITE)
# trained at 240 and 260 px: set model.encoder.input_size to match (grids 8x8 and 9x9)
EFFICIENTNET_LITE1 = Backbone(_build_efficientnet_lite, _LITE)
EFFICIENTNET_LITE2 = Backbone(_build_efficientnet_lite, ((2, 16), (4, 24), (8, 48), (16, 120), (32, 352), (32, 1280)))
RESNET50 = Backbone(_build_resnet, _RESNET)
RESNET101 = Backbone(_build_resnet, _RESNET)
RESNET152 = Backbone(_build_resnet, _RESNET)
VGG16 = Backbone(_build_vgg, _VGG)
VGG19 = Backbone(_build_vgg, _VGG)


def build_timm(model_name: str, pretrained: bool, weights_path: str | None, input_size: int, stage: int | None,
                allow_download: bool) -> tuple[nn.Module, ImageTransform, str, int, int]:
    import timm

    if not timm.is_model(model_name):
        raise ValueError(f"unknown timm model {model_name!r} (see timm.list_models())")
    cfg = timm.models.get_pretrained_cfg(model_name)
    kwargs: dict[str, Any] = {"features_only": True}
    if stage is not None and stage >= 0:
        kwargs["out_indices"] = (stage,)
    source = "random"
    if weights_path:
        kwargs.update(pretrained=True, pretrained_cfg_overlay={"file": str(weights_path)})
        source = f"file {Path(weights_path).name}"
    elif pretrained:
        if not allow_download:
            hub = getattr(cfg, "hf_hub_id", None) or getattr(cfg, "url", None) or "the Hugging Face hub"
            raise EncoderWeightsError(
                f"timm:{model_name}: pretrained weights need the network (https://huggingface.co/{hub}). Download "
                f"model.safetensors there and pass weights_path=<file>, or allow_download=True, or pretrained=False.")
        kwargs["pretrained"] = True
        source = f"timm hub {getattr(cfg, 'hf_hub_id', model_name)}"
    try:
        model = timm.create_model(model_name, **kwargs)
    except (IndexError, AssertionError) as err:
        raise ValueError(f"timm:{model_name}: stage {stage} is not one of its feature stages ({err})") from err
    info = model.feature_info
    resolved = info.get_dicts()[-1]["index"] if stage is None or stage < 0 else stage
    dim = info.channels()[-1]
    mean = tuple(getattr(cfg, "mean", None) or IMAGENET_MEAN)
    std = tuple(getattr(cfg, "std", None) or IMAGENET_STD)
    interp = "bilinear" if getattr(cfg, "interpolation", "bicubic") == "bilinear" else "bicubic"
    return TimmFeatures(model), ImageTransform(input_size, mean, std, interp), source, resolved, dim
