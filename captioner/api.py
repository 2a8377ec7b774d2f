"""The application layer: config -> model, checkpoint -> model, images -> words.

``build_model(cfg, vocab)`` is the one translation of the config into constructor arguments
(detectron2's ``from_config`` kept apart from the modules): training, ``captioner extract``,
evaluation, the shipped models and checkpoint loading all build through it. The modules under
``captioner/models/`` know tensors and token ids only; ``ImageCaptioner`` adds what the application
knows, the vocabulary and the resolved config, and ``caption()``, which turns images into words with
their per-word attention (Xu et al. 2015, §5.4's visualisations). ``load_captioner`` returns the
model together with its preprocessing (``model.transform``), as CLIP's ``load`` does.

Loading sits on top of the modules that know where models live: checkpoints (captioner/store/checkpoint.py),
Hub-style model folders (captioner/store/hub.py: the format, read and written) and the shipped models
(captioner/store/zoo.py: the catalogue). Those import nothing from here; this module builds the models they
describe (``load_model_folder``, ``load_shipped``) and writes them (``export_model``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from captioner.config import Config, EncoderConfig
from captioner.data.vocab import Vocab
from captioner.decoding.options import DecodeOptions
from captioner.models.attention import SelfAttentionEncoder
from captioner.models.captioner import Captioner, GridPositionEmbedding
from captioner.models.decoders.contract import CaptionDecoder
from captioner.models.decoders.registry import build_decoder
from captioner.models.encoder import Encoder, build_encoder
from captioner.models.ensemble import CaptionerEnsemble, cells_shown_words, check_attention_shown
from captioner.runtime import as_device
from captioner.store import zoo
from captioner.store.checkpoint import CheckpointError, check_state_dict, check_vocab, load_checkpoint
from captioner.store.hub import read_model_folder, save_model_folder
from captioner.store.locate import load_weights, locate
from captioner.store.saved_config import read_saved_config


class CaptionsInWords:
    """What turns a captioner's token ids into words, shared by one model (``ImageCaptioner``) and an ensemble
    (``ImageCaptionerEnsemble``): ``words`` and ``caption``. Needs ``self.vocab`` and a Captioner's decoding
    (``transform``, ``encode``, ``decode_options``, ``generate``, ``grid_hw``, ``device``)."""

    @property
    def caption_options(self) -> DecodeOptions:
        """How a caption for people is decoded when nothing says otherwise: the model's options (its config's
        eval section) ``for_people`` (<unk> forbidden). ``caption``, ``captioner caption`` and the demo page
        (serving.server.page_options) start from these. An ensemble's read may still be to choose
        (models/ensemble.UnchosenRead: ``caption(images, attention_mode=...)`` chooses it, ``caption(images)``
        refuses naming the members' reads)."""
        return self.decode_options.for_people()

    def words(self, hyp: Any) -> list[str]:
        """A hypothesis's token ids as words (<unk> kept: scores and captions show what was decoded)."""
        return self.vocab.decode(hyp.tokens, keep_unk=True)

    @torch.no_grad()
    def caption(self, images: Sequence[Any], options: DecodeOptions | None = None, **settings: Any) -> list[dict]:
        """Caption PIL images or image paths, decoded with ``options`` (default: ``caption_options``, the
        model's with <unk> forbidden: captions here are for people) and then ``settings``, any DecodeOptions
        field given by name (``caption(images, beam=5, n_best=3)``): the Python API's one merge of settings
        (the commands merge their flags once and pass the options whole).

        Returns, per image, a dict: ``caption`` (str), ``words``, ``alphas`` (numpy, (n_words, L)),
        ``grid_hw`` (H, W), ``score`` (sum of log-probabilities), ``attention_mode``, ``locations``
        (the grid cell read per word in hard attention's "sample"/"argmax" modes, else None) and
        ``n_best`` (every hypothesis as {caption, words, score}).
        """
        from captioner.data.images import load_image

        base = options if options is not None else self.caption_options
        options = base.replace_given(**settings)  # generate checks them against the model
        pil = [load_image(im) if isinstance(im, (str, Path)) else im for im in images]
        if not pil:
            return []
        was_training = self.training
        self.eval()
        try:
            batch = torch.stack([self.transform(im) for im in pil]).to(self.device)  # (B, 3, S, S)
            grid = self.encode(batch)  # (B, L, D)
            hyps = self.generate(grid, options)
        finally:
            self.train(was_training)
        return [self._result(per_image, grid.size(1), options.attention_mode) for per_image in hyps]

    def _result(self, per_image: list[Any], locations: int, mode: str) -> dict:
        best = per_image[0]
        words = self.words(best)
        alphas = (best.alphas.float().cpu().numpy() if best.alphas is not None
                  else np.zeros((len(best.tokens), locations), dtype=np.float32))  # (n_words, L)
        return {
            "caption": " ".join(words),
            "words": words,
            "alphas": alphas[: len(words)],
            "grid_hw": self.grid_hw,
            "score": float(best.score),
            "attention_mode": mode,
            "locations": None if best.locations is None else best.locations[: len(words)],
            "n_best": [{"caption": " ".join(w), "words": w, "score": float(h.score)}
                       for h, w in ((h, self.words(h)) for h in per_image)],
        }


class ImageCaptioner(CaptionsInWords, Captioner):
    """A ``Captioner`` with the vocabulary its ids refer to and the config it was built from.

    What ``build_model`` and ``load_captioner`` return: an ``nn.Module`` (training updates it, its
    state dict is the Captioner's) whose ``caption`` speaks words. ``shipped_name`` is set when it is
    one of the models shipped with the package (captioner/store/zoo.py); ``pretrained_backbone`` says whether
    its backbone holds the installed pretrained weights (a model folder then leaves them out).
    ``save_pretrained`` / ``from_pretrained`` are the ecosystem's names for writing and reading a
    Hub-style model folder (captioner/store/hub.py).
    """

    def __init__(self, encoder: Encoder, decoder: CaptionDecoder, vocab: Vocab, config: Config,
                 **kwargs: Any) -> None:
        super().__init__(encoder, decoder, start_id=vocab.start_id, end_id=vocab.end_id, pad_id=vocab.pad_id,
                         unk_id=vocab.unk_id, **kwargs)
        self.vocab = vocab
        self.config = config
        self.shipped_name: str | None = None
        self.pretrained_backbone = has_installed_backbone(config)

    def save_pretrained(self, directory: str | Path, **card: Any) -> Path:
        """Write this model as a Hub-style folder (``captioner.store.hub.save_model_folder``: ``name``, ``dtype``,
        ``scores``, ``dataset``); ``load_captioner(directory)`` reads it back."""
        return save_model_folder(self, directory, **card)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: Any = "auto") -> "ImageCaptioner":
        """``load_captioner``: a model folder, a hub id (owner/name), a shipped name or a checkpoint."""
        return load_captioner(name_or_path, device=device)


