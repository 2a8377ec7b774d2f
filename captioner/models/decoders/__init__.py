"""Caption decoders: the contract every decoder meets, and the registered families.

    contract.py               CaptionDecoder (what search, SCST, the losses and the overlays use), DecoderOutput,
                              SampleOutput, caption_mask, SampleDraws
    show_attend_tell.py       ShowAttendTellDecoder: Xu et al. 2015's LSTM decoder, Eq. (1)-(7), plain PyTorch (the
                              reference)
    show_attend_tell_fast.py  FastShowAttendTellDecoder: its fast path (same state_dict), what "lstm" builds
    inference_cache.py        weights restacked for decoding steps, invalidated by weight changes and optimizer steps
    transformer.py            TransformerDecoder: masked self-attention over words, cross-attention over the grid

``DECODERS`` maps ``model.decoder.kind`` to the class ``api.build_model`` builds; ``REFERENCES`` to the plain
implementation each is checked against (the reference switch, captioner/fast_paths.py, makes the fast ones run it).
"""
from __future__ import annotations

import inspect

from captioner.models.decoders.contract import CaptionDecoder, DecoderOutput, SampleDraws, SampleOutput, caption_mask
from captioner.models.decoders.show_attend_tell import GATES, ShowAttendTellDecoder
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder, ProjectedState
from captioner.models.decoders.transformer import TransformerDecoder

DECODERS: dict[str, type[CaptionDecoder]] = {
    "lstm": FastShowAttendTellDecoder,
    "transformer": TransformerDecoder,
}
REFERENCES: dict[str, type[CaptionDecoder]] = {
    "lstm": ShowAttendTellDecoder,
    "transformer": TransformerDecoder,  # plain PyTorch already
}


def _check_kind(kind: str) -> None:
    if kind not in DECODERS:
        raise ValueError(f"unknown decoder {kind!r}; valid decoders: {', '.join(DECODERS)}")


def decoder_arguments(kind: str) -> tuple[str, ...]:
    """The constructor arguments of decoder ``kind`` (config field names equal them: api.build_model)."""
    _check_kind(kind)
    return tuple(inspect.signature(DECODERS[kind]).parameters)


def build_decoder(kind: str, **kwargs) -> CaptionDecoder:
    """The decoder ``kind`` (a key of DECODERS) built with ``kwargs``."""
    _check_kind(kind)
    return DECODERS[kind](**kwargs)


__all__ = ["CaptionDecoder", "DECODERS", "DecoderOutput", "FastShowAttendTellDecoder", "GATES", "ProjectedState",
           "REFERENCES", "SampleDraws", "SampleOutput", "ShowAttendTellDecoder", "TransformerDecoder",
           "build_decoder", "caption_mask", "decoder_arguments"]
