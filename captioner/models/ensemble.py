"""Several captioners decoded as one: an ensemble at decode time.

At each step of the search every member reads the same words so far and the ensemble scores word w with the
mean of the members' log-probabilities,

    log p(w | w_<t, a) := (1/M) sum_m log p_m(w | w_<t, a)        (M members)

(the log of the geometric mean of their distributions, not renormalised: its probabilities sum to at most one,
so every log-probability stays <= 0, which the beam search's early stop relies on; search.py). Xu et al.
2015's Eq. (7) gives each p_m; the beam search of §5.2 runs over the mean unchanged.

The members share what the feature cache stores: equal cache fingerprints (the frozen backbone's weights, stage,
grid, input size, preprocessing, and for fine-tuned encoders the split point; models/encoder.py), so the image
is encoded once up to there and each member then runs its own fine-tuned top blocks (if any), projection and
grid refinement (``Captioner.prepare_rows``) on those rows. Snapshots of one fine-tuning run can so decode
together. They also share the vocabulary's size and special ids; that the ids mean the same words is the
application's check (``api.load_ensemble``, which knows the vocabularies and names the files). The overlays
show one map per word: the first member's alpha_t, or the mean of the members' alphas (``ATTENTION_SHOWN``).

How the members read, one rule whatever their order. Every member reads the same way at every step. When no
attention mode is chosen, that is the way each member reads on its own (its config's ``eval.attention_mode``),
which must then be the same for all: members that read differently on their own (a soft model's "expectation"
beside a hard model's "argmax", or "argmax" beside "sample") are refused until a mode is given
(``--attention-mode``; ``MixedReads``), and then every member reads that way (a soft member reads one cell only
when its attention module can, else it is refused by name: ``check_decode_options``). In the one-cell modes
each member reads its own cell; the cells the ensemble reports per word (``Hypothesis.locations``: the cells,
movement and mirror figures) follow the map it shows (``CELLS_SHOWN``): the first member's read cells, or the
arg-max of the mean alpha (a cell no member need have read).

A pure module like the members: it knows neither the config nor the vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from captioner.decoding.options import DecodeOptionError, DecodeOptions
from captioner.models.captioner import Captioner
from captioner.names import ENSEMBLE_ATTENTIONS  # named below the command line, which offers them

State = Any  # a tuple with one decoder state per member (search.State)

# The attention map an ensemble reports per word (overlays, grounding): from the members' alphas, each (N, L).
ATTENTION_SHOWN: dict[str, Callable[[list[Tensor]], Tensor]] = {
    "first": lambda alphas: alphas[0],
    "mean": lambda alphas: torch.stack(alphas).mean(dim=0),  # (M, N, L) -> (N, L); still sums to one
}


# The same choice in words, for outputs and overlays.
ATTENTION_SHOWN_WORDS = {"first": "the first model's attention", "mean": "the mean of the models' attention"}

# The cell an ensemble reports per word in the one-cell modes, from the map shown (N, L) and the members' read
# cells, each (N,): the one the map shown is about.
CELLS_SHOWN: dict[str, Callable[[Tensor, list[Tensor]], Tensor]] = {
    "first": lambda alpha, cells: cells[0],
    "mean": lambda alpha, cells: alpha.argmax(dim=-1),  # the mean map's peak: no member need have read it
}


def cells_shown_words(attention: str, first: str) -> str:
    """Whose cells an ensemble's one-cell figures are, in words (``first``: how the first member is named)."""
    return {"first": f"read by the first model ({first})",
            "mean": "at the arg-max of the mean of the models' attention"}[attention]


def describe_ensemble(members: Sequence[str], attention: str, cells: str | None = None) -> str:
    """One line for outputs: which models (``members``: their names or files), which attention the maps show and,
    given, whose cells the one-cell figures are (``cells``, ``cells_shown_words``)."""
    line = f"an ensemble of {len(members)} models ({', '.join(members)}) showing {ATTENTION_SHOWN_WORDS[attention]}"
    return line + (f"; one-cell reads report the cells {cells}" if cells else "")


def check_attention_shown(attention: str) -> None:
    if attention not in ATTENTION_SHOWN:
        raise ValueError(f"unknown ensemble attention {attention!r}; valid: {', '.join(ENSEMBLE_ATTENTIONS)}")