class ImageCaptionerEnsemble(CaptionsInWords, CaptionerEnsemble):
    """Several models with one vocabulary and one backbone captioning as one (models/ensemble.py: the mean of
    their word log-probabilities at each step of the search): what ``load_captioner`` returns for several paths.

    ``vocab`` and ``config`` are the first member's (its eval settings are the ensemble's defaults, its data
    section what ``captioner evaluate`` reads); ``sources`` name the members (their paths). Every member reads
    the same way: as each reads on its own (its eval.attention_mode) when those agree; when they differ (a soft
    model beside a hard one reading argmax) the mode must be given (``attention_mode=``, ``--attention-mode``),
    else decoding is refused naming each member's read (models/ensemble.py). Each caption's dict also carries
    ``ensemble``: the sources, which attention its ``alphas`` are ("first" member's or "mean") and whose cells its
    ``locations`` are (``cells``: the first member's reads, or the arg-max of the mean attention).

    Args:
        members: the loaded models; the first one's vocabulary is every member's (else a CheckpointError
            naming the member's source), and its encoder too (else a ValueError naming it).
        sources: where each member came from, for messages and outputs.
        attention: "first" or "mean" (models/ensemble.py's ATTENTION_SHOWN).
    """

    def __init__(self, members: Sequence[ImageCaptioner], sources: Sequence[str], attention: str = "first") -> None:
        for source, member in zip(sources[1:], members[1:]):
            _check_same_words(members[0], sources[0], member, source)
        super().__init__(members, attention=attention, names=[str(s) for s in sources])
        self.vocab = members[0].vocab
        self.config = members[0].config

    @property
    def sources(self) -> list[str]:
        return list(self.names)

    @property
    def ensemble(self) -> dict:
        """What the outputs say about this ensemble: its members' sources, the attention shown and whose cells the
        one-cell reads report."""
        return {"members": self.sources, "attention": self.attention_shown,
                "cells": cells_shown_words(self.attention_shown, self.sources[0])}

    def _result(self, per_image: list[Any], locations: int, mode: str) -> dict:
        return {**super()._result(per_image, locations, mode), "ensemble": self.ensemble}


