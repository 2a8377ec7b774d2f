"""``model.decoder`` for ``kind: transformer``: the config of the Transformer decoder (transformer.py),
torch-free so that the config reads it without the models. Its checks are the class's own (the class calls
``check_width`` and ``check_overlay_layer`` too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from captioner.models.decoders.family import DecoderFamilyConfig
from captioner.names import check_heads


def check_width(embed_dim: int, heads: int) -> None:
    """The model width splits evenly over the heads."""
    check_heads(embed_dim, heads, "model.decoder.embed_dim")


def check_overlay_layer(overlay_layer: int, layers: int) -> None:
    """The overlays show a layer that exists (-1: the last)."""
    if not -layers <= overlay_layer < layers:
        raise ValueError(f"model.decoder.overlay_layer: {overlay_layer} is not a layer of model.decoder.layers "
                         f"({layers}): 0..{layers - 1}, or -1 for the last")


@dataclass
class TransformerConfig(DecoderFamilyConfig):
    """A pre-norm Transformer decoder over the grid. Of ``model.attention`` it reads only ``heads``."""

    kind: str = "transformer"
    IMPLEMENTATION: ClassVar[str] = "captioner.models.decoders.transformer:TransformerDecoder"
    embed_dim: int = 512  # the model width d (word embeddings, attention, residual stream)
    hidden_dim: int = 512  # the feed-forward width
    layers: int = 2  # decoder layers
    dropout: float = 0.5  # on the embeddings and each sublayer's output
    feature_dropout: float = 0.0  # on the annotation vectors while training
    overlay_layer: int = -1  # the layer whose cross-attention the overlays show (-1: the last)

    ATTENTION_KEYS: ClassVar[tuple[str, ...]] = ("heads",)
    # its per-word map is one layer's cross-attention averaged over heads, not the read that made the word
    WORD_ALPHA: ClassVar[bool] = False
    POSITIVE: ClassVar[tuple[str, ...]] = ("embed_dim", "hidden_dim", "layers")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("dropout", "feature_dropout")

    def check(self, attention: Any) -> None:
        check_overlay_layer(self.overlay_layer, self.layers)
        check_width(self.embed_dim, attention.heads)
