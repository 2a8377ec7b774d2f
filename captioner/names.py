"""The names of every choice a config can make, in one torch-free module below the config and the code.

The config checks a run's choices at load (an unknown ``model.decoder.kind`` is refused there, listing the
valid ones) without importing the models, the data readers or torch: of the package, ``captioner/config.py``
imports only this module (and ``atomic.py``, to write a config). The code that behaves differently per name
owns the behaviour:

- plain tuples are defined here once and imported by that code: DECODING_MODES (``models/attention.py``,
  ``decoding/options.py``, ``commands/arguments.py``), SPLITS (``data/datasets.py``, ``commands/evaluate.py``,
  ``commands/extract.py``, ``commands/score.py``), GATES (``models/decoders/show_attend_tell.py``), OPTIMIZERS
  (``training/optim.py``), WANDB_MODES (``training/wblog.py``, as MODES) and ENSEMBLE_ATTENTIONS
  (``models/ensemble.py``, ``commands/caption.py``, ``commands/evaluate.py``);
- registries of classes or functions stay beside their code and are checked against their tables here by
  tests/test_config.py (same keys, same order): SCORERS (``models/scorers.py``), ATTENTIONS
  (``models/attention.py``), DECODERS (``models/decoders``), LOADERS (``data/datasets.py``), ESTIMATORS
  (``training/estimators.py``, against HARD_ESTIMATORS); so is each decoder's constructor signature against
  DECODER_ARGUMENTS.

Adding a scorer, an attention, a decoder, a data format or an estimator takes its name here as well as its
entry in the registry; the test says which table lags.
"""

from __future__ import annotations

# models/scorers.py: SCORERS (Xu et al. 2015, Eq. (4)'s f_att and its variants)
SCORER_NAMES = ("additive", "dot", "scaled_dot", "bilinear")
# models/attention.py: ATTENTIONS
ATTENTION_NAMES = ("soft", "hard", "key_value", "multi_head")
# decoding/options.py: how a model may read while decoding (one vocabulary: "expectation" is the soft read;
# "argmax" and "sample" read one cell per word); models/attention.py adds the training-only "gumbel"
DECODING_MODES = ("expectation", "argmax", "sample")
# models/decoders/show_attend_tell.py: the beta gate of Sec. 4.2.1 (scalar, as in the paper), per channel, or none
GATES = ("scalar", "vector", "none")
# models/decoders: DECODERS, and the constructor arguments of each kind (config field names equal them:
# api.build_model passes a kind the model.attention and model.decoder fields it takes; the config refuses
# the others when set)
DECODER_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "lstm": ("vocab_size", "feature_dim", "embed_dim", "hidden_dim", "attention_dim", "scorer", "attention",
             "heads", "gate", "dropout", "pad_id", "feature_dropout"),
    "transformer": ("vocab_size", "feature_dim", "embed_dim", "hidden_dim", "layers", "heads", "dropout",
                    "feature_dropout", "overlay_layer", "pad_id"),
}
DECODER_KINDS = tuple(DECODER_ARGUMENTS)
# training/estimators.py: ESTIMATORS, how hard attention's location policy learns under cross-entropy
# (REINFORCE: paper, loo; the straight-through Gumbel-softmax read: gumbel)
HARD_ESTIMATORS = ("paper", "loo", "gumbel")
# optim.py
OPTIMIZERS = ("adam", "rmsprop")
# wblog.py: train.wandb
WANDB_MODES = ("off", "offline", "online")
# models/ensemble.py: ATTENTION_SHOWN, whose map an ensemble's overlays show (a decoding choice of the
# command line and load_captioner, not of the config; named here so `captioner caption --help` needs no torch)
ENSEMBLE_ATTENTIONS = ("first", "mean")
# data/datasets.py: LOADERS (data.format) and the splits every format knows
DATA_FORMATS = ("shapes", "karpathy", "coco", "flickr8k", "captions")
SPLITS = ("train", "val", "test")