def _check_same_words(first: ImageCaptioner, first_source: str, member: ImageCaptioner, source: str) -> None:
    """checkpoint.check_vocab between a member and the first: an ensemble averages log-probabilities id by id."""
    try:
        check_vocab(member.vocab, first.vocab)
    except CheckpointError as err:
        raise CheckpointError(f"{source}: cannot join an ensemble with {first_source}, whose word ids mean other "
                              f"words: {err} (checkpoint: {source}; given: {first_source})") from None


def has_installed_backbone(cfg: Config) -> bool:
    """Whether the backbone's weights are the installed pretrained ones, never changed by training (a frozen
    pretrained encoder): a model folder then leaves them out and rebuilds them from the installation."""
    return cfg.model.encoder.pretrained and cfg.model.encoder.finetune_blocks == 0


def build_encoder_from_config(enc: EncoderConfig, pretrained: bool | None = None) -> Encoder:
    """``model.encoder`` -> the Encoder (config sentinels 0 / -1 / "" become the constructor's None). ``pretrained``
    None reads ``enc.pretrained``; False builds the backbone without its pretrained weights whatever the config
    says (``build_model``'s ``pretrained``), leaving the config as it is."""
    return build_encoder(
        name=enc.name,
        pretrained=enc.pretrained if pretrained is None else pretrained,
        weights_path=enc.weights_path or None,
        input_size=enc.input_size,
        stage=None if enc.stage < 0 else enc.stage,
        grid_size=enc.grid_size or None,
        proj_dim=enc.proj_dim or None,
        finetune_blocks=enc.finetune_blocks,
        update_bn_stats=enc.update_bn_stats,
    )


def _build_refine(cfg: Config, encoder: Encoder) -> nn.Module | None:
    """The optional grid refinement after the cache: position embedding, then self-attention."""
    enc = cfg.model.encoder
    layers: list[nn.Module] = []
    if enc.position_embedding:
        H, W = encoder.grid_hw
        layers.append(GridPositionEmbedding(H * W, encoder.out_dim))
    if enc.self_attention_layers > 0:
        layers.append(SelfAttentionEncoder(dim=encoder.out_dim, layers=enc.self_attention_layers,
                                           heads=cfg.model.attention.heads))
    return nn.Sequential(*layers) if layers else None


