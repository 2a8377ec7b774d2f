"""``model.decoder`` for ``kind: lstm``: the config of Show-Attend-Tell's LSTM decoder (show_attend_tell.py and
its fast path), torch-free so that the config reads it without the models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from captioner.models.decoders.family import DecoderFamilyConfig

# The beta gate of Sec. 4.2.1: one scalar per step (the paper), one per context channel, or none
GATES = ("scalar", "vector", "none")
# What the decoder reads beside the attended context at every step (show_attend_tell.py, "the scene"): nothing (the
# paper), or the whole grid's mean, so that a sharp map does not starve the LSTM of the rest of the photo
SCENES = ("none", "mean")
# the reads whose memory holds one value vector per cell, which the scene can sit beside (not the multi-head read's)
SCENE_READS = ("soft", "hard", "key_value")


@dataclass
class ShowAttendTellConfig(DecoderFamilyConfig):
    """Xu et al. 2015's attention LSTM decoder. It reads all of ``model.attention``: the scorer, the attention
    (soft, hard, key_value, multi_head), its heads and attention_dim."""

    kind: str = "lstm"
    # its fast path, a ShowAttendTellDecoder with the same weights (the reference switch runs the plain one)
    IMPLEMENTATION: ClassVar[str] = "captioner.models.decoders.show_attend_tell_fast:FastShowAttendTellDecoder"
    embed_dim: int = 512  # the word embedding E, also the deep output's size (Eq. 7)
    hidden_dim: int = 512  # the LSTM's size
    gate: str = "scalar"  # scalar (the paper's beta_t) | vector (per channel) | none
    dropout: float = 0.5  # on the deep output before L_o
    feature_dropout: float = 0.0  # on the annotation vectors while training (not in the paper)
    scene: str = "none"  # none (the paper) | mean: the grid's mean beside the attended context at every step
    sentinel: bool = False  # a learned non-visual slot beside the cells (Lu et al. 2017): soft reads only

    ATTENTION_KEYS: ClassVar[tuple[str, ...]] = ("attention_dim", "scorer", "attention", "heads")
    SCHEDULED_SAMPLING: ClassVar[bool] = True
    POSITIVE: ClassVar[tuple[str, ...]] = ("embed_dim", "hidden_dim")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("dropout", "feature_dropout")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"gate": GATES, "scene": SCENES}

    def check(self, attention: Any) -> None:
        super().check(attention)
        if self.scene != "none" and attention.attention not in SCENE_READS:
            raise ValueError(f"model.decoder.scene: {self.scene!r} sits beside a read of one value vector per cell "
                             f"({', '.join(SCENE_READS)}), not model.attention.attention {attention.attention!r}")
        if self.sentinel and attention.attention != "soft":
            raise ValueError(f"model.decoder.sentinel: the sentinel is a slot of the soft read's distribution, not of "
                             f"model.attention.attention {attention.attention!r}")
        if self.sentinel and self.scene != "none":
            raise ValueError("model.decoder.sentinel: not with model.decoder.scene (the sentinel's value has no scene "
                             "half); choose one")

    def compile_refusal(self, attention: Any) -> str:
        """Its compiled step (show_attend_tell_compiled.py) reads softly: hard attention's sampled reads stay eager."""
        if attention.attention == "hard":
            return "hard attention samples where it reads; only soft reads are compiled"
        if self.sentinel:
            return "the sentinel's read has no compiled step"
        return ""
