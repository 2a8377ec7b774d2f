"""Typed configuration: every default lives in a dataclass here, or for ``model.decoder`` in its family's.

A YAML file in ``configs/`` lists only what it changes; ``--set a.b=c`` overrides
are applied after the file. Unknown keys are errors that name the valid ones, values
are type-checked and range-checked, and the resolved config writes to YAML and reads
back identically (``save_config`` / ``load_config``). ``build_model(cfg, vocab)`` in
``captioner/api.py`` is the one place that turns this into constructor arguments; field
names equal those arguments' names. The allowed names of scorers, attentions, decoding modes and data
formats come from ``captioner/names.py``, a torch-free table below both this module and the code (whose
registries, ``SCORERS``, ``ATTENTIONS``, ``LOADERS``, a test holds equal to it). ``model.decoder`` is the
section of the decoder family ``model.decoder.kind`` names: a dataclass that family owns, with its keys, its
checks and the ``model.attention`` keys it reads (``captioner/models/decoders/``: family.py and each family's
torch-free ``*_config.py``). Loading a config imports neither torch, the models' code nor the data readers.

The ``captioner config`` command (list, show) is captioner/commands/config.py's.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

# model.decoder is the section of one decoder family, a dataclass of its own picked by model.decoder.kind
# (captioner/models/decoders/: its torch-free config modules, not the models)
from captioner.models.decoders import DEFAULT_DECODER, DecoderFamilyConfig, family_config

# The names of the code's choices, torch-free (the registries beside the code are tested equal to them).
# The allowed values and ranges validate() checks, keyed by dotted path, are there too (CHOICES, POSITIVE, ...).
from captioner.names import BEAM, CHOICES, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key path."""


@dataclass
class ShapesConfig:
    """The built-in synthetic data set (captioner/data/shapes.py)."""

    n_train: int = 3000
    n_val: int = 200
    n_test: int = 200
    image_size: int = 224
    seed: int = 0


@dataclass
class DataConfig:
    """Where images and captions live, and how captions become token ids."""

    format: str = "shapes"  # shapes | karpathy | coco | flickr8k | captions (your own folder + CSV / JSON lines)
    root: str = "data/shapes"  # image directory (shapes: output directory of the generator)
    captions: str = ""  # karpathy JSON / COCO captions JSON / Flickr8k.token.txt / CSV or JSONL ("" = format default)
    split_file: str = ""  # COCO: optional Karpathy JSON restricting the split; Flickr8k: folder of split lists
    restval: bool = True  # COCO Karpathy split: fold "restval" into train
    # format captions (its bad rows are skipped up to data.max_failure_share), a file without a split column:
    # the seeded random split of its images
    val_share: float = 0.1  # share of the images held out for validation
    test_share: float = 0.1  # share of the images held out for test
    split_seed: int = 0
    max_length: int = 20  # words per caption, longer ones are truncated (and counted)
    min_count: int = 1  # vocabulary threshold, counted on the training split only
    features_dir: str = ""  # feature cache; "" = <root>/features/<encoder fingerprint>
    use_cache: bool = True  # read the feature cache: a frozen encoder's grids, a fine-tuned one's bottom activations
    num_workers: int = 2
    max_failure_share: float = 0.05  # extraction stops when more images than this share are unreadable
    mirror: bool = False  # also train on every training photo mirrored left-right ("left"/"right" swapped)
    shapes: ShapesConfig = field(default_factory=ShapesConfig)


@dataclass
class EncoderConfig:
    """Arguments of ``build_encoder`` (captioner/models/encoder.py)."""

    name: str = "efficientnet_lite0"
    pretrained: bool = True
    weights_path: str = ""
    input_size: int = 224
    stage: int = -1  # -1: the last stage; otherwise the stage index (e.g. stride 16)
    grid_size: int = 0  # 0: the native grid; otherwise adaptive pooling to grid_size x grid_size
    proj_dim: int = 0  # 0: no 1x1 projection
    finetune_blocks: int = 0  # 0: frozen (eval-mode batch norm, no grad); N: the last N blocks train
    update_bn_stats: bool = False  # finetune_blocks > 0: the trained blocks' batch norms update their statistics
    self_attention_layers: int = 0  # self-attention refinement of the grid (0 = none)
    position_embedding: bool = False  # add a learned embedding of each grid location (not in the paper)