def build_model(cfg: Config, vocab: Vocab, pretrained: bool | None = None) -> ImageCaptioner:
    """The one translation of config into constructor arguments. ``pretrained`` False builds the backbone without
    reading its pretrained weights (a checkpoint's weights replace them: ``load_model``) while the model keeps
    ``cfg`` as given, so it still says what the model is (``pretrained_backbone``, what an export leaves out);
    None: as ``cfg.model.encoder.pretrained`` says."""
    encoder = build_encoder_from_config(cfg.model.encoder, pretrained=pretrained)
    refine = _build_refine(cfg, encoder)
    # model.decoder is its family's section (model.decoder.kind); it also reads the model.attention keys it names
    decoder = build_decoder(cfg.model.decoder, cfg.model.attention, vocab_size=len(vocab),
                            feature_dim=encoder.out_dim, pad_id=vocab.pad_id)
    return ImageCaptioner(encoder, decoder, vocab, cfg, refine=refine, attention_kind=decoder.attention_kind,
                          decode_options=DecodeOptions.from_config(cfg))


def model_shapes(cfg: Config, vocab: Vocab) -> dict[str, torch.Size]:
    """The shape of every tensor in the state dict of the model ``build_model(cfg, vocab)`` would build, from a
    build on the meta device: no memory, no weight file read. What loading checks a file's tensors against
    before building the real model."""
    cfg = copy.deepcopy(cfg)
    cfg.model.encoder.pretrained, cfg.model.encoder.weights_path = False, ""  # the shapes need no weights
    with torch.device("meta"):
        model = build_model(cfg, vocab)
    return {key: value.shape for key, value in model.state_dict().items()}


def load_captioner(path: str | Path | Sequence[str | Path] | None = None, device: Any = "auto",
                   ensemble_attention: str | None = None) -> ImageCaptioner | ImageCaptionerEnsemble:
    """Rebuild a captioner from ``path``, one of the sources ``load_model`` reads (nothing: the shipped model),
    or from a list or tuple of several: an ensemble of those models (``load_ensemble``, whose attention shown
    is ``ensemble_attention``, "first" by default; asking for it with one model is an error). A list of one
    is that model.

    ``device``: a name ("auto": CUDA when present, "cpu", "cuda:1"), resolved here by runtime.resolve_device, or a
    torch.device already resolved (the commands resolve --device once and pass it), used as it is
    (runtime.as_device). The loaders below are handed the resolved one and resolve nothing again."""
    device = as_device(device)  # before minutes of loading: "cuda" without CUDA is refused here
    if isinstance(path, (list, tuple)):
        if len(path) > 1:
            return load_ensemble(path, device=device, attention=ensemble_attention or "first")
        if not path:
            raise ValueError("load_captioner: an empty list of models")
        (path,) = path
    if ensemble_attention is not None:
        raise ValueError(f"ensemble_attention={ensemble_attention!r} needs two or more models; got one: {path}")
    return load_model(path, device=device)


def load_ensemble(paths: Sequence[str | Path], device: Any = "auto", attention: str = "first"
                  ) -> ImageCaptionerEnsemble:
    """An ensemble of the models at ``paths`` (each anything ``load_model`` reads): they decode together,
    the mean of their word log-probabilities at each step (models/ensemble.py), every one reading the same way
    (``ImageCaptionerEnsemble``), their captions' attention the first model's or the mean (``attention``).
    Refused, naming the file, when a model's vocabulary differs from the first's (CheckpointError) or its encoder
    does (ValueError: an image is encoded once for all). ``device`` as ``load_captioner`` takes it."""
    check_attention_shown(attention)  # before minutes of loading
    device = as_device(device)
    if len(paths) < 2:
        raise ValueError(f"an ensemble needs two or more models, got {len(paths)}")
    sources = [str(p) for p in paths]
    members = [load_model(p, device=device) for p in paths]
    ensemble = ImageCaptionerEnsemble(members, sources, attention=attention)
    ensemble.eval()
    return ensemble


