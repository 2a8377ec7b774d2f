"""What each training objective's config is: the ``train.objective`` section, one dataclass per objective (torch-free).

``train.objective.kind`` picks the dataclass (``OBJECTIVES``, the family's table at the end of this module), as
``model.decoder.kind`` picks a decoder family's, so a key another objective owns is an unknown key, named with
the keys this one has. Each dataclass names the class in ``training/objectives/`` it configures once
(``IMPLEMENTATION``: registration.py, imported only when a run builds it). This module sits on the floor, below
``config.py`` that reads it, not in ``training/`` above it. Adding an objective: its section here, its module in
``training/objectives/``, and one line in ``OBJECTIVES``.

Each dataclass is a leaf: it reads its own fields and nothing else of the config. What it needs to know of the
model is one fact, whether the attention is hard (``hard``: it has a location policy), which the config passes
in (``config.hard_attention``).

The tables below (``CHOICES``, ``POSITIVE``, ``NON_NEGATIVE``, ``UNIT_INTERVAL``) are checked by
``config.validate`` with the config's own; ``check`` adds what they cannot say, ``unread`` names the keys a run
would ignore (refused when set), ``required`` refuses what a run must choose itself. Errors are ValueErrors whose
message starts with the key path (``train.objective.samples: ...``); the config wraps them as ConfigErrors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from captioner.names import SCST_BASELINES
from captioner.registration import Family

PREFIX = "train.objective"
GROUNDING_LOSSES = ("cross_entropy", "mass")  # train.objective.grounding_loss


@dataclass
class ObjectiveConfig:
    """The ``train.objective`` section of one objective. Subclasses set ``kind``'s default to their key."""

    kind: str = ""
    # the class it configures, "module:Class" (registration.build), a training/objectives Objective
    IMPLEMENTATION: ClassVar[str] = ""
    # Liu et al. (AAAI 2017)'s strong supervision: weight of the cross-entropy between each boxed word's box map
    # (Flickr30k Entities, data.entities) and its alpha, per supervised word (losses.attention_supervision_loss)
    grounding_weight: float = 0.0
    # what that term is: "cross_entropy", Liu et al.'s -sum_l p_l log alpha_l towards the box map p (its cells'
    # shares of the boxes raised to grounding_power, normalised: 1 is the plain map, larger is sharper); "mass",
    # -log sum_l f_l alpha_l with f_l the share of cell l inside the boxes: the log of alpha's mass inside them,
    # which any map inside the boxes maximises (losses.attention_mass_loss)
    grounding_loss: str = "cross_entropy"
    grounding_power: float = 1.0
    # True: trains hard attention only (its location policy); False: never hard attention; None: either
    HARD: ClassVar[bool | None] = None
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"grounding_loss": GROUNDING_LOSSES}
    POSITIVE: ClassVar[tuple[str, ...]] = ()
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("grounding_weight",)
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ()
    # what this objective schedules over train.epochs (None: nothing): a resume may not change train.epochs then
    SPANS_EPOCHS: ClassVar[str | None] = None

    def check(self, hard: bool) -> None:
        """ValueError, naming the key, for what the tables cannot say (``hard``: the attention is hard): the kind
        against the attention, the keys every section may have (label smoothing's range, the grounding term's
        power), then the objective's own (``own_check``)."""
        if self.HARD is not None and self.HARD != hard:
            fits = [kind for kind, section in OBJECTIVES.items() if section.HARD in (hard, None)]
            kinds = ", ".join(fits) if hard else " or ".join(fits)
            raise ValueError(
                f"{PREFIX}.kind: {self.kind!r} " + ("trains hard attention's location policy, but "
                                                    "model.attention.attention is not hard" if self.HARD else
                                                    "cannot train hard attention (it has a location policy)")
                + f"; use one of {kinds}")
        if getattr(self, "label_smoothing", 0.0) and not 0.0 <= self.label_smoothing < 1.0:
            # at 1 the target would be the uniform distribution, whatever the word
            raise ValueError(f"{PREFIX}.label_smoothing: must be in [0, 1), got {self.label_smoothing!r}")
        if not self.grounding_power >= 1.0:
            raise ValueError(f"{PREFIX}.grounding_power: must be >= 1 (1: the plain box map), got "
                             f"{self.grounding_power!r}")
        self.own_check(hard)

    def own_check(self, hard: bool) -> None:
        """What the objective's own keys need that its tables cannot say."""

    def unread(self, hard: bool) -> dict[str, str]:
        """The keys of this section a run with (or without) hard attention would ignore: key path -> why (the
        grounding term's and the objective's own, ``own_unread``)."""
        unread = self.own_unread(hard)
        if not self.grounding_weight:
            unread.update({f"{PREFIX}.{key}": "the grounding term is off (grounding_weight: 0)"
                           for key in ("grounding_loss", "grounding_power")})
        elif self.grounding_loss == "mass":
            unread[f"{PREFIX}.grounding_power"] = "the mass term reads the boxes' cell shares as they are"
        return unread

    def own_unread(self, hard: bool) -> dict[str, str]:
        """The objective's own keys that a run with (or without) hard attention would ignore."""
        return {}

    def check_decoder(self, family: Any) -> None:
        """ValueError, naming the key, for a setting the decoder family (its ``model.decoder`` section, whose
        class-level flags say what it has) cannot train with."""
        if self.grounding_weight > 0 and not family.WORD_ALPHA:
            raise ValueError(f"{PREFIX}.grounding_weight: the {family.kind} decoder has no per-word alpha to "
                             "supervise (its map is one layer's cross-attention averaged over heads); set the weight 0")

    def compile_refusal(self) -> str:
        """Why ``train.compile`` would not run under this objective ('' where it does): the step it compiles is the
        teacher-forced soft read (models/decoders/show_attend_tell_compiled.py); sampled captions or cells are not."""
        return f"the {self.kind!r} objective samples what it reads; only the teacher-forced xe read is compiled"

    def required(self, hard: bool) -> None:
        """ValueError for a setting this run must choose itself and left unset (a run's check, not validate's:
        a checkpoint saved before the key existed still loads for decoding)."""