@dataclass
class AttentionConfig:
    """Which scorer and which attention the decoder uses."""

    scorer: str = "additive"  # additive | dot | scaled_dot | bilinear
    attention: str = "soft"  # soft | hard | key_value | multi_head
    heads: int = 1  # also the encoder's self-attention heads (model.encoder.self_attention_layers)
    attention_dim: int = 512


@dataclass
class ModelConfig:
    """The encoder, the attention, and the decoder: ``model.decoder.kind`` picks the decoder family, whose own
    dataclass is the section (models/decoders: ShowAttendTellConfig for lstm, TransformerConfig for
    transformer); a family reads the model.attention keys it names (ATTENTION_KEYS) and refuses the others set."""

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    decoder: DecoderFamilyConfig = field(default_factory=family_config(DEFAULT_DECODER))


@dataclass
class HardConfig:
    """Hard attention's location policy under cross-entropy (Xu et al. 2015, §4.1): REINFORCE (Eq. 10-12) or
    the straight-through Gumbel-softmax read; each estimator reads its own keys (ESTIMATOR_KEYS)."""

    estimator: str = "paper"  # paper (Eq. 10-12) | loo (K samples per caption) | gumbel (Gumbel-softmax); losses.py
    reinforce_weight: float = 1.0  # lambda_r
    entropy_weight: float = 0.01  # lambda_e (SCST has its own: train.scst.entropy_weight)
    baseline_decay: float = 0.9  # paper: b <- decay * b + (1 - decay) * log p(y | s, a)
    expectation_prob: float = 0.5  # per caption, replace the sampled cells by the expectation
    samples: int = 4  # loo: location paths sampled per caption (K)
    reward_discount: float = 1.0  # loo: delta of the reward to go (1: unbiased)
    temperature: float = 1.0  # gumbel: tau of the relaxed read in the first epoch
    temperature_min: float = 0.5  # gumbel: tau in the last epoch (geometric in between: losses.gumbel_temperature)


# The train.hard keys each estimator reads (the others are unread_keys of its runs).
ESTIMATOR_KEYS: dict[str, tuple[str, ...]] = {
    "paper": ("reinforce_weight", "entropy_weight", "baseline_decay", "expectation_prob"),
    "loo": ("reinforce_weight", "entropy_weight", "expectation_prob", "samples", "reward_discount"),
    "gumbel": ("expectation_prob", "temperature", "temperature_min"),
}


@dataclass
class ScstConfig:
    """Self-critical sequence training (Rennie et al. 2017), ``train.objective: scst``."""

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
    # be set (0 for none), never inherited from cross-entropy's train.hard.entropy_weight
    entropy_weight: float = -1.0
    xe_weight: float = 0.0  # a teacher-forced cross-entropy term on one reference per image (Paulus et al. 2018)


