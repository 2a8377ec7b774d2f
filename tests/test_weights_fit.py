"""A model folder or checkpoint whose config disagrees with its weights (issue 45): the file's tensor shapes
(a safetensors header, a checkpoint's state dict) are checked against the model the config describes, built on
the meta device, before the real model is built. A config.json asking for ``hidden_dim: 65536`` used to build
that model first (tens of GB, then a torch allocator error); it is now refused at once, naming the file, a
tensor and both shapes, and nothing of that size is ever built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import captioner.api as api
from captioner.api import load_captioner, model_shapes
from captioner.store.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from captioner.store.hub import CONFIG_FILE, WEIGHTS_FILE, ModelFolderError, weights_shapes

WIDE = 65536  # an LSTM of this width: weight_hh alone is (4 * 65536, 65536) floats, 68 GB


@pytest.fixture
def no_wide_build(monkeypatch):
    """build_model refuses to build the wide model anywhere but on the meta device: on the old code (the real
    model built first) the test fails here, safely, instead of asking the machine for 68 GB."""
    real = api.build_model

    def guarded(cfg, vocab):
        if cfg.model.decoder.hidden_dim == WIDE and torch.get_default_device().type != "meta":
            raise AssertionError("the model a wrong config describes was built before its weights were checked")
        return real(cfg, vocab)

    monkeypatch.setattr(api, "build_model", guarded)


@pytest.fixture(scope="module")
def folder(smoke_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "smoke"
    load_captioner(smoke_checkpoint, device="cpu").save_pretrained(out, dtype="float32")
    return out


def test_meta_shapes_are_the_built_models(smoke_checkpoint):
    model = load_captioner(smoke_checkpoint, device="cpu")
    assert model_shapes(model.config, model.vocab) == {k: v.shape for k, v in model.state_dict().items()}


def test_a_folder_whose_config_asks_for_a_wider_decoder_is_refused_before_building(folder, tmp_path,
                                                                                      no_wide_build):
    wide = tmp_path / "wide"
    shutil.copytree(folder, wide)
    meta = json.loads((wide / CONFIG_FILE).read_text())
    meta["config"]["model"]["decoder"]["hidden_dim"] = WIDE  # config.json is not digest-checked: only the weights
    (wide / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ModelFolderError) as info:
        load_captioner(wide, device="cpu")
    message = str(info.value)
    assert message.startswith(f"{wide / WEIGHTS_FILE}: its tensors do not fit the model {wide / CONFIG_FILE} "
                              "describes")
    # a tensor, the file's shape and the config's: e.g. the LSTM's recurrent weights
    assert "decoder.lstm.weight_hh: file (128, 32) vs config.json's model (262144, 65536)" in message
    assert load_captioner(folder, device="cpu") is not None  # the folder it was copied from still loads


def test_weights_shapes_reads_the_header_only(folder):
    shapes = weights_shapes(folder / WEIGHTS_FILE)
    model = load_captioner(folder, device="cpu")
    assert shapes == {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_a_checkpoint_whose_config_disagrees_with_its_weights_is_refused_before_building(smoke_checkpoint,
                                                                                           tmp_path, no_wide_build):
    payload = load_checkpoint(smoke_checkpoint)
    payload["config"]["model"]["decoder"]["hidden_dim"] = WIDE  # saved with a valid digest: only the config lies
    path = tmp_path / "wide.pt"
    save_checkpoint(path, payload)
    with pytest.raises(CheckpointError) as info:
        load_captioner(path, device="cpu")
    message = str(info.value)
    assert message.startswith(f"{path}: checkpoint weights do not fit this model")
    assert "decoder.lstm.weight_hh: checkpoint (128, 32) vs model (262144, 65536)" in message
