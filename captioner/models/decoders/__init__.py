"""Caption decoders: the contract every decoder meets, and the registered families.

    contract.py                  CaptionDecoder (what search, SCST, the losses and the overlays use), DecoderOutput,
                                 SampleOutput, caption_mask, SampleDraws
    family.py                    DecoderFamilyConfig: what a family's config is (torch-free)
    show_attend_tell.py          ShowAttendTellDecoder: Xu et al. 2015's LSTM decoder, Eq. (1)-(7), plain PyTorch
                                 (the reference)
    show_attend_tell_fast.py     FastShowAttendTellDecoder: its fast path (same state_dict), what "lstm" builds;
                                 its building blocks (deferred gradients, inference caches, C kernels) are
                                 captioner/fast's
    show_attend_tell_config.py   ShowAttendTellConfig: model.decoder for kind lstm (torch-free)
    transformer.py               TransformerDecoder: masked self-attention over words, cross-attention over the grid
    transformer_config.py        TransformerConfig: model.decoder for kind transformer (torch-free)
    registry.py                  DECODERS (kind -> class), build_decoder

This package's own module is torch-free: ``DECODER_CONFIGS`` maps ``model.decoder.kind`` to the family's config
dataclass, which ``captioner/config.py`` reads without importing torch or the models. ``registry.DECODERS`` maps
the same kinds to the classes ``api.build_model`` builds, each naming its dataclass as ``config_class`` (a test
holds the two registries equal). Adding a family: its class, its config module, and an entry in each.
"""
from __future__ import annotations

from typing import Any

from captioner.models.decoders.family import DecoderFamilyConfig
from captioner.models.decoders.show_attend_tell_config import ShowAttendTellConfig
from captioner.models.decoders.transformer_config import TransformerConfig

DECODER_CONFIGS: dict[str, type[DecoderFamilyConfig]] = {
    "lstm": ShowAttendTellConfig,
    "transformer": TransformerConfig,
}
DEFAULT_DECODER = "lstm"


def family_config(kind: Any) -> type[DecoderFamilyConfig]:
    """The config dataclass of decoder ``kind`` (ValueError naming the valid kinds, for any other value)."""
    if not isinstance(kind, str) or kind not in DECODER_CONFIGS:
        raise ValueError(f"model.decoder.kind: {kind!r} is not one of {', '.join(DECODER_CONFIGS)}")
    return DECODER_CONFIGS[kind]


__all__ = ["DECODER_CONFIGS", "DEFAULT_DECODER", "DecoderFamilyConfig", "ShowAttendTellConfig", "TransformerConfig",
           "family_config"]
