"""The preprocessing that travels with an encoder's weights (captioner/models/encoder.py): resize, normalise."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TF_MEAN = TF_STD = (0.5, 0.5, 0.5)  # TF-ported EfficientNet-Lite weights expect inputs in [-1, 1]


class ImageTransform:
    """Preprocessing that travels with the encoder: resize to ``size`` x ``size``, normalise.

    By default the whole image is resized to a square (no crop), as captioning ports do: a
    caption describes the whole scene, and a centre crop cuts off what the references mention
    (on scikit-image's chelsea, cropping drops p(Egyptian cat) from 0.79 to 0.38).
    ``crop=True`` resizes the shorter side and centre-crops instead (the ImageNet recipe).
    PIL RGB image -> float tensor (3, size, size). A plain class (not a lambda) so DataLoader
    workers can pickle it.
    """

    def __init__(self, size: int, mean: tuple[float, ...], std: tuple[float, ...], interpolation: str = "bicubic",
                 crop: bool = False):
        self.size = int(size)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.interpolation = interpolation
        self.crop = crop

    def __call__(self, image: Image.Image) -> torch.Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as TF

        mode = {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR}[self.interpolation]
        if self.crop:
            image = TF.resize(image, self.size, interpolation=mode, antialias=True)
            image = TF.center_crop(image, [self.size, self.size])
        else:
            image = TF.resize(image, [self.size, self.size], interpolation=mode, antialias=True)
        # (x / 255 - mean) / std as one numpy multiply-add: small torch ops pay multi-thread start-up per call,
        # which made this 20x slower than the arithmetic on a busy 2-core machine
        scale = np.array([1.0 / (255.0 * s) for s in self.std], dtype=np.float32)
        bias = np.array([-m / s for m, s in zip(self.mean, self.std)], dtype=np.float32)
        x = np.asarray(image, dtype=np.float32) * scale + bias  # (S, S, 3)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))  # (3, S, S)

    def describe(self) -> dict:
        resize = {"resize_shorter": self.size, "center_crop": self.size} if self.crop else {"resize": self.size}
        return {**resize, "interpolation": self.interpolation, "mean": list(self.mean), "std": list(self.std)}

    def __repr__(self) -> str:
        return f"ImageTransform({self.describe()})"
