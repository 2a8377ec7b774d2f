"""Caption decoders: the contract every decoder meets, and the registered families.

    contract.py                  CaptionDecoder (what search, SCST, the losses and the overlays use), DecoderOutput,
                                 SampleOutput, caption_mask, SampleDraws, SortedBatch (the fast forwards' order)
    family.py                    DecoderFamilyConfig: what a family's config is (torch-free)
    show_attend_tell.py          ShowAttendTellDecoder: Xu et al. 2015's LSTM decoder, Eq. (1)-(7), plain PyTorch
                                 (the reference)
    show_attend_tell_fast.py     FastShowAttendTellDecoder: its fast path (same state_dict), what "lstm" builds;
                                 its building blocks (deferred gradients, inference caches, C kernels) are
                                 captioner/fast's
    show_attend_tell_compiled.py StaticSteps: its step compiled by torch.compile over static shapes (train.compile)
    show_attend_tell_config.py   ShowAttendTellConfig: model.decoder for kind lstm (torch-free)
    transformer.py               TransformerDecoder: masked self-attention over words, cross-attention over the grid
    transformer_config.py        TransformerConfig: model.decoder for kind transformer (torch-free)
    updown.py                    UpDownDecoder: Anderson et al. 2018's attention LSTM and language LSTM over the grid
                                 (the reference)
    updown_fast.py               FastUpDownDecoder: its fast path (same state_dict), what "updown" builds
    updown_config.py             UpDownConfig: model.decoder for kind updown (torch-free)
    registry.py                  build_decoder: the class a section names, built at the vocabulary's and grid's sizes

This package's own module is torch-free: ``DECODERS`` maps ``model.decoder.kind`` to the family's config
dataclass, which ``captioner/config.py`` reads without importing torch or the models, and each dataclass names
its class once (``IMPLEMENTATION``, captioner/registration.py). Adding a family: its class, its config module,
and one line in ``DECODERS``; tests/test_decoder_contract.py then checks it with the others.
"""
from __future__ import annotations

from captioner.models.decoders.family import DecoderFamilyConfig
from captioner.models.decoders.show_attend_tell_config import ShowAttendTellConfig
from captioner.models.decoders.transformer_config import TransformerConfig
from captioner.models.decoders.updown_config import UpDownConfig
from captioner.registration import Family

# model.decoder.kind -> its section: the one registration of each decoder family
DECODERS: Family[DecoderFamilyConfig] = Family("model.decoder", "lstm", {
    "lstm": ShowAttendTellConfig,
    "transformer": TransformerConfig,
    "updown": UpDownConfig,
})

__all__ = ["DECODERS", "DecoderFamilyConfig", "ShowAttendTellConfig", "TransformerConfig", "UpDownConfig"]
