"""The names of every choice a config can make, in one torch-free module below the config and the code.

The config checks a run's choices at load (an unknown ``model.attention.scorer`` is refused there, listing the
valid ones) without importing the models, the data readers or torch: of the package, ``captioner/config.py``
imports only this module, the decoder families' torch-free configs (below) and ``atomic.py`` (to write a
config). The code that behaves differently per name owns the behaviour:

- plain tuples are defined here once and imported by that code: DECODING_MODES (``models/attention.py``,
  ``decoding/options.py``, ``commands/arguments.py``), SPLITS (``data/datasets.py``, ``commands/evaluate.py``,
  ``commands/extract.py``, ``commands/score.py``), OPTIMIZERS (``training/optim.py``), WANDB_MODES
  (``training/wblog.py``, as MODES) and ENSEMBLE_ATTENTIONS (``models/ensemble.py``, ``commands/caption.py``,
  ``commands/evaluate.py``);
- what a name builds is registered here once, as a lazy ``"module:attr"`` path (registration.Registry): SCORERS
  (``models/scorers.py``), ATTENTIONS (``models/attention.py``), DATA_FORMATS (``data/datasets.py``), BACKBONES
  (``models/backbones.py``), GROUNDING_SOURCES (``evaluation/regions.py``) and GROUNDING_METRICS
  (``evaluation/grounding.py``, ``evaluation/localization.py``); the code builds through them, and no other table
  of those names exists.

The decoder families and the training objectives are not named here: each owns its section (``model.decoder``,
``train.objective``), a torch-free dataclass the config reads through its family's table (``captioner/models/
decoders``' DECODERS, ``captioner/objective_sections.py``'s OBJECTIVES: its kinds, keys, values and checks), which
names its class (captioner/registration.py).

Adding a scorer, an attention read, a data format, a backbone, a grounding source or a grounding metric is its code
and one line in its registry here.
"""

from __future__ import annotations

from captioner.registration import Registry

# model.attention.scorer: the scoring functions (Xu et al. 2015, Eq. (4)'s f_att and its variants, models/scorers.py)
SCORERS = Registry("model.attention.scorer", {
    "additive": "captioner.models.scorers:AdditiveScorer",
    "dot": "captioner.models.scorers:DotScorer",
    "scaled_dot": "captioner.models.scorers:ScaledDotScorer",
    "bilinear": "captioner.models.scorers:BilinearScorer",
})


def check_heads(dim: int, heads: int, name: str = "model.attention.attention_dim") -> None:
    """ValueError unless ``dim`` (named ``name``) splits into ``heads`` equal heads: the one check of it, for the
    config (the decoder families' sections) and the modules alike."""
    if dim % heads:
        raise ValueError(f"{name} ({dim}) must be divisible by model.attention.heads ({heads})")