@dataclass
class CrossEntropyConfig(ObjectiveConfig):
    """Soft attention by backpropagation (Xu et al. 2015, §4.2, Eq. 14): cross-entropy plus the doubly
    stochastic penalty."""

    kind: str = "xe"
    IMPLEMENTATION: ClassVar[str] = "captioner.training.objectives.cross_entropy:CrossEntropy"
    alpha_c: float = 1.0  # lambda of the doubly stochastic penalty, Eq. (14), per caption as in the paper
    # gamma: weight of alpha's mean normalised entropy (sharpens attention; not in the paper)
    alpha_entropy: float = 0.0
    # epsilon: label smoothing of the word cross-entropy, target (1 - eps) onehot + eps / V (Szegedy et al. 2016;
    # ruotianluo's --label_smoothing); 0: none
    label_smoothing: float = 0.0
    # scheduled sampling (Bengio et al. 2015), ruotianluo's four numbers: from epoch scheduled_sampling_start
    # (0-based; -1: off) each input word is, with probability p, the model's own sample from its previous step;
    # p = min(increase_prob * ((epoch - start) // increase_every), max_prob)
    scheduled_sampling_start: int = -1
    scheduled_sampling_increase_every: int = 5
    scheduled_sampling_increase_prob: float = 0.05
    scheduled_sampling_max_prob: float = 0.25

    HARD: ClassVar[bool | None] = False
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("alpha_c", "alpha_entropy", "grounding_weight")
    POSITIVE: ClassVar[tuple[str, ...]] = ("scheduled_sampling_increase_every",)
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("scheduled_sampling_increase_prob",
                                                "scheduled_sampling_max_prob")
    SCHEDULE_KEYS: ClassVar[tuple[str, ...]] = ("scheduled_sampling_increase_every", "scheduled_sampling_increase_prob",
                                                "scheduled_sampling_max_prob")

    def own_check(self, hard: bool) -> None:
        if self.scheduled_sampling_start < -1:
            raise ValueError(f"{PREFIX}.scheduled_sampling_start: an epoch (0-based), or -1 for none; got "
                             f"{self.scheduled_sampling_start}")

    def own_unread(self, hard: bool) -> dict[str, str]:
        if self.scheduled_sampling_start >= 0:
            return {}
        return {f"{PREFIX}.{key}": "scheduled sampling is off (scheduled_sampling_start: -1)"
                for key in self.SCHEDULE_KEYS}

    def check_decoder(self, family: Any) -> None:
        super().check_decoder(family)
        if self.scheduled_sampling_start >= 0 and not family.SCHEDULED_SAMPLING:
            raise ValueError(f"{PREFIX}.scheduled_sampling_start: the {family.kind} decoder reads every input word "
                             "at once (it cannot feed its own samples back); use -1")

    def compile_refusal(self) -> str:
        if self.scheduled_sampling_start >= 0:
            return "scheduled sampling feeds the model's own words one step at a time (the eager step)"
        return ""

    def sample_prob(self, epoch: int) -> float:
        """Scheduled sampling's p in epoch ``epoch`` (0-based; 0 before the start)."""
        if self.scheduled_sampling_start < 0 or epoch < self.scheduled_sampling_start:
            return 0.0
        steps = (epoch - self.scheduled_sampling_start) // self.scheduled_sampling_increase_every
        return min(self.scheduled_sampling_increase_prob * steps, self.scheduled_sampling_max_prob)