@dataclass
class TrainConfig:
    epochs: int = 20
    batch_size: int = 32
    optimizer: str = "adam"  # adam | rmsprop
    lr: float = 4e-4
    encoder_lr: float = 1e-4
    weight_decay: float = 0.0
    lr_schedule: str = "none"  # none | step | cosine
    lr_step_epochs: int = 8
    lr_gamma: float = 0.5
    grad_clip: float = 5.0
    alpha_c: float = 1.0  # lambda of the doubly stochastic penalty, Eq. (14), per caption as in the paper
    # gamma: weight of alpha's mean normalised entropy (sharpens attention; not in the paper)
    alpha_entropy: float = 0.0
    hard: HardConfig = field(default_factory=HardConfig)
    objective: str = "xe"  # xe (cross-entropy, Eq. 14 / Eq. 10-12) | scst (self-critical, CIDEr-D reward)
    init: str = ""  # a run directory, checkpoint or model folder (a shipped name) whose weights start this run
    scst: ScstConfig = field(default_factory=ScstConfig)
    val_metric: str = "CIDEr-D"
    patience: int = 5
    val_max_images: int = 0  # 0 = the whole validation split
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "none"  # none | bf16 | fp16: mixed precision (autocast) on CUDA and on the CPU alike
    tf32: bool = True  # on CUDA, float32 matmuls and convolutions in TF32 (runtime.enable_tf32); nothing on the CPU
    # under torchrun: how long the other ranks wait at a collective while rank 0 validates (NCCL's default: 10 min)
    ddp_timeout_min: float = 60.0
    # under torchrun: auto (nccl on CUDA, gloo on the CPU) | nccl | gloo (several processes sharing one GPU need it)
    ddp_backend: str = "auto"
    run_dir: str = "runs/default"
    max_nonfinite_steps: int = 10  # consecutive skipped steps before training stops
    time_budget_s: float = 0.0  # 0 = no limit; else stop when the next epoch would end past it (extraction counts)
    log_every: int = 50
    tensorboard: str = "auto"  # auto (log when installed) | on (required) | off; see captioner/training/tblog.py
    tensorboard_images: int = 3  # validation images logged with caption and attention overlay per epoch (W&B too)
    # off | offline (RUN_DIR/wandb, for `wandb sync`) | online; the wandb extra; captioner/training/wblog.py
    wandb: str = "off"
    num_threads: int = 0  # 0 = torch default
    fast_paths: bool = True  # false: the plain reference code everywhere, slower (captioner/fast_paths.py)
    # also keep each epoch's weights, RUN_DIR/epochs/epoch-NNN.pt: snapshot ensembles and `captioner average`
    keep_epochs: bool = False
    average_last: int = 0  # k > 0: RUN_DIR/averaged.pt, the mean of the last k epochs' weights (needs keep_epochs)


@dataclass
class EvalConfig:
    split: str = "test"
    beam_size: int = BEAM
    max_length: int = 0  # most words per decoded caption; 0 = data.max_length (what training saw)
    length_penalty: float = 1.0  # beam ranking: score / length ** length_penalty (every decode reads it)
    block_trigrams: bool = False  # no word that would repeat a trigram of its caption (every decode reads it)
    attention_mode: str = "expectation"  # hard attention decoding: expectation | argmax | sample
    batch_size: int = 32
    mirror_check: bool = False  # per-epoch validation also captions the val photos mirrored (evaluate --mirror-check)
    tf32: bool = True  # on CUDA, caption / evaluate / serve run float32 matmuls in TF32 (runtime.enable_tf32)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, typ: Any, path: str) -> Any:
    """Check ``value`` against the annotated type; ints are accepted where floats are expected."""
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - only the four scalar types are used above
        raise ConfigError(f"{path}: unsupported field type {typ}")
    name = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{path}: expected {name}, got {type(value).__name__} {value!r}")


def _section_class(cls: type, kind: Any) -> type:
    """The dataclass of a section: itself, or for model.decoder the family of ``kind``."""
    if cls is not DecoderFamilyConfig:
        return cls
    try:
        return family_config(kind)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _where(cls: type, prefix: str) -> str:
    """How an unknown key's message names the section it is not in."""
    if issubclass(cls, DecoderFamilyConfig):
        return f"{prefix} for kind {cls.kind}"
    return prefix or "top level"