# model.attention.attention: how a step reads the grid (models/attention.py), each class built by its ``build``
ATTENTIONS = Registry("model.attention.attention", {
    "soft": "captioner.models.attention:SoftAttention",
    "hard": "captioner.models.attention:HardAttention",
    "key_value": "captioner.models.attention:KeyValueAttention",
    "multi_head": "captioner.models.attention:MultiHeadAttention",
})
# decoding/options.py: how a model may read while decoding (one vocabulary: "expectation" is the soft read;
# "argmax" and "sample" read one cell per word); models/attention.py adds the training-only "gumbel"
DECODING_MODES = ("expectation", "argmax", "sample")
# optim.py
OPTIMIZERS = ("adam", "rmsprop")
# wblog.py: train.wandb
WANDB_MODES = ("off", "offline", "online")
# models/ensemble.py: ATTENTION_SHOWN, whose map an ensemble's overlays show (a decoding choice of the
# command line and load_captioner, not of the config; named here so `captioner caption --help` needs no torch)
ENSEMBLE_ATTENTIONS = ("first", "mean")
# data.format: the readers of each data set's records, (DataConfig, split) -> records (data/datasets.py)
DATA_FORMATS = Registry("data.format", {
    "shapes": "captioner.data.datasets:load_shapes",
    "karpathy": "captioner.data.datasets:load_karpathy",
    "coco": "captioner.data.datasets:load_coco",
    "flickr8k": "captioner.data.datasets:load_flickr8k",
    "captions": "captioner.data.datasets:load_captions",
})
# model.encoder.name: the backbones, each its family's builder and stage table (models/backbones.py); any other
# name is ``timm:<timm model name>``
BACKBONES = Registry("model.encoder.name", {
    "efficientnet_lite0": "captioner.models.backbones:EFFICIENTNET_LITE0",
    "efficientnet_lite1": "captioner.models.backbones:EFFICIENTNET_LITE1",
    "efficientnet_lite2": "captioner.models.backbones:EFFICIENTNET_LITE2",
    "resnet50": "captioner.models.backbones:RESNET50",
    "resnet101": "captioner.models.backbones:RESNET101",
    "resnet152": "captioner.models.backbones:RESNET152",
    "vgg16": "captioner.models.backbones:VGG16",
    "vgg19": "captioner.models.backbones:VGG19",
})
# the grounding sources, per photo and caption the region each word names (evaluation/regions.py): the shapes
# records' objects, COCO instance masks (captioner evaluate --instances), Flickr30k Entities (data.entities)
GROUNDING_SOURCES = Registry("grounding source", {
    "shapes": "captioner.evaluation.regions:ShapesObjects",
    "coco": "captioner.evaluation.regions:CocoInstances",
    "flickr30k_entities": "captioner.evaluation.regions:Flickr30kEntities",
})
# the grounding metrics on boxes (evaluation/grounding.BoxGrounding), each a class with ``build`` (grid, the
# annotations, the classes' photo cut), ``add`` (one caption read: grounding.CaptionRead), ``figures`` (merged into
# the evaluation's "boxes") and ``lines`` (its rows of the table); validation computes the first only
GROUNDING_METRICS = Registry("grounding metric", {
    "pointing": "captioner.evaluation.grounding:PointingFigures",
    "localization": "captioner.evaluation.localization:LocalizationFigures",
})
# the splits every format knows
SPLITS = ("train", "val", "test")
# training/loop.py: the learning-rate schedule over train.epochs and the autocast dtype
LR_SCHEDULES = ("none", "step", "cosine")
AMP_MODES = ("none", "bf16", "fp16")
# training/distributed.py: the process group's backend under torchrun (auto: nccl on CUDA, gloo on the CPU)
DDP_BACKENDS = ("auto", "nccl", "gloo")
# training/loop.py: the metric that picks best.pt (evaluation/metrics.py computes every one)
VAL_METRICS = ("BLEU-4", "CIDEr-D", "METEOR", "ROUGE-L", "BLEU-1")
# training/tblog.py: train.tensorboard
TENSORBOARD_MODES = ("auto", "on", "off")
# training/losses.py and train.objective.baseline (objective_sections.py): the self-critical baseline
SCST_BASELINES = ("mean", "greedy")
# models/decoders/show_attend_tell_compiled.py (TORCH_MODES): train.compile, the decoder's step compiled by
# torch.compile; off (eager) | inductor (fused kernels, the CPU too) | cudagraphs (one CUDA graph per step, CUDA only)
COMPILE_MODES = ("off", "inductor", "cudagraphs")

# The allowed values and ranges of the config's settings, keyed by dotted path: config.validate checks them.
CHOICES: dict[str, tuple[str, ...]] = {
    "data.format": tuple(DATA_FORMATS),
    "model.attention.scorer": tuple(SCORERS),
    "model.attention.attention": tuple(ATTENTIONS),
    "train.optimizer": OPTIMIZERS,
    "train.lr_schedule": LR_SCHEDULES,
    "train.amp": AMP_MODES,
    "train.ddp_backend": DDP_BACKENDS,
    "train.tensorboard": TENSORBOARD_MODES,
    "train.compile": COMPILE_MODES,
    "train.wandb": WANDB_MODES,
    "train.val_metric": VAL_METRICS,
    "eval.split": SPLITS,
    "eval.attention_mode": DECODING_MODES,
}
POSITIVE = (
    "data.max_length", "data.shapes.image_size", "model.encoder.input_size",
    "model.attention.heads", "model.attention.attention_dim", "train.epochs", "train.batch_size", "train.lr",
    "train.encoder_lr", "train.lr_step_epochs", "train.log_every", "train.patience",
    "train.max_nonfinite_steps", "eval.beam_size", "eval.batch_size", "train.ddp_timeout_min",
)
NON_NEGATIVE = (
    "data.min_count", "data.num_workers", "data.shapes.n_train", "data.shapes.n_val",
    "data.shapes.n_test", "model.encoder.grid_size", "model.encoder.proj_dim",
    "model.encoder.finetune_blocks", "model.encoder.self_attention_layers", "train.weight_decay",
    "train.grad_clip", "train.val_max_images", "train.time_budget_s", "train.save_every_min", "train.num_threads",
    "eval.length_penalty",
    "eval.max_length", "train.tensorboard_images", "train.average_last",
)
UNIT_INTERVAL = (
    "data.max_failure_share", "data.val_share",
    "data.test_share", "train.lr_gamma",
)