@dataclass
class _LocationPolicyConfig(CrossEntropyConfig):
    """Hard attention under cross-entropy: its location policy learns by an estimator (the subclasses), and on a
    share of the captions the read is the expectation instead (§4.1's variance-reduction trick)."""

    kind: str = ""  # no objective of its own
    expectation_prob: float = 0.5  # per caption, replace the sampled cells by the expectation

    HARD: ClassVar[bool | None] = True
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = (*CrossEntropyConfig.UNIT_INTERVAL, "expectation_prob")

    compile_refusal = ObjectiveConfig.compile_refusal  # it samples cells (its decoder refuses first: hard attention)

    def own_unread(self, hard: bool) -> dict[str, str]:
        why = "the location policy's reward is each caption's plain log-likelihood of the reference's words"
        return {f"{PREFIX}.{key}": why for key in ("label_smoothing", "scheduled_sampling_start", *self.SCHEDULE_KEYS)}


@dataclass
class _ScoreFunctionConfig(_LocationPolicyConfig):
    """A score-function (REINFORCE) estimator of the location policy: its term's weight and the policy's entropy
    bonus."""

    kind: str = ""  # no objective of its own
    reinforce_weight: float = 1.0  # lambda_r
    entropy_weight: float = 0.01  # lambda_e

    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("alpha_c", "alpha_entropy", "reinforce_weight", "entropy_weight",
                                               "grounding_weight")


@dataclass
class ReinforceConfig(_ScoreFunctionConfig):
    """The paper's estimator, Eq. (10)-(12): REINFORCE against a moving-average baseline, with an entropy bonus."""

    kind: str = "reinforce"
    IMPLEMENTATION: ClassVar[str] = "captioner.training.objectives.location:Reinforce"
    baseline_decay: float = 0.9  # b <- decay * b + (1 - decay) * log p(y | s, a)

    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = (*_LocationPolicyConfig.UNIT_INTERVAL, "baseline_decay")


@dataclass
class LeaveOneOutConfig(_ScoreFunctionConfig):
    """K sampled cell paths per caption, each against the mean of the others (Kool et al. 2019)."""

    kind: str = "loo"
    IMPLEMENTATION: ClassVar[str] = "captioner.training.objectives.location:LeaveOneOut"
    samples: int = 4  # location paths sampled per caption (K)
    reward_discount: float = 1.0  # delta of the reward to go (1: unbiased)

    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = (*_LocationPolicyConfig.UNIT_INTERVAL, "reward_discount")
    POSITIVE: ClassVar[tuple[str, ...]] = ("samples",)

    def own_check(self, hard: bool) -> None:
        super().own_check(hard)
        if self.samples < 2:
            raise ValueError(f"{PREFIX}.samples: the 'loo' objective needs at least 2, got {self.samples}")


@dataclass
class GumbelConfig(_LocationPolicyConfig):
    """The straight-through Gumbel-softmax read: the context carries the scorer's gradient, no REINFORCE term;
    its temperature anneals geometrically from ``temperature`` (first epoch) to ``temperature_min`` (last)."""

    kind: str = "gumbel"
    IMPLEMENTATION: ClassVar[str] = "captioner.training.objectives.location:Gumbel"
    temperature: float = 1.0  # tau of the relaxed read in the first epoch
    temperature_min: float = 0.5  # tau in the last epoch

    POSITIVE: ClassVar[tuple[str, ...]] = ("temperature", "temperature_min")
    SPANS_EPOCHS: ClassVar[str | None] = (
        "the Gumbel-softmax temperature (train.objective.temperature down to temperature_min over train.epochs: "
        "a longer run would read at a higher temperature again)")

    def own_check(self, hard: bool) -> None:
        super().own_check(hard)
        if self.temperature_min > self.temperature:
            raise ValueError(f"{PREFIX}.temperature_min ({self.temperature_min}) must be <= {PREFIX}.temperature "
                             f"({self.temperature}): the Gumbel-softmax read anneals from temperature down to "
                             "temperature_min")