class MixedReads(DecodeOptionError):
    """The members read differently on their own and no attention mode was chosen (the module docstring)."""

    def __init__(self, reads: Sequence[tuple[str, str]]) -> None:
        listed = "; ".join(f"{name}: {mode}" for name, mode in reads)
        super().__init__("attention_mode", f"must be given: the ensemble's models read differently on their own "
                                           f"({listed}), and an ensemble reads one way (every model reads with "
                                           f"the mode given: expectation, argmax or sample)")


@dataclass(frozen=True)
class UnchosenRead(DecodeOptions):
    """An ensemble's own decoding options while its members read differently on their own (``reads``: each
    member's name and eval.attention_mode): every setting but the read is the first member's, and the read must
    be chosen. ``replace_given`` with an ``attention_mode`` gives plain DecodeOptions reading that way; without
    one it raises ``MixedReads`` (a command's ``--attention-mode`` error), as decoding with these does."""

    reads: tuple[tuple[str, str], ...] = ()

    def replace_given(self, **settings: Any) -> DecodeOptions:
        if settings.get("attention_mode") is None:
            raise MixedReads(self.reads)
        chosen = super().replace_given(**settings)
        return DecodeOptions(**{f.name: getattr(chosen, f.name) for f in dataclasses.fields(DecodeOptions)})


def ensemble_options(members: Sequence[Captioner], names: Sequence[str]) -> DecodeOptions:
    """An ensemble's own decoding options: the first member's, reading as every member reads on its own, or
    ``UnchosenRead`` when they read differently."""
    first = members[0].decode_options
    reads = tuple((name, m.decode_options.attention_mode) for name, m in zip(names, members))
    if all(mode == first.attention_mode for _, mode in reads):
        return first
    return UnchosenRead(**{f.name: getattr(first, f.name) for f in dataclasses.fields(DecodeOptions)}, reads=reads)


def member_mismatch(first: Captioner, other: Captioner) -> str | None:
    """Why ``other`` cannot decode beside ``first`` in an ensemble, or None when it can: a different backbone
    (the encoder's cache fingerprint: frozen weights, stage, grid, input size, preprocessing, split point),
    vocabulary size or special ids."""
    a, b = first.encoder.cache_fingerprint(), other.encoder.cache_fingerprint()
    differ = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    if differ:
        shown = "; ".join(f"{key} {b.get(key)!r}, the first member's {a.get(key)!r}" for key in differ)
        return (f"its encoder differs from the first member's ({shown}); an ensemble encodes each image once, "
                f"so its members need the same frozen backbone up to what the feature cache stores")
    if other.decoder.vocab_size != first.decoder.vocab_size:
        return f"its vocabulary has {other.decoder.vocab_size} words, the first member's {first.decoder.vocab_size}"
    ids, first_ids = _special_ids(other), _special_ids(first)
    if ids != first_ids:
        return f"its special token ids {ids} differ from the first member's {first_ids}"
    return None


def _special_ids(model: Captioner) -> dict[str, int]:
    return {"start": model.start_id, "end": model.end_id, "pad": model.pad_id, "unk": model.unk_id}


