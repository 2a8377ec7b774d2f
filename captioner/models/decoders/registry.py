"""The decoder classes by ``model.decoder.kind``: ``DECODERS``, what ``api.build_model`` builds. A fast path
subclasses its family's plain implementation (FastShowAttendTellDecoder is a ShowAttendTellDecoder with the same
weights), which the reference switch, captioner/fast, makes it run. Each class names its config dataclass as
``config_class``; the kinds and the dataclasses are this package's ``DECODER_CONFIGS`` (torch-free), which a test
holds equal to these."""
from __future__ import annotations

from typing import Any

from captioner.models.decoders import family_config
from captioner.models.decoders.contract import CaptionDecoder
from captioner.models.decoders.family import DecoderFamilyConfig
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.models.decoders.transformer import TransformerDecoder

DECODERS: dict[str, type[CaptionDecoder]] = {
    "lstm": FastShowAttendTellDecoder,
    "transformer": TransformerDecoder,
}


def build_decoder(config: DecoderFamilyConfig, attention: Any, *, vocab_size: int, feature_dim: int,
                  pad_id: int = 0) -> CaptionDecoder:
    """The decoder of ``config.kind`` built from its section (``config``: the family's dataclass) and the
    ``model.attention`` keys it reads (``attention``), at the vocabulary's and the encoder's sizes."""
    family_config(config.kind)  # an unknown kind names the valid ones
    cls = DECODERS[config.kind]
    if not isinstance(config, cls.config_class):
        raise ValueError(f"model.decoder.kind is {config.kind!r}, but the section is a {type(config).__name__}, "
                         f"not the {cls.config_class.__name__} that {cls.__name__} reads")
    return cls(vocab_size=vocab_size, feature_dim=feature_dim, pad_id=pad_id, **config.arguments(attention))
