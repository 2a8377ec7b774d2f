"""How to decode, in one frozen object: ``DecodeOptions``.

Every decode reads one: ``captioner caption`` / ``evaluate`` / ``serve``, ``api`` (``ImageCaptioner.caption``),
``evaluate_model``, training's validation and SCST's greedy baseline, the demo, and the searches
(``Captioner.generate``). It is built once, from the model's config (``from_config``: its ``eval`` section) and
then the caller's own settings (``replace_given``: the flags a command was given, merged there, once), and
validated once, here. Each setting has one default, below, and only here: the searches (decoding/search.py) read
them from the options they are given, and the config's ``eval`` section defaults to these. A model remembers its
config's as ``model.decode_options``. A caption a person reads never shows <unk> unless asked: ``for_people``.

``attention_mode`` speaks one vocabulary, ``DECODING_MODES``: "expectation" (the soft read, the only one a soft
model makes unless asked), "argmax" or "sample" (one grid cell per word: hard attention, or a soft model whose
attention can). Whether a given model can read that way is its own check (``Captioner.check_decode_options``),
made where options meet a model: ``Captioner.generate``, ``create_app`` (at start, not at the first upload) and
SCST's greedy baseline (which samples rather than searches); never per step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from captioner.names import DECODING_MODES


class DecodeOptionError(ValueError):
    """A decoding setting out of range; ``setting`` names it (a command maps it to its flag)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"decoding: {setting} {message}")
        self.setting, self.detail = setting, message


@dataclass(frozen=True)
class DecodeOptions:
    """beam: beam width (1 = greedy). n_best: hypotheses kept per image (<= beam). attention_mode: one of
    DECODING_MODES. max_length: most words per caption. length_penalty: beam ranking score / length ** P.
    block_trigrams: never repeat a trigram within a caption. forbid_unk: never choose <unk> (for captions a
    person reads; off where scores must match training's). beam_groups, diversity: diverse beam search
    (Vijayakumar et al. 2018; decoding/diverse.py): the beams choose in beam_groups groups, each penalised by
    diversity (lambda) for every beam of an earlier group that chose the same word at that step; 1 and 0: plain
    beam search."""

    beam: int = 3  # the width of every decode not told otherwise
    n_best: int = 1
    attention_mode: str = "expectation"
    max_length: int = 20
    length_penalty: float = 1.0
    block_trigrams: bool = False
    forbid_unk: bool = False
    beam_groups: int = 1
    diversity: float = 0.0

    def __post_init__(self) -> None:
        for name in ("beam", "n_best", "max_length", "beam_groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DecodeOptionError(name, f"must be an integer >= 1, got {value!r}")
        if self.n_best > self.beam:
            raise DecodeOptionError("n_best", f"must be <= beam ({self.beam}), got {self.n_best}")
        if self.attention_mode not in DECODING_MODES:
            raise DecodeOptionError("attention_mode", f"must be one of {', '.join(DECODING_MODES)}, "
                                    f"got {self.attention_mode!r}")
        penalty = self.length_penalty
        if (isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty)
                or penalty < 0):
            raise DecodeOptionError("length_penalty", f"must be a finite number >= 0, got {penalty!r}")
        for name in ("block_trigrams", "forbid_unk"):
            if not isinstance(getattr(self, name), bool):
                raise DecodeOptionError(name, f"must be true or false, got {getattr(self, name)!r}")
        self._check_diverse()

    def _check_diverse(self) -> None:
        """Diverse beam search's two settings go together: groups that split the beam evenly, and a positive
        diversity exactly when there is more than one group (else a setting would be ignored, or the groups
        would search alike)."""
        lam, groups = self.diversity, self.beam_groups
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam < 0:
            raise DecodeOptionError("diversity", f"must be a finite number >= 0, got {lam!r}")
        if self.beam % groups:
            raise DecodeOptionError("beam_groups", f"must divide beam ({self.beam}) evenly, got {groups}")
        if groups > 1 and lam == 0:
            raise DecodeOptionError("diversity", f"must be > 0 with beam_groups {groups}: without it the groups "
                                    "search alike")
        if groups == 1 and lam > 0:
            raise DecodeOptionError("diversity", f"{lam} needs beam_groups > 1 (it penalises a group for the words "
                                    "of the groups before it); plain beam search would ignore it")

    @classmethod
    def from_config(cls, cfg: Any) -> "DecodeOptions":
        """A config's decoding (its ``eval`` section; ``eval.max_length`` 0 = the longest training caption,
        ``data.max_length``)."""
        ev = cfg.eval
        return cls(beam=ev.beam_size, attention_mode=ev.attention_mode,
                   max_length=ev.max_length or cfg.data.max_length, length_penalty=float(ev.length_penalty),
                   block_trigrams=ev.block_trigrams, beam_groups=ev.beam_groups, diversity=float(ev.diversity))

    def for_people(self) -> "DecodeOptions":
        """These options as a caption a person reads is decoded: <unk> never chosen. ``captioner caption`` and
        ``serve`` (unless ``--allow-unk``), ``ImageCaptioner.caption`` and the demo page start from these; scores
        that must match training's (``evaluate``, validation) do not. Every other setting (and the options'
        type: an ensemble's ``UnchosenRead`` stays one) is kept."""
        return dataclasses.replace(self, forbid_unk=True)

    def replace_given(self, **settings: Any) -> "DecodeOptions":
        """These options with every setting that was given (not None) replaced: a command's flags over the
        model's config. A beam narrower than n_best brings n_best down with it unless n_best was given too."""
        given = {k: v for k, v in settings.items() if v is not None}
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"DecodeOptions has no setting {', '.join(unknown)}")
        if "beam" in given and "n_best" not in given:
            given["n_best"] = min(self.n_best, given["beam"])
        return dataclasses.replace(self, **given)
