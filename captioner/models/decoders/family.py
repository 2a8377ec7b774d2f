"""What a decoder family's config is: the ``model.decoder`` section, one dataclass per family (torch-free).

Each family (a kind of ``DECODERS`` in this package's ``__init__``) owns a dataclass derived from
``DecoderFamilyConfig``, in a torch-free module beside its class (``show_attend_tell_config.py``,
``transformer_config.py``), which names that class once (``IMPLEMENTATION``, ``"module:Class"``, imported when
``registry.build_decoder`` builds it; captioner/registration.py). The dataclass holds the
family's fields (their names are its constructor's arguments) and says which ``model.attention`` keys it also
reads (``ATTENTION_KEYS``), which values it accepts (``CHOICES``, ``POSITIVE``, ``UNIT_INTERVAL``, checked by
``config.validate`` with the config's own tables, and ``check`` for the rest) and what it passes its class
(``arguments``).
``captioner/config.py`` picks the dataclass by ``model.decoder.kind`` when it reads a config, so a key another
family owns is an unknown key, named with the keys this family has.

Errors are ValueErrors whose message starts with the key path (``model.decoder.layers: ...``); the config wraps
them as ConfigErrors, and the classes raise the same ones when built from Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from captioner.names import check_heads


@dataclass
class DecoderFamilyConfig:
    """The ``model.decoder`` section of one decoder family. Subclasses set ``kind``'s default to their key,
    their fields, and the class-level tables below; ``check`` adds what the tables cannot say."""

    kind: str = ""
    # the CaptionDecoder it configures, "module:Class" (registration.build)
    IMPLEMENTATION: ClassVar[str] = ""
    # the model.attention keys this family's constructor also takes (config.unread_keys refuses the others)
    ATTENTION_KEYS: ClassVar[tuple[str, ...]] = ()
    # the allowed values and ranges of its fields, which config.validate checks with the config's own tables
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}  # field -> allowed values
    POSITIVE: ClassVar[tuple[str, ...]] = ()  # fields that must be > 0
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ()  # fields in [0, 1]
    # each word's alpha is the distribution its context was read from (what train.objective.grounding_weight
    # supervises); False where the per-word map is only a summary of other reads (a Transformer layer's heads)
    WORD_ALPHA: ClassVar[bool] = True
    # it reads its input words one step at a time, so scheduled sampling can feed it its own samples
    # (train.objective.scheduled_sampling_start)
    SCHEDULED_SAMPLING: ClassVar[bool] = False

    def check(self, attention: Any) -> None:
        """ValueError, naming the key path, for a combination this family cannot build that the tables above
        cannot say (``attention``: the model.attention section, for the keys it reads). Called by
        config.validate after the tables' checks. Here: a family that reads the grid through model.attention's
        read (its ``heads`` among ``ATTENTION_KEYS``) splits attention_dim over the multi-head read's heads."""
        if "attention" in self.ATTENTION_KEYS and attention.attention == "multi_head":
            check_heads(attention.attention_dim, attention.heads)

    def compile_refusal(self, attention: Any) -> str:
        """Why ``train.compile`` would not run for this decoder reading as ``attention`` says ('' where it does):
        only a family with a compiled step (show_attend_tell_compiled.py) says ''."""
        return f"the {self.kind} decoder has no compiled step"

    def arguments(self, attention: Any) -> dict[str, Any]:
        """The constructor arguments this section and ``attention`` give (the sizes the vocabulary and the
        encoder fix, vocab_size, feature_dim and pad_id, are the builder's)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "kind"}
        return {**{key: getattr(attention, key) for key in self.ATTENTION_KEYS}, **own}
