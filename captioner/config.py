"""Typed configuration: every default lives in a dataclass here, or for ``model.decoder`` in its family's.

A YAML file in ``configs/`` lists only what it changes; ``--set a.b=c`` overrides
are applied after the file. Unknown keys are errors that name the valid ones, values
are type-checked and range-checked, and the resolved config writes to YAML and reads
back identically (``save_config`` / ``load_config``). ``build_model(cfg, vocab)`` in
``captioner/api.py`` is the one place that turns this into constructor arguments; field
names equal those arguments' names. The allowed names of scorers, attentions, decoding modes and data
formats come from ``captioner/names.py``, torch-free, below both this module and the code (its registries,
``SCORERS``, ``ATTENTIONS``, ``DATA_FORMATS``, name each one's code as a lazy path). ``model.decoder`` is the
section of the decoder family ``model.decoder.kind`` names: a dataclass that family owns, with its keys, its
checks and the ``model.attention`` keys it reads (``captioner/models/decoders/``: family.py and each family's
torch-free ``*_config.py``). Loading a config imports neither torch, the models' code nor the data readers.

The ``captioner config`` command (list, show) is captioner/commands/config.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

# config files (a path or a shipped name) and their chains of bases: config_files.py, below this module
from captioner.config_files import (  # noqa: F401 - CONFIG_DIR, resolve_config_path, shipped_configs: used from here
    CONFIG_DIR,
    ConfigError,
    read_config_file,
    resolve_config_path,
    shipped_configs,
)

# eval's decoding settings default to DecodeOptions' (torch-free): one default each, there
from captioner.decoding.options import DecodeOptionError, DecodeOptions

# model.decoder is the section of one decoder family, a dataclass of its own picked by model.decoder.kind
# (captioner/models/decoders/: its torch-free config modules, not the models)
from captioner.models.decoders import DECODERS, DecoderFamilyConfig

# The names of the code's choices, torch-free (the registries beside the code are tested equal to them).
# The allowed values and ranges validate() checks, keyed by dotted path, are there too (CHOICES, POSITIVE, ...).
from captioner.names import BACKBONES, CHOICES, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL

# train.objective is the section of one training objective, a dataclass of its own picked by train.objective.kind
# (captioner/objective_sections.py, torch-free, on the floor: not the objectives' code in training/)
from captioner.objective_sections import OBJECTIVES, ObjectiveConfig
from captioner.registration import TaggedSections


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
    # Flickr30k Entities folder (Sentences/, Annotations/) of these photos: validation and `captioner evaluate`
    # report grounding on its boxes, and train.objective.grounding_weight supervises attention with them
    entities: str = ""
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
    decoder: DecoderFamilyConfig = field(default_factory=DECODERS.section(DECODERS.default))


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
    # what a step minimises: the section of the objective train.objective.kind names (objective_sections.py):
    # xe (soft attention, Eq. 14) | reinforce (hard, Eq. 10-12) | loo | gumbel (hard) | scst (self-critical)
    objective: ObjectiveConfig = field(default_factory=OBJECTIVES.section(OBJECTIVES.default))
    init: str = ""  # a run directory, checkpoint or model folder (a shipped name) whose weights start this run
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
    # minutes between mid-epoch saves of last.pt (0: at epoch ends only); SIGTERM and SIGUSR1 save one too
    save_every_min: float = 0.0
    log_every: int = 50
    tensorboard: str = "auto"  # auto (log when installed) | on (required) | off; see captioner/training/tblog.py
    tensorboard_images: int = 3  # validation images logged with caption and attention overlay per epoch (W&B too)
    # off | offline (RUN_DIR/wandb, for `wandb sync`) | online; the wandb extra; captioner/training/wblog.py
    wandb: str = "off"
    num_threads: int = 0  # 0 = torch default
    fast_paths: bool = True  # false: the plain reference code everywhere, slower (captioner/fast)
    compile: str = "off"  # off | inductor | cudagraphs: the decoder's step compiled (docs/performance.md)
    # also keep each epoch's weights, RUN_DIR/epochs/epoch-NNN.pt: snapshot ensembles and `captioner average`
    keep_epochs: bool = False
    average_last: int = 0  # k > 0: RUN_DIR/averaged.pt, the mean of the last k epochs' weights (needs keep_epochs)


@dataclass
class EvalConfig:
    split: str = "test"
    beam_size: int = DecodeOptions.beam
    max_length: int = 0  # most words per decoded caption; 0 = data.max_length (what training saw)
    # beam ranking: score / length ** length_penalty (every decode reads it)
    length_penalty: float = DecodeOptions.length_penalty
    # no word that would repeat a trigram of its caption (every decode reads it)
    block_trigrams: bool = DecodeOptions.block_trigrams
    attention_mode: str = DecodeOptions.attention_mode  # hard attention decoding: expectation | argmax | sample
    # diverse beam search (decoding/diverse.py): beam_size split into beam_groups groups, each penalised
    # diversity per beam of an earlier group that chose the same word; 1 and 0: plain beam search
    beam_groups: int = DecodeOptions.beam_groups
    diversity: float = DecodeOptions.diversity
    batch_size: int = 32
    mirror_check: bool = False  # per-epoch validation also captions the val photos mirrored (evaluate --mirror-check)
    tf32: bool = True  # on CUDA, caption / evaluate / serve run float32 matmuls in TF32 (runtime.enable_tf32)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


# The reader of the sections (registration.TaggedSections): model.decoder and train.objective are tagged unions,
# their dataclass the one their ``kind`` names in its family (a decoder family's, a training objective's). A --set
# of model.decoder.kind that changes it starts the section afresh, as the same change in a config file does
# (config_files.merge); a --set of train.objective.kind keeps the keys both objectives read alike and refuses the
# file's keys the new objective reads in another sense.
_SECTIONS = TaggedSections(Config, {DecoderFamilyConfig: DECODERS, ObjectiveConfig: OBJECTIVES},
                           reinterpreted=("train.objective",))
kinded_section = _SECTIONS.kinded_section
kinded_family_defaults = _SECTIONS.kinded_defaults
split_override = TaggedSections.split_override
parse_override = _SECTIONS.parse_override
apply_override = _SECTIONS.apply_override


def sections_reset(data: dict, overrides: Iterable[str]) -> list[str]:
    """The kinded sections of a config file's ``data`` that ``overrides`` start afresh (a --set of a kind that
    changes it: the file's keys there are not the run's; ``captioner config show --origin`` says so)."""
    return [where for text in overrides if _SECTIONS.sets_a_kind(text) and (where := _SECTIONS.resets(data, text))]


def config_from_dict(data: dict) -> Config:
    """Build a validated Config from a (possibly partial) nested dict."""
    cfg = _SECTIONS.from_dict(Config, data or {})
    validate(cfg)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def get_path(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def hard_attention(cfg: Config) -> bool:
    """Whether the model's attention is hard (it has a location policy): what decides which objectives can train
    it (train.objective's sections) and which of their keys a run reads. Decided here only."""
    return cfg.model.attention.attention == "hard" and "attention" in cfg.model.decoder.ATTENTION_KEYS


def unread_keys(cfg: Config) -> dict[str, str]:
    """The keys this run would not read (path -> why): the train.objective keys its objective ignores for this
    attention (the section's ``unread``), the model.attention keys its decoder family ignores, and the data keys
    its data.format would not read (``unread_data_keys``)."""
    unread: dict[str, str] = {**unread_data_keys(cfg), **_unread_attention_keys(cfg.model.decoder),
                              **cfg.train.objective.unread(hard_attention(cfg))}
    if not cfg.model.encoder.finetune_blocks:
        unread["model.encoder.update_bn_stats"] = "a frozen encoder's batch norms never update (finetune_blocks is 0)"
    why = (cfg.model.decoder.compile_refusal(cfg.model.attention) or cfg.train.objective.compile_refusal() or (
        "" if cfg.train.fast_paths and cfg.train.amp == "none" else "needs train.amp none and train.fast_paths true"))
    if why:  # train.compile where its compiled step (models/decoders/show_attend_tell_compiled.py) would not run
        unread["train.compile"] = why
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
    not the default; and a setting the run must choose itself is refused unset (the objective's ``required``)."""
    for key, why in unread_keys(cfg).items():
        section, name = key.rsplit(".", 1)
        holder = get_path(cfg, section)
        if getattr(holder, name) != getattr(type(holder)(), name):  # its section's default (of this kind)
            raise ConfigError(f"{key}: set to {get_path(cfg, key)!r}, but this run would ignore it ({why}); "
                              f"remove it from the config")
    try:
        cfg.train.objective.required(hard_attention(cfg))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def validate(cfg: Config) -> None:
    """Range and choice checks; errors name the key path and the offending value."""
    family = cfg.model.decoder  # the decoder family's tables join the config's (models/decoders/*_config.py)
    objective = cfg.train.objective  # and so do the objective's (objective_sections.py)
    choices_at = {**CHOICES, **{f"model.decoder.{k}": v for k, v in family.CHOICES.items()},
                  **{f"train.objective.{k}": v for k, v in objective.CHOICES.items()}}
    for path, choices in choices_at.items():
        value = get_path(cfg, path)
        if value not in choices:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(choices)}")
    for path in (*POSITIVE, *(f"model.decoder.{k}" for k in family.POSITIVE),
                 *(f"train.objective.{k}" for k in objective.POSITIVE)):
        value = get_path(cfg, path)
        if not value > 0:
            raise ConfigError(f"{path}: must be > 0, got {value!r}")
    for path in (*NON_NEGATIVE, *(f"train.objective.{k}" for k in objective.NON_NEGATIVE)):
        value = get_path(cfg, path)
        if value < 0:
            raise ConfigError(f"{path}: must be >= 0, got {value!r}")
    for path in (*UNIT_INTERVAL, *(f"model.decoder.{k}" for k in family.UNIT_INTERVAL),
                 *(f"train.objective.{k}" for k in objective.UNIT_INTERVAL)):
        value = get_path(cfg, path)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{path}: must be in [0, 1], got {value!r}")
    if cfg.data.val_share + cfg.data.test_share >= 1.0:
        raise ConfigError(f"data.val_share + data.test_share must be < 1 (training needs images), got "
                          f"{cfg.data.val_share} + {cfg.data.test_share}")
    enc = cfg.model.encoder
    if enc.name not in BACKBONES and not enc.name.startswith("timm:"):
        raise ConfigError(f"model.encoder.name: {enc.name!r} is not one of {', '.join(BACKBONES)}, "
                          "timm:<timm model name>")
    if enc.name.startswith("timm:") and enc.finetune_blocks and cfg.data.use_cache:
        raise ConfigError(f"model.encoder.finetune_blocks={enc.finetune_blocks} with model.encoder.name={enc.name!r} "
                          "needs data.use_cache=false: a timm backbone cannot be split below its trainable blocks, "
                          "so the feature cache cannot hold what it starts from; it fine-tunes on images")
    if cfg.train.average_last and not cfg.train.keep_epochs:
        raise ConfigError(f"train.average_last={cfg.train.average_last} averages kept epochs: set "
                          "train.keep_epochs=true too")
    try:
        family.check(cfg.model.attention)  # what the family's tables cannot say
        cfg.train.objective.check(hard_attention(cfg))  # what the objective's tables cannot say
        cfg.train.objective.check_decoder(family)  # and what it needs of the decoder family
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.train.objective.grounding_weight > 0 and not cfg.data.entities:
        raise ConfigError("train.objective.grounding_weight: supervises attention with Flickr30k Entities boxes, but "
                          "data.entities names no folder (build_entities.sh writes Flickr8k's); set it, or weight 0")
    try:  # the eval section's decoding as a whole (diverse beam search: groups that divide the beam, a penalty)
        DecodeOptions.from_config(cfg)
    except DecodeOptionError as err:
        key = {"beam": "beam_size"}.get(err.setting, err.setting)
        raise ConfigError(f"eval.{key}: {err.detail}") from None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config (only the keys it changes, over its chain of bases: config_files.py; a path or a shipped
    config's name) and apply ``key=value`` overrides."""
    if path is None:
        return config_from_file_data({}, overrides)
    file = read_config_file(path, kinded_family_defaults())
    return config_from_file_data(file.data, overrides, source=file.chain[0])


def config_from_file_data(data: Any, overrides: Iterable[str] = (), source: str | Path | None = None) -> Config:
    """A config file's contents (``data``, read from ``source``) with ``overrides`` applied, checked as a run
    reads it: validated, and no key set that the run would ignore (check_read_keys)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    # a --set of a kind first (model.decoder.kind, train.objective.kind): the section's other keys are its kind's
    for text in sorted(overrides, key=lambda t: not _SECTIONS.sets_a_kind(t)):
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