def _from_dict(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    cls = _section_class(cls, data.get("kind", DEFAULT_DECODER))
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        where = _where(cls, prefix)
        raise ConfigError(
            f"unknown config key {'.'.join(filter(None, [prefix, str(unknown[0])]))!r} "
            f"(valid keys at {where}: {', '.join(types_)})"
        )
    kwargs = {}
    for name, typ in types_.items():
        if name not in data:
            continue
        path = f"{prefix}.{name}" if prefix else name
        if dataclasses.is_dataclass(typ):
            kwargs[name] = _from_dict(typ, data[name], path)
        else:
            kwargs[name] = _coerce(data[name], typ, path)
    return cls(**kwargs)


def config_from_dict(data: dict) -> Config:
    """Build a validated Config from a (possibly partial) nested dict."""
    cfg = _from_dict(Config, data or {}, "")
    validate(cfg)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def get_path(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def unread_keys(cfg: Config) -> dict[str, str]:
    """The train keys this run's objective would not read (path -> why), by the attention kind
    (soft or hard), train.objective and train.hard.estimator: SCST's loss has no attention terms, only
    hard attention has a location policy, and each estimator reads its own settings; and the data keys
    its data.format would not read (``unread_data_keys``)."""
    hard = cfg.model.attention.attention == "hard"
    hard_keys = [f"train.hard.{f.name}" for f in dataclasses.fields(HardConfig)]
    unread: dict[str, str] = {**unread_data_keys(cfg), **_unread_attention_keys(cfg.model.decoder)}
    if not cfg.model.encoder.finetune_blocks:
        unread["model.encoder.update_bn_stats"] = "a frozen encoder's batch norms never update (finetune_blocks is 0)"
    if cfg.train.objective == "scst":
        for key in ("train.alpha_c", "train.alpha_entropy"):
            unread[key] = "the SCST objective has no attention terms besides train.scst.entropy_weight"
        for key in hard_keys:
            unread[key] = ("SCST reads train.scst (attention_mode, entropy_weight), not cross-entropy's train.hard"
                           if hard else "only hard attention reads train.hard")
        if not hard:
            for key in ("train.scst.attention_mode", "train.scst.entropy_weight"):
                unread[key] = "only hard attention has a location policy"
        elif cfg.train.scst.attention_mode == "argmax":
            unread["train.scst.entropy_weight"] = "argmax reads are not sampled: no location policy to keep exploring"
        return unread
    for f in dataclasses.fields(ScstConfig):
        unread[f"train.scst.{f.name}"] = "only train.objective: scst reads train.scst"
    if not hard:
        unread.update({key: "only hard attention reads train.hard" for key in hard_keys})
    else:
        unread.update(_unread_estimator_keys(cfg.train.hard.estimator))
    return unread


def _unread_estimator_keys(estimator: str) -> dict[str, str]:
    """The train.hard keys that ``estimator`` does not read (ESTIMATOR_KEYS), each with the estimators that do."""
    unread = {}
    for f in dataclasses.fields(HardConfig):
        if f.name == "estimator" or f.name in ESTIMATOR_KEYS.get(estimator, ()):
            continue
        readers = " or ".join(repr(e) for e, keys in ESTIMATOR_KEYS.items() if f.name in keys)
        unread[f"train.hard.{f.name}"] = f"the {estimator!r} estimator does not read it (only {readers})"
    return unread


def unread_data_keys(cfg: Config) -> dict[str, str]:
    """The data keys this run's data.format would not read (path -> why): the random split's settings belong
    to the captions format, which has no Karpathy split file or restval."""
    if cfg.data.format == "captions":
        why = "data.format captions takes its splits from the file's split column or data.val_share/test_share"
        return {"data.split_file": why, "data.restval": why}
    return {f"data.{key}": "only data.format captions splits images at random"
            for key in ("val_share", "test_share", "split_seed")}


def _unread_attention_keys(decoder: DecoderFamilyConfig) -> dict[str, str]:
    """The model.attention keys that the decoder family does not read (its ATTENTION_KEYS)."""
    return {f"model.attention.{f.name}": f"the {decoder.kind} decoder does not read it"
            for f in dataclasses.fields(AttentionConfig) if f.name not in decoder.ATTENTION_KEYS}


def check_read_keys(cfg: Config) -> None:
    """A setting the run would ignore is refused, not accepted: any key of unread_keys whose value is
    not the default; and a setting the run must choose itself is refused unset (check_scst_entropy)."""
    default = Config()
    for key, why in unread_keys(cfg).items():
        if get_path(cfg, key) != get_path(default, key):
            raise ConfigError(f"{key}: set to {get_path(cfg, key)!r}, but this run would ignore it ({why}); "
                              f"remove it from the config")
    check_scst_entropy(cfg)


def check_scst_entropy(cfg: Config) -> None:
    """Hard-attention SCST that samples its cells needs train.scst.entropy_weight set (>= 0), explicitly. A
    run's check (check_read_keys, scst.SelfCritical), not validate's: the config of a hard SCST checkpoint
    saved before the key existed (the default, unset) still loads for decoding."""
    scst = cfg.train.scst
    if (scst.entropy_weight == ScstConfig.entropy_weight and cfg.train.objective == "scst"
            and cfg.model.attention.attention == "hard" and scst.attention_mode == "sample"):
        raise ConfigError("train.scst.entropy_weight: hard-attention SCST samples its cells and needs the "
                          "location policy's entropy bonus set explicitly (e.g. 0.01, or 0 for none; it is "
                          "not inherited from train.hard.entropy_weight), or train.scst.attention_mode: argmax")


def validate(cfg: Config) -> None:
    """Range and choice checks; errors name the key path and the offending value."""
    family = cfg.model.decoder  # the decoder family's tables join the config's (models/decoders/*_config.py)
    for path, choices in {**CHOICES, **{f"model.decoder.{k}": v for k, v in family.CHOICES.items()}}.items():
        value = get_path(cfg, path)
        if value not in choices:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(choices)}")
    for path in (*POSITIVE, *(f"model.decoder.{k}" for k in family.POSITIVE)):
        value = get_path(cfg, path)
        if not value > 0:
            raise ConfigError(f"{path}: must be > 0, got {value!r}")
    for path in NON_NEGATIVE:
        value = get_path(cfg, path)
        if value < 0:
            raise ConfigError(f"{path}: must be >= 0, got {value!r}")
    for path in (*UNIT_INTERVAL, *(f"model.decoder.{k}" for k in family.UNIT_INTERVAL)):
        value = get_path(cfg, path)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{path}: must be in [0, 1], got {value!r}")
    if cfg.data.val_share + cfg.data.test_share >= 1.0:
        raise ConfigError(f"data.val_share + data.test_share must be < 1 (training needs images), got "
                          f"{cfg.data.val_share} + {cfg.data.test_share}")
    enc = cfg.model.encoder
    if enc.name.startswith("timm:") and enc.finetune_blocks and cfg.data.use_cache:
        raise ConfigError(f"model.encoder.finetune_blocks={enc.finetune_blocks} with model.encoder.name={enc.name!r} "
                          "needs data.use_cache=false: a timm backbone cannot be split below its trainable blocks, "
                          "so the feature cache cannot hold what it starts from; it fine-tunes on images")
    if cfg.train.average_last and not cfg.train.keep_epochs:
        raise ConfigError(f"train.average_last={cfg.train.average_last} averages kept epochs: set "
                          "train.keep_epochs=true too")
    if cfg.train.hard.temperature_min > cfg.train.hard.temperature:
        raise ConfigError(f"train.hard.temperature_min ({cfg.train.hard.temperature_min}) must be <= "
                          f"train.hard.temperature ({cfg.train.hard.temperature}): the Gumbel-softmax read anneals "
                          f"from temperature down to temperature_min")
    if cfg.train.hard.estimator == "loo" and cfg.train.hard.samples < 2:
        raise ConfigError(f"train.hard.samples: the 'loo' estimator needs at least 2, got {cfg.train.hard.samples}")
    if cfg.train.objective == "scst" and cfg.train.scst.baseline == "mean" and cfg.train.scst.samples < 2:
        raise ConfigError(f"train.scst.samples: the 'mean' baseline needs at least 2, got {cfg.train.scst.samples}")
    if cfg.train.scst.entropy_weight != ScstConfig.entropy_weight and cfg.train.scst.entropy_weight < 0:
        raise ConfigError(f"train.scst.entropy_weight: must be >= 0, got {cfg.train.scst.entropy_weight!r}")
    try:
        family.check(cfg.model.attention)  # what the family's tables cannot say
    except ValueError as err:
        raise ConfigError(str(err)) from None


def split_override(text: str) -> tuple[list[str], str]:
    """Split ``a.b.c=value`` into its key path and the raw value text."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError(f"override {text!r}: empty key path")
    return parts, raw


def _parse_value(raw: str, typ: Any, path: str) -> Any:
    """Read an override's text as the field's type: text stays text, numbers are numbers."""
    if typ is str:
        return raw
    if dataclasses.is_dataclass(typ):
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: cannot parse {raw!r} ({err})") from None
    text = raw.strip()
    if typ is bool:
        lowered = text.lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise ConfigError(f"{path}: expected bool (true/false), got {raw!r}")
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{path}: expected int, got {raw!r}") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{path}: expected float, got {raw!r}") from None
    raise ConfigError(f"{path}: unsupported field type {typ}")  # pragma: no cover


def parse_override(text: str, decoder_kind: str = DEFAULT_DECODER) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and the value read as that field's type (model.decoder's keys
    are those of the family ``decoder_kind``)."""
    parts, raw = split_override(text)
    return parts, _parse_value(raw, _field_type_at(parts, decoder_kind), ".".join(parts))


def _field_type_at(parts: list[str], decoder_kind: str = DEFAULT_DECODER) -> Any:
    """The annotated type at a key path; unknown keys name the valid ones."""
    cls: Any = Config
    typ: Any = Config
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"{'.'.join(parts[:i])} is a value, not a section")
        cls = _section_class(cls, decoder_kind)
        types_ = _field_types(cls)
        if part not in types_:
            raise ConfigError(f"unknown config key {'.'.join(parts[: i + 1])!r} "
                              f"(valid keys at {_where(cls, '.'.join(parts[:i]))}: {', '.join(types_)})")
        typ = cls = types_[part]
    return typ


