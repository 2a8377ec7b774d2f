"""``build_decoder``: the decoder a ``model.decoder`` section names (its ``IMPLEMENTATION``, registered in this
package's ``DECODERS``), what ``api.build_model`` builds. A fast path subclasses its family's plain implementation
(FastShowAttendTellDecoder is a ShowAttendTellDecoder with the same weights), which the reference switch,
captioner/fast, makes it run."""
from __future__ import annotations

from typing import Any

from captioner.models.decoders import DECODERS
from captioner.models.decoders.contract import CaptionDecoder
from captioner.models.decoders.family import DecoderFamilyConfig
from captioner.registration import build


def build_decoder(config: DecoderFamilyConfig, attention: Any, *, vocab_size: int, feature_dim: int,
                  pad_id: int = 0) -> CaptionDecoder:
    """The decoder of ``config.kind`` built from its section (``config``: the family's dataclass) and the
    ``model.attention`` keys it reads (``attention``), at the vocabulary's and the encoder's sizes."""
    family = DECODERS.section(config.kind)  # an unknown kind names the valid ones
    if not isinstance(config, family):
        raise ValueError(f"model.decoder.kind is {config.kind!r}, but the section is a {type(config).__name__}, "
                         f"not the {family.__name__} registered for it")
    return build(config, of=CaptionDecoder, vocab_size=vocab_size, feature_dim=feature_dim, pad_id=pad_id,
                 **config.arguments(attention))
