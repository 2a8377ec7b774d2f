"""Hub-style model folders (captioner/store/hub.py): `captioner export` writes one, `load_captioner` and
`captioner caption --model` read it from a path or, by id, from a Hugging Face cache laid out here with the hub
offline; a damaged file is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from captioner.api import ImageCaptioner, load_captioner
from captioner.cli import main as cli_main
from captioner.store.hub import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, ModelFolderError, split_card

SCORES = {"scores": {"BLEU-1": 41.5, "BLEU-4": 7.25, "METEOR": None, "ROUGE-L": 30.1, "CIDEr-D": 12.345},
          "split": "test", "beam_size": 2, "tokenizer": "ptb", "predictions": {"000001": "a red circle"}}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    state = b.state_dict()
    assert a.state_dict().keys() == state.keys()
    for key, value in a.state_dict().items():
        assert torch.equal(value, state[key]), key


@pytest.fixture(scope="module")
def folder(smoke_checkpoint, tmp_path_factory) -> Path:
    """The smoke model exported in float32 with scores, through the command line."""
    out = tmp_path_factory.mktemp("export") / "tiny-captioner"
    scores = out.parent / "scores.json"
    scores.write_text(json.dumps(SCORES))
    assert cli_main(["export", "--checkpoint", str(smoke_checkpoint), "--format", "hub", str(out), "--dtype",
                     "float32", "--scores", str(scores), "--dataset", "shapes"]) == 0
    return out


def test_export_writes_the_three_files_and_loads_back_bit_for_bit(folder, smoke_checkpoint):
    assert sorted(p.name for p in folder.iterdir()) == sorted([CARD_FILE, CONFIG_FILE, WEIGHTS_FILE])
    original = load_captioner(smoke_checkpoint)
    model = load_captioner(folder)
    _same_weights(model, original)
    assert model.vocab.to_dict() == original.vocab.to_dict()
    meta = json.loads((folder / CONFIG_FILE).read_text())
    assert meta["name"] == "tiny-captioner" and meta["config"]["model"]["decoder"]["hidden_dim"] == 32
    assert meta["fingerprint"] == {**original.encoder.fingerprint(), "vocab_size": len(original.vocab)}
    assert "predictions" not in meta["scores"]
    # the smoke encoder is randomly initialised: its backbone travels in the file
    assert meta["config"]["model"]["encoder"]["pretrained"] is False



def test_a_checkpoint_loads_with_its_config_as_saved_and_exports_it_so(smoke_checkpoint, tmp_path, monkeypatch):
    """The config a checkpoint carries is the loaded model's, unchanged (load_model once rewrote its
    model.encoder.pretrained after reading it): a frozen pretrained backbone still says so, yet its weights come from
    the checkpoint, never from the installed ones; an export then writes that config and leaves the backbone out."""
    import captioner.models.backbones as backbones
    from captioner.config import config_to_dict
    from captioner.store.checkpoint import load_checkpoint, save_checkpoint
    from captioner.store.hub import BACKBONE_PREFIX, weights_shapes
    from captioner.store.saved_config import read_saved_config

    payload = load_checkpoint(smoke_checkpoint / "best.pt", map_location="cpu")
    saved = json.loads(json.dumps(payload["config"]))
    saved["model"]["encoder"]["pretrained"] = True  # a frozen pretrained backbone (finetune_blocks 0)
    save_checkpoint(tmp_path / "best.pt", {"model": payload["model"], "config": saved, "vocab": payload["vocab"],
                                           "epoch": 1})

    def installed_weights(name):
        raise AssertionError(f"{name}: a checkpoint's backbone was read from the installed weights")

    with monkeypatch.context() as patch:
        patch.setattr(backbones, "lite_wheel_file", installed_weights)
        model = load_captioner(tmp_path / "best.pt", device="cpu")
    assert config_to_dict(model.config) == config_to_dict(read_saved_config(saved))
    assert model.config.model.encoder.pretrained is True and model.pretrained_backbone is True
    state = model.state_dict()
    for key, value in payload["model"].items():
        assert torch.equal(state[key], value), key
    out = model.save_pretrained(tmp_path / "folder", dtype="float32")
    assert json.loads((out / CONFIG_FILE).read_text())["config"] == config_to_dict(model.config)
    assert not any(key.startswith(BACKBONE_PREFIX) for key in weights_shapes(out / WEIGHTS_FILE))

def test_the_card_carries_what_a_hub_reads(folder):
    block, body = split_card((folder / CARD_FILE).read_text())
    assert block["library_name"] == "captioner" and block["pipeline_tag"] == "image-to-text"
    assert {"image-captioning", "soft-attention"} <= set(block["tags"])
    assert block["datasets"] == ["shapes"]
    assert block["metrics"] == ["bleu", "rouge", "cider"]  # METEOR was not computed: no value, not listed
    result = block["model-index"][0]["results"][0]
    assert result["dataset"] == {"name": "shapes", "type": "shapes", "split": "test"}
    assert [(m["name"], m["value"]) for m in result["metrics"]] == [
        ("BLEU-1", 41.5), ("BLEU-4", 7.25), ("ROUGE-L", 30.1), ("CIDEr-D", 12.35)]
    assert body.startswith("# tiny-captioner") and "## Fingerprint" in body


def test_re_export_keeps_the_card_text_and_refreshes_its_metadata(folder, tmp_path):
    copy = tmp_path / "again"
    shutil.copytree(folder, copy)
    card = copy / CARD_FILE
    card.write_text(card.read_text().replace("## Fingerprint", "Written by hand.\n\n## Fingerprint")
                    + "\n## Known limits\n\nAlso by hand.\n")
    old_digest = json.loads((copy / CONFIG_FILE).read_text())["weights_sha256"]
    load_captioner(copy).save_pretrained(copy, name="renamed", dtype="float16", scores=SCORES)
    block, body = split_card(card.read_text())
    assert "Written by hand." in body and block["model-index"][0]["name"] == "renamed"
    # the fingerprint section is config.json's: the new weights' digest replaces the old, the text after it stays
    new_digest = json.loads((copy / CONFIG_FILE).read_text())["weights_sha256"]
    assert new_digest != old_digest and f"- weights sha256: `{new_digest}`" in body and old_digest not in body
    assert body.endswith("\n## Known limits\n\nAlso by hand.\n") and body.count("## Fingerprint") == 1
    half = ImageCaptioner.from_pretrained(copy)
    for key, value in load_captioner(folder).state_dict().items():
        expected = value.half().float() if value.is_floating_point() else value
        assert torch.equal(half.state_dict()[key], expected), key


def test_a_damaged_file_is_refused_by_name(folder, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    weights = damaged / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-64])  # truncated
    with pytest.raises(ModelFolderError, match=f"{weights}: SHA-256 .* differs from the .* that config.json records"):
        load_captioner(damaged)
    weights.unlink()
    with pytest.raises(ModelFolderError, match=f"{weights}: missing"):
        load_captioner(damaged)
    (damaged / CONFIG_FILE).write_text('{"format": "captioner-model", "version": 2')
    with pytest.raises(ModelFolderError, match=f"{damaged / CONFIG_FILE}: unreadable model config"):
        load_captioner(damaged)
    (damaged / CONFIG_FILE).write_text('{"architectures": ["BertModel"]}')  # a transformers folder
    with pytest.raises(ModelFolderError, match="config.json: not a captioner model"):
        load_captioner(damaged)


def test_a_hub_id_loads_from_the_local_cache_with_the_hub_offline(folder, tmp_path, monkeypatch, in_hub_cache):
    cache = tmp_path / "hf-cache"
    snapshot = in_hub_cache(cache, "someone/tiny-captioner", folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # "someone/tiny-captioner" is no path here
    model = load_captioner("someone/tiny-captioner")
    _same_weights(model, load_captioner(folder))
    with pytest.raises(ModelFolderError, match=r"someone/absent: no such file or folder, and no model .* in the "
                                               r"Hugging Face cache .*offline.*`hf download someone/absent`"):
        load_captioner("someone/absent")
    blob = (snapshot / WEIGHTS_FILE).resolve()
    blob.write_bytes(blob.read_bytes()[:-8])
    with pytest.raises(ModelFolderError, match=f"{snapshot / WEIGHTS_FILE}: SHA-256"):
        load_captioner("someone/tiny-captioner")


def test_caption_reads_a_folder_and_a_hub_id(folder, tmp_path, monkeypatch, capsys, in_hub_cache):
    photo = tmp_path / "photo.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(photo)
    in_hub_cache(tmp_path / "hf-cache", "someone/tiny-captioner", folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.chdir(tmp_path)
    captions = []
    for model in (str(folder), "someone/tiny-captioner"):
        assert cli_main(["caption", str(photo), "--model", model, "--beam", "2", "--json"]) == 0
        captions.append(json.loads(capsys.readouterr().out)["results"][0]["caption"])
    assert captions[0] == captions[1] and captions[0]
    assert cli_main(["caption", str(photo), "--model", "someone/absent"]) == 2
    assert "hf download someone/absent" in capsys.readouterr().err
