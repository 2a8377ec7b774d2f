"""What each training objective's config is: the ``train.objective`` section, one dataclass per objective (torch-free).

``train.objective.kind`` picks the dataclass (``OBJECTIVE_CONFIGS``, at the end of this module), as
``model.decoder.kind`` picks a decoder family's, so a key another objective owns is an unknown key, named with
the keys this one has. Each dataclass is a leaf: it reads its own fields and nothing else of the config. What it
needs to know of the model is one fact, whether the attention is hard (``hard``: it has a location policy), which
the config passes in (``config.hard_attention``).

The tables below (``CHOICES``, ``POSITIVE``, ``NON_NEGATIVE``, ``UNIT_INTERVAL``) are checked by
``config.validate`` with the config's own; ``check`` adds what they cannot say, ``unread`` names the keys a run
would ignore (refused when set), ``required`` refuses what a run must choose itself. Errors are ValueErrors whose
message starts with the key path (``train.objective.samples: ...``); the config wraps them as ConfigErrors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from captioner.names import SCST_BASELINES

PREFIX = "train.objective"


@dataclass
class ObjectiveConfig:
    """The ``train.objective`` section of one objective. Subclasses set ``kind``'s default to their key."""

    kind: str = ""
    # Liu et al. (AAAI 2017)'s strong supervision: weight of the cross-entropy between each boxed word's box map
    # (Flickr30k Entities, data.entities) and its alpha, per supervised word (losses.attention_supervision_loss)
    grounding_weight: float = 0.0
    # True: trains hard attention only (its location policy); False: never hard attention; None: either
    HARD: ClassVar[bool | None] = None
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    POSITIVE: ClassVar[tuple[str, ...]] = ()
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("grounding_weight",)
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ()
    # what this objective schedules over train.epochs (None: nothing): a resume may not change train.epochs then
    SPANS_EPOCHS: ClassVar[str | None] = None

    def check(self, hard: bool) -> None:
        """ValueError, naming the key, for what the tables cannot say (``hard``: the attention is hard)."""
        if self.HARD is not None and self.HARD != hard:
            fits = [kind for kind, section in OBJECTIVE_CONFIGS.items() if section.HARD in (hard, None)]
            kinds = ", ".join(fits) if hard else " or ".join(fits)
            raise ValueError(
                f"{PREFIX}.kind: {self.kind!r} " + ("trains hard attention's location policy, but "
                                                    "model.attention.attention is not hard" if self.HARD else
                                                    "cannot train hard attention (it has a location policy)")
                + f"; use one of {kinds}")

    def unread(self, hard: bool) -> dict[str, str]:
        """The keys of this section a run with (or without) hard attention would ignore: key path -> why."""
        return {}

    def required(self, hard: bool) -> None:
        """ValueError for a setting this run must choose itself and left unset (a run's check, not validate's:
        a checkpoint saved before the key existed still loads for decoding)."""


@dataclass
class CrossEntropyConfig(ObjectiveConfig):
    """Soft attention by backpropagation (Xu et al. 2015, §4.2, Eq. 14): cross-entropy plus the doubly
    stochastic penalty."""

    kind: str = "xe"
    alpha_c: float = 1.0  # lambda of the doubly stochastic penalty, Eq. (14), per caption as in the paper
    # gamma: weight of alpha's mean normalised entropy (sharpens attention; not in the paper)
    alpha_entropy: float = 0.0

    HARD: ClassVar[bool | None] = False
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("alpha_c", "alpha_entropy", "grounding_weight")


@dataclass
class _LocationPolicyConfig(CrossEntropyConfig):
    """Hard attention under cross-entropy: its location policy learns by an estimator (the subclasses), and on a
    share of the captions the read is the expectation instead (§4.1's variance-reduction trick)."""

    kind: str = ""  # no objective of its own
    expectation_prob: float = 0.5  # per caption, replace the sampled cells by the expectation

    HARD: ClassVar[bool | None] = True
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("expectation_prob",)


@dataclass
class ReinforceConfig(_LocationPolicyConfig):
    """The paper's estimator, Eq. (10)-(12): REINFORCE against a moving-average baseline, with an entropy bonus."""

    kind: str = "reinforce"
    reinforce_weight: float = 1.0  # lambda_r
    entropy_weight: float = 0.01  # lambda_e
    baseline_decay: float = 0.9  # b <- decay * b + (1 - decay) * log p(y | s, a)

    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("alpha_c", "alpha_entropy", "reinforce_weight", "entropy_weight",
                                               "grounding_weight")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("expectation_prob", "baseline_decay")