@dataclass
class SelfCriticalConfig(ObjectiveConfig):
    """Self-critical sequence training (Rennie et al. 2017) on the CIDEr-D reward, for soft and hard attention."""

    kind: str = "scst"
    IMPLEMENTATION: ClassVar[str] = "captioner.training.objectives.self_critical:SelfCritical"
    samples: int = 5  # captions sampled per image (k)
    baseline: str = "mean"  # mean (of the image's other samples; Luo 2020) | greedy (Rennie et al.)
    reward_end: bool = True  # score <end> as a word of the sampled and reference captions
    max_length: int = 0  # most words per sampled caption; 0 = the decoding length (eval.max_length)
    forbid_unk: bool = True  # never sample <unk> (captions are read by people)
    greedy_images: int = 500  # training images whose greedy caption's reward is logged every epoch
    # T of the sampled captions: words drawn from softmax(logits / T), the gradient that policy's (below 1: sharper
    # samples; decoding is unchanged)
    sample_temperature: float = 1.0
    # hard attention: sample (the cells are drawn with the words: one trajectory, one advantage) | argmax
    # (words are sampled, each reads its arg-max cell as decoding does: the reward trains the words, not where
    # to look; the scorer learns only from xe_weight's term, and only if eval.attention_mode reads softly)
    attention_mode: str = "sample"
    # hard attention, attention_mode sample: lambda_e, the location policy's entropy bonus. No default: it must
    # be set (0 for none), never inherited from another objective's
    entropy_weight: float = -1.0
    xe_weight: float = 0.0  # a teacher-forced cross-entropy term on one reference per image (Paulus et al. 2018)
    label_smoothing: float = 0.0  # epsilon of that term's label smoothing (as xe's); 0: none

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {**ObjectiveConfig.CHOICES, "baseline": SCST_BASELINES,
                                                     "attention_mode": ("sample", "argmax")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("samples", "sample_temperature")
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_length", "greedy_images", "xe_weight", "grounding_weight")

    def own_check(self, hard: bool) -> None:
        if self.baseline == "mean" and self.samples < 2:
            raise ValueError(f"{PREFIX}.samples: the 'mean' baseline needs at least 2, got {self.samples}")
        if self.entropy_weight != SelfCriticalConfig.entropy_weight and self.entropy_weight < 0:
            raise ValueError(f"{PREFIX}.entropy_weight: must be >= 0, got {self.entropy_weight!r}")

    def own_unread(self, hard: bool) -> dict[str, str]:
        unread = {} if self.xe_weight else {
            f"{PREFIX}.label_smoothing": "it smooths the xe_weight term, which is 0 (SCST's own loss has no target)"}
        if not hard:
            return {**unread, **{f"{PREFIX}.{key}": "only hard attention has a location policy"
                                 for key in ("attention_mode", "entropy_weight")}}
        if self.attention_mode == "argmax":
            unread[f"{PREFIX}.entropy_weight"] = "argmax reads are not sampled: no location policy to keep exploring"
        return unread

    def required(self, hard: bool) -> None:
        if hard and self.attention_mode == "sample" and self.entropy_weight == SelfCriticalConfig.entropy_weight:
            raise ValueError(f"{PREFIX}.entropy_weight: hard-attention SCST samples its cells and needs the location "
                             "policy's entropy bonus set explicitly (e.g. 0.01, or 0 for none; it is not inherited "
                             f"from another objective's), or {PREFIX}.attention_mode: argmax")

    @property
    def location_entropy_weight(self) -> float:
        """lambda_e as the loss reads it: 0 where unset (a soft model, or argmax reads)."""
        return max(self.entropy_weight, 0.0)


# train.objective.kind -> its section: the one registration of each objective
OBJECTIVES: Family[ObjectiveConfig] = Family("train.objective", "xe", {
    "xe": CrossEntropyConfig,
    "reinforce": ReinforceConfig,
    "loo": LeaveOneOutConfig,
    "gumbel": GumbelConfig,
    "scst": SelfCriticalConfig,
})
