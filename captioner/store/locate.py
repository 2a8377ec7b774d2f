"""What a model path names, by one rule, and the one way its weights go into a model (issue 46).

Every place that takes a model from the user reads the text the same way (``locate``): ``load_captioner`` and
``captioner caption --model`` / ``evaluate`` / ``export`` (api.load_model, ``prefer="best"``), ``train.init``
(training/resume.load_init, ``prefer="best"``) and ``--resume`` (training/resume.resume_payload, ``prefer="last"``,
no hub ids). What it names is a model folder (a shipped model, an exported folder, a hub model in the Hugging Face
cache: weights, config and vocabulary; captioner/store/hub.py) or a checkpoint file (weights and the training
state; captioner/store/checkpoint.py), and ``load_weights`` puts either's weights into the model built from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from captioner.store import zoo
from captioner.store.checkpoint import check_state_dict, resolve_checkpoint_path
from captioner.store.hub import hub_model_folder, is_model_folder, load_folder_weights, looks_like_repo_id
from captioner.store.rundir import PREFER

KINDS = ("shipped", "folder", "hub", "checkpoint")


@dataclass(frozen=True)
class Located:
    """What a model path names (``locate``). ``kind`` is one of KINDS; ``path`` is the model folder to read
    (``hub.read_model_folder``) for "shipped", "folder" and "hub", the checkpoint file (``load_checkpoint``) for
    "checkpoint" (a run folder's best.pt or last.pt, never the folder)."""

    kind: str
    path: Path


def locate(given: str | Path | None, prefer: str = "best", hub: bool = True) -> Located:
    """What ``given`` names: the first of these that applies.

    1. nothing (None), or a shipped model's name or alias (``"flickr8k"``, captioner/store/zoo.py) that is no
       existing path: that shipped model's folder (None: the default model);
    2. an existing folder holding config.json: a model folder (``captioner export``, captioner/store/hub.py);
    3. ``"owner/name"`` that is no existing path: a hub model id, whose folder in huggingface_hub's local cache is
       the model, downloaded there first unless the hub is offline (``HF_HUB_OFFLINE=1``: a model not in the cache
       is a ModelFolderError naming the id and how to fetch it). Not tried when ``hub`` is False (a caller that
       needs a training state, which no hub model holds): the text is then read as a path, by rule 4;
    4. anything else is a checkpoint: a file, or a run folder standing for one of its files by ``prefer``:
       ``"best"``: best.pt, else last.pt (the model to caption with or start from); ``"last"``: last.pt alone (the
       latest state, what --resume continues). A missing path, or a run folder holding none of those files, is a
       CheckpointError naming it ("checkpoint not found: ...").

    An existing path wins over a name: a folder called flickr8k in the working directory is that folder, and
    runs/x a path, not a hub id, once it exists. Nothing is read here but the hub's cache (rule 3).
    """
    if prefer not in PREFER:
        raise ValueError(f"prefer={prefer!r}: a run folder stands for its {' or its '.join(map(repr, PREFER))} "
                         "checkpoint")
    if given is None:
        return Located("shipped", zoo.shipped_folder(None))
    text = str(given)
    if zoo.is_shipped_name(text):
        return Located("shipped", zoo.shipped_folder(text))
    if is_model_folder(text):
        return Located("folder", Path(text))
    if hub and looks_like_repo_id(text):
        return Located("hub", hub_model_folder(text))
    return Located("checkpoint", resolve_checkpoint_path(text, prefer))


def load_weights(model: nn.Module, weights: Mapping[str, torch.Tensor], source: str | Path,
                 folder: dict | None = None) -> None:
    """Put ``weights`` into ``model``, built from the config and vocabulary they came with; checked tensor by tensor
    first (a CheckpointError names ``source``, each key that does not fit and both shapes).

    - a model folder's (``folder``: its config.json, as ``hub.read_model_folder`` returns it): the float16 weights
      cast to the model's dtypes, without a pretrained backbone (the installed one, whose fingerprint must be the
      one config.json records; ``hub.load_folder_weights``);
    - a checkpoint's state dict (``folder`` None): every tensor, loaded as saved, so a run that starts from it
      starts from exactly those floats.
    """
    if folder is not None:
        load_folder_weights(model, weights, folder, source)
    else:
        check_state_dict(weights, model.state_dict(), source=source)
        model.load_state_dict(weights)
