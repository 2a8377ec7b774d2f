"""``model.decoder`` for ``kind: updown``: the config of the Up-Down decoder (updown.py), torch-free so that the
config reads it without the models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from captioner.models.decoders.family import DecoderFamilyConfig


@dataclass
class UpDownConfig(DecoderFamilyConfig):
    """Anderson et al. (CVPR 2018)'s top-down decoder over the grid: an attention LSTM and a language LSTM. It
    reads all of ``model.attention`` (the scorer, soft or hard and the other reads, heads, attention_dim), as
    the Show-Attend-Tell decoder does."""

    kind: str = "updown"
    IMPLEMENTATION: ClassVar[str] = "captioner.models.decoders.updown_fast:FastUpDownDecoder"
    embed_dim: int = 512  # the word embedding W_e
    hidden_dim: int = 512  # each LSTM's size
    dropout: float = 0.5  # on the language LSTM's output before the output layer
    feature_dropout: float = 0.0  # on the annotation vectors while training

    ATTENTION_KEYS: ClassVar[tuple[str, ...]] = ("attention_dim", "scorer", "attention", "heads")
    SCHEDULED_SAMPLING: ClassVar[bool] = True
    POSITIVE: ClassVar[tuple[str, ...]] = ("embed_dim", "hidden_dim")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("dropout", "feature_dropout")