@dataclass
class LeaveOneOutConfig(_LocationPolicyConfig):
    """K sampled cell paths per caption, each against the mean of the others (Kool et al. 2019)."""

    kind: str = "loo"
    reinforce_weight: float = 1.0  # lambda_r
    entropy_weight: float = 0.01  # lambda_e
    samples: int = 4  # location paths sampled per caption (K)
    reward_discount: float = 1.0  # delta of the reward to go (1: unbiased)

    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("alpha_c", "alpha_entropy", "reinforce_weight", "entropy_weight",
                                               "grounding_weight")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("expectation_prob", "reward_discount")
    POSITIVE: ClassVar[tuple[str, ...]] = ("samples",)

    def check(self, hard: bool) -> None:
        super().check(hard)
        if self.samples < 2:
            raise ValueError(f"{PREFIX}.samples: the 'loo' objective needs at least 2, got {self.samples}")


@dataclass
class GumbelConfig(_LocationPolicyConfig):
    """The straight-through Gumbel-softmax read: the context carries the scorer's gradient, no REINFORCE term;
    its temperature anneals geometrically from ``temperature`` (first epoch) to ``temperature_min`` (last)."""

    kind: str = "gumbel"
    temperature: float = 1.0  # tau of the relaxed read in the first epoch
    temperature_min: float = 0.5  # tau in the last epoch

    POSITIVE: ClassVar[tuple[str, ...]] = ("temperature", "temperature_min")
    SPANS_EPOCHS: ClassVar[str | None] = (
        "the Gumbel-softmax temperature (train.objective.temperature down to temperature_min over train.epochs: "
        "a longer run would read at a higher temperature again)")

    def check(self, hard: bool) -> None:
        super().check(hard)
        if self.temperature_min > self.temperature:
            raise ValueError(f"{PREFIX}.temperature_min ({self.temperature_min}) must be <= {PREFIX}.temperature "
                             f"({self.temperature}): the Gumbel-softmax read anneals from temperature down to "
                             "temperature_min")


@dataclass
class SelfCriticalConfig(ObjectiveConfig):
    """Self-critical sequence training (Rennie et al. 2017) on the CIDEr-D reward, for soft and hard attention."""

    kind: str = "scst"
    samples: int = 5  # captions sampled per image (k)
    baseline: str = "mean"  # mean (of the image's other samples; Luo 2020) | greedy (Rennie et al.)
    reward_end: bool = True  # score <end> as a word of the sampled and reference captions
    max_length: int = 0  # most words per sampled caption; 0 = the decoding length (eval.max_length)
    forbid_unk: bool = True  # never sample <unk> (captions are read by people)
    greedy_images: int = 500  # training images whose greedy caption's reward is logged every epoch
    # hard attention: sample (the cells are drawn with the words: one trajectory, one advantage) | argmax
    # (words are sampled, each reads its arg-max cell as decoding does: the reward trains the words, not where
    # to look; the scorer learns only from xe_weight's term, and only if eval.attention_mode reads softly)
    attention_mode: str = "sample"
    # hard attention, attention_mode sample: lambda_e, the location policy's entropy bonus. No default: it must
    # be set (0 for none), never inherited from another objective's
    entropy_weight: float = -1.0
    xe_weight: float = 0.0  # a teacher-forced cross-entropy term on one reference per image (Paulus et al. 2018)

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"baseline": SCST_BASELINES,
                                                     "attention_mode": ("sample", "argmax")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("samples",)
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_length", "greedy_images", "xe_weight", "grounding_weight")

    def check(self, hard: bool) -> None:
        if self.baseline == "mean" and self.samples < 2:
            raise ValueError(f"{PREFIX}.samples: the 'mean' baseline needs at least 2, got {self.samples}")
        if self.entropy_weight != SelfCriticalConfig.entropy_weight and self.entropy_weight < 0:
            raise ValueError(f"{PREFIX}.entropy_weight: must be >= 0, got {self.entropy_weight!r}")

    def unread(self, hard: bool) -> dict[str, str]:
        if not hard:
            return {f"{PREFIX}.{key}": "only hard attention has a location policy"
                    for key in ("attention_mode", "entropy_weight")}
        if self.attention_mode == "argmax":
            return {f"{PREFIX}.entropy_weight": "argmax reads are not sampled: no location policy to keep exploring"}
        return {}

    def required(self, hard: bool) -> None:
        if hard and self.attention_mode == "sample" and self.entropy_weight == SelfCriticalConfig.entropy_weight:
            raise ValueError(f"{PREFIX}.entropy_weight: hard-attention SCST samples its cells and needs the location "
                             "policy's entropy bonus set explicitly (e.g. 0.01, or 0 for none; it is not inherited "
                             f"from another objective's), or {PREFIX}.attention_mode: argmax")

    @property
    def location_entropy_weight(self) -> float:
        """lambda_e as the loss reads it: 0 where unset (a soft model, or argmax reads)."""
        return max(self.entropy_weight, 0.0)


# train.objective.kind -> its section (the config reads it through the package's objective_config)
OBJECTIVE_CONFIGS: dict[str, type[ObjectiveConfig]] = {
    "xe": CrossEntropyConfig,
    "reinforce": ReinforceConfig,
    "loo": LeaveOneOutConfig,
    "gumbel": GumbelConfig,
    "scst": SelfCriticalConfig,
}