def _decoder_kind(data: dict) -> Any:
    """model.decoder.kind in a nested dict (the default when it names none)."""
    decoder = (data.get("model") or {}).get("decoder") if isinstance(data.get("model"), dict) else None
    return decoder.get("kind", DEFAULT_DECODER) if isinstance(decoder, dict) else DEFAULT_DECODER


def apply_override(data: dict, text: str) -> None:
    """Set one ``key.path=value`` override into a nested dict, checking the path exists (model.decoder's keys:
    those of the family the dict's model.decoder.kind names)."""
    kind = _decoder_kind(data)
    parts, value = parse_override(text, kind)
    path = ".".join(parts)
    typ = _field_type_at(parts, kind)
    if dataclasses.is_dataclass(typ) and not isinstance(value, dict):
        raise ConfigError(f"{path} is a section; set one of its keys: "
                          f"{', '.join(_field_types(_section_class(typ, kind)))}")
    node = data
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: expected a mapping in the config file")
    node[parts[-1]] = value


# The configs shipped with the package (``configs/`` in a checkout is a link to this folder).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> dict[str, Path]:
    """Name -> file of every config shipped with the package (e.g. "flickr8k_soft")."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def resolve_config_path(path: str | Path) -> Path:
    """A config file path, or the name of a shipped config (``flickr8k_soft`` or ``flickr8k_soft.yaml``)."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    shipped = shipped_configs()
    name = candidate.stem if candidate.suffix in (".yaml", ".yml") and len(candidate.parts) == 1 else str(path)
    if name in shipped:
        return shipped[name]
    raise ConfigError(f"config file not found: {path} (shipped configs, usable by name: {', '.join(shipped)})")


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config (only the keys it changes; a path or a shipped config's name) and apply
    ``key=value`` overrides."""
    data: dict = {}
    if path is not None:
        path = resolve_config_path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from None
    return config_from_file_data(data, overrides, source=path)


def config_from_file_data(data: Any, overrides: Iterable[str] = (), source: str | Path | None = None) -> Config:
    """A config file's contents (``data``, read from ``source``) with ``overrides`` applied, checked as a run
    reads it: validated, and no key set that the run would ignore (check_read_keys)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    # a --set of model.decoder.kind first: the other model.decoder overrides are keys of the family it names
    for text in sorted(overrides, key=lambda t: split_override(t)[0] != ["model", "decoder", "kind"]):
        apply_override(data, text)
    try:
        cfg = config_from_dict(data)
        check_read_keys(cfg)  # here, not in validate: a checkpoint's saved config still loads for decoding
        return cfg
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}" if source is not None else str(err)) from None


def save_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML, atomically (a resume reads this file: it must never be half written)."""
    from captioner.atomic import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def add_config_arguments(parser: Any) -> None:
    """The ``--config`` / ``--set`` pair every command that reads a config accepts."""
    parser.add_argument("--config", default=None,
                        help="YAML config file (lists only what it changes), or a shipped config's name "
                             "(`captioner config list`)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config value, e.g. --set model.attention.scorer=dot (repeatable)",
    )