class EnsembleSteps(nn.Module):
    """The decoding half of the decoder contract (models/decoders/contract.py) over several captioners:
    ``init_state``, ``expand_state`` and ``step_with_location``, what ``Captioner.generate`` drives. Its
    state is a tuple of the members' states; ``init_state`` takes the shared cached rows and prepares each
    member's own. It does not train (no ``forward``, no ``sample``): train the members.

    Args:
        members: the captioners, compatible (``member_mismatch``).
        attention: a key of ATTENTION_SHOWN, the map reported per word.
    """

    def __init__(self, members: Sequence[Captioner], attention: str = "first") -> None:
        super().__init__()
        check_attention_shown(attention)
        self.members = nn.ModuleList(members)
        self.attention = attention
        first = members[0].decoder
        self.vocab_size, self.pad_id, self.attention_kind = first.vocab_size, first.pad_id, first.attention_kind

    def forward(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an ensemble only decodes; train (or teacher-force) its members one by one")

    @property
    def static_rows(self) -> bool:
        """Whether a member's decoding step wants the same rows at every step (contract.py): then all get them."""
        return any(m.decoder.static_rows for m in self.members)

    def init_state(self, grid: Tensor) -> State:
        """Cached rows (B, l, C) -> one state per member, each from its own prepared grid (B, L, D_m)."""
        return tuple(m.decoder.init_state(m.prepare_rows(grid)) for m in self.members)

    def expand_state(self, state: State, beams: int) -> State:
        """Each member expands its own state (per-image tensors may stay at B rows: search's ``expand``)."""
        return tuple(m.decoder.expand_state(s, beams) for m, s in zip(self.members, state))

    def step_with_location(self, tokens: Tensor, state: State, attention_mode: str = "expectation",
                           dense: bool = True) -> tuple[Tensor, Tensor, Tensor | None, State]:
        """One word for N rows, every member reading with ``attention_mode``: (the mean of the members' log-probs
        (N, V), the alpha shown (N, L), the cell shown (N,) (CELLS_SHOWN) or None, new state). Always dense
        (``dense`` is accepted for the contract): the mean needs every member's normalised log-probabilities."""
        log_probs, alphas, locations, states = [], [], [], []
        for member, member_state in zip(self.members, state):
            lp, alpha, location, member_state = member.decoder.step_with_location(
                tokens, member_state, attention_mode=attention_mode, dense=True)
            log_probs.append(lp.float())
            alphas.append(alpha)
            locations.append(location)
            states.append(member_state)
        mean = torch.stack(log_probs).mean(dim=0)  # (M, N, V) -> (N, V)
        shown = ATTENTION_SHOWN[self.attention](alphas)  # (N, L)
        cells = None if locations[0] is None else CELLS_SHOWN[self.attention](shown, locations)  # (N,)
        return mean, shown, cells, tuple(states)


class CaptionerEnsemble(Captioner):
    """Captioners with one backbone decoded together: a ``Captioner`` wherever decoding reads one
    (``generate``, ``encode``, ``grid_from``, ``check_decode_options``, ``transform``, ``grid_hw``), whose "prepared
    grid" is the shared cached rows (B, l, C): each member prepares its own inside ``generate``.
    Decoding defaults (``decode_options``) are the first member's, and the read the one every member makes on its
    own; when they differ the read must be chosen (``ensemble_options``, the module docstring).

    Args:
        members: two or more captioners (one is allowed: it decodes as itself, through dense log-probs).
        attention: "first" or "mean" (ATTENTION_SHOWN): the attention map reported per word.
        names: how messages name the members (e.g. their files); default "member 0", "member 1", ...
    """

    def __init__(self, members: Sequence[Captioner], attention: str = "first",
                 names: Sequence[str] | None = None) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        names = list(names) if names is not None else [f"member {i}" for i in range(len(members))]
        if len(names) != len(members):
            raise ValueError(f"{len(members)} members but {len(names)} names")
        first = members[0]
        if not first.encoder.frozen and not first.encoder.splits:
            raise ValueError(f"{names[0]}: its fine-tuned {first.encoder.name} backbone cannot be split below its "
                             "trainable blocks, and an ensemble encodes each image once, up to what the feature "
                             "cache would store: decode it alone")
        for name, member in zip(names[1:], members[1:]):
            reason = member_mismatch(first, member)
            if reason is not None:
                raise ValueError(f"{name}: cannot join an ensemble with {names[0]}: {reason}")
        super().__init__(first.encoder, EnsembleSteps(members, attention), start_id=first.start_id,
                         end_id=first.end_id, pad_id=first.pad_id, unk_id=first.unk_id,
                         attention_kind=first.attention_kind, decode_options=ensemble_options(members, names))
        self.names = names

    @property
    def members(self) -> nn.ModuleList:
        return self.decoder.members

    @property
    def attention_shown(self) -> str:
        """"first" or "mean": the attention map each word reports."""
        return self.decoder.attention

    def prepare_rows(self, rows: Tensor) -> Tensor:
        """The shared cached rows (B, l, C) as they are: each member finishes and prepares its own grid from
        them (EnsembleSteps.init_state), its own fine-tuned top blocks included."""
        return rows

    def check_decode_options(self, options: DecodeOptions) -> DecodeOptions:
        """``options`` once every member can decode with them, as each would alone (a member that cannot read
        that way refuses, named); options whose read is still to be chosen (``UnchosenRead``) are refused."""
        if isinstance(options, UnchosenRead):
            raise MixedReads(options.reads)
        for name, member in zip(self.names, self.members):
            try:
                member.check_decode_options(options)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
        return options