def load_model(path: str | Path | None = None, device: Any = "auto") -> ImageCaptioner:
    """Rebuild one captioner from what ``path`` names, by the one rule of ``store.locate.locate`` (in this order):

    - nothing, or a shipped model's name (``"flickr8k"``): the pretrained model shipped with the package
      (captioner/store/zoo.py);
    - a model folder (model.safetensors + config.json + README.md: ``captioner export``, captioner/store/hub.py);
    - a hub model id, ``"owner/name"``, that is not a path: that model folder from huggingface_hub's local
      cache, downloaded there first unless the hub is offline (``HF_HUB_OFFLINE=1``);
    - a checkpoint file, or a run directory: its best.pt, else its last.pt.

    A checkpoint carries the resolved config and the vocabulary; the model is rebuilt with
    ``pretrained=False`` (its weights, encoder included, come from the checkpoint; the config it carries is the
    checkpoint's, unchanged) and the state dict is checked key by key, so a mismatch names the field that differs.
    ``device`` as ``load_captioner`` takes it.
    """
    device = as_device(device)  # before minutes of loading
    source = locate(path, prefer="best")
    if source.kind == "shipped":
        return load_shipped(source.path.name, device=device)
    if source.kind != "checkpoint":  # a model folder, exported or in the hub's cache
        return load_model_folder(source.path, device=device)
    path = source.path  # the file: a run directory's best.pt or last.pt
    payload = load_checkpoint(path, map_location="cpu")
    for key in ("config", "vocab", "model"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint has no {key!r} entry (keys: {', '.join(payload)})")
    try:
        cfg = read_saved_config(payload["config"], path)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    try:
        vocab = Vocab.from_dict(payload["vocab"])
    except (ValueError, TypeError, KeyError) as err:
        raise CheckpointError(f"{path}: the stored vocabulary is invalid: {err}") from None
    # Checked against the model the config describes, built on the meta device, before the real one: a config
    # that disagrees with its weights (hidden_dim: 65536) is refused here instead of allocating tens of GB.
    check_state_dict(payload["model"], model_shapes(cfg, vocab), source=path)
    # The weights come from the checkpoint: the backbone is built without reading its pretrained ones (never the
    # network), while the model keeps the config as saved (its pretrained_backbone: an export leaves those out)
    model = build_model(cfg, vocab, pretrained=False)
    load_weights(model, payload["model"], path)
    model.to(device)
    model.eval()
    return model


def load_model_folder(directory: str | Path, device: Any = "auto") -> ImageCaptioner:
    """The captioner in a Hub-style model folder (captioner/store/hub.py), in float32, eval mode, on ``device``. The
    weights file must have the SHA-256 config.json records, tensors of the shapes of the model its config
    describes (read from the file's header and checked before that model is built), and the installed encoder the
    fingerprint it records. ``device`` as ``load_captioner`` takes it."""
    device = as_device(device)  # before the weights are read
    cfg, vocab, tensors, meta = read_model_folder(directory, expected_shapes=model_shapes)
    model = build_model(cfg, vocab)
    load_weights(model, tensors, directory, folder=meta)
    model.to(device)
    model.eval()
    return model


def load_shipped(name: str | None = None, device: Any = "auto") -> ImageCaptioner:
    """The shipped captioner ``name`` (default: ``zoo.DEFAULT_MODEL``), in fp32, eval mode, on ``device`` (as
    ``load_captioner`` takes it)."""
    folder = zoo.shipped_folder(name)
    model = load_model_folder(folder, device=device)
    model.shipped_name = folder.name
    return model


def export_model(checkpoint: str | Path, out_dir: str | Path, name: str | None = None, dtype: str = "float16",
                 scores: dict | None = None, dataset: str | None = None, group: int | None = None) -> Path:
    """Write the model of ``checkpoint`` (a checkpoint, run directory or model folder) as a model folder
    (``captioner export``); ``group``: int8's entries per scale (default store/quantize.GROUP). A model folder's
    weights keep the source it records (the training checkpoint they came from), whatever their dtype now."""
    from captioner.store.hub import is_model_folder, read_model_config

    model = load_captioner(checkpoint)
    source = str(checkpoint)
    if is_model_folder(checkpoint):
        source = read_model_config(Path(checkpoint)).get("source_checkpoint") or source
    return save_model_folder(model, out_dir, name=name, dtype=dtype, scores=scores, dataset=dataset, source=source,
                             group=group)
