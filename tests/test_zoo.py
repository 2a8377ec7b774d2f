"""The shipped pretrained Flickr8k captioner (captioner/zoo.py, captioner/pretrained/): it loads offline
without executing code, fits its size limit, matches its model card, and says sensible things about
real photographs (scikit-image's bundled ones, which are not in Flickr8k)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import captioner
from captioner.cli import main as cli_main
from captioner.demo import sample_photo
from captioner.api import load_captioner
from captioner.zoo import (DEFAULT_MODEL, SHIPPED_DIR, ShippedModelError, available_models, export_model,
                           load_shipped)

PEOPLE = {"man", "woman", "person", "girl", "boy", "lady", "men", "women", "people", "child", "guy", "player"}
ANIMALS = {"cat", "dog", "cats", "dogs", "kitten", "puppy"}
MAX_BYTES = 25 * 1000 * 1000


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(2)
    return load_captioner()  # no argument: the shipped default


@pytest.fixture(scope="module")
def photo_captions(shipped):
    names = ["astronaut", "chelsea", "rocket", "coffee"]
    return dict(zip(names, (o["caption"] for o in shipped.caption([sample_photo(n) for n in names], beam=3))))


def test_default_model_is_shipped_and_listed():
    models = available_models()
    assert DEFAULT_MODEL in models
    assert load_captioner.__defaults__[0] is None  # load_captioner() needs no argument ...
    assert captioner.load_captioner.__defaults__[0] is None  # ... in the public API too


def test_astronaut_is_a_person_and_chelsea_an_animal(photo_captions):
    assert PEOPLE & set(photo_captions["astronaut"].split()), photo_captions["astronaut"]
    assert ANIMALS & set(photo_captions["chelsea"].split()), photo_captions["chelsea"]


def test_captions_for_people_have_no_special_tokens(photo_captions):
    for name, caption in photo_captions.items():
        assert caption and not re.search(r"<\w+>", caption), (name, caption)


def test_unk_is_forbidden_by_default_and_allowed_on_request(shipped):
    grid = shipped.encode(torch.stack([shipped.transform(sample_photo("rocket"))]))
    # Make <unk> the model's favourite word: the search must still never choose it when forbidden.
    bias = shipped.decoder.out.bias
    with torch.no_grad():
        saved = bias[shipped.vocab.unk_id].item()
        bias[shipped.vocab.unk_id] += 50.0
        try:
            allowed = shipped.generate(grid, beam_size=3)[0][0].tokens
            forbidden = shipped.generate(grid, beam_size=3, forbid_unk=True)[0][0].tokens
        finally:
            bias[shipped.vocab.unk_id] = saved
    assert shipped.vocab.unk_id in allowed
    assert shipped.vocab.unk_id not in forbidden and forbidden


SHIPPED = sorted(available_models())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_file_is_safetensors_small_and_loads_without_code(name):
    weights = SHIPPED_DIR / f"{name}.safetensors"
    size = weights.stat().st_size
    assert size <= MAX_BYTES, f"{size / 1e6:.1f} MB"
    raw = weights.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])  # safetensors: a JSON header, then raw tensor bytes
    assert header["__metadata__"]["format"] == "captioner-model"
    assert not raw.startswith(b"\x80") and b"PK\x03\x04" not in raw[:4]  # neither a pickle nor a torch zip
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes == {"F16"}
    assert not any(k.startswith("encoder.backbone.") for k in header)  # the dependency installs the backbone


def _card_fields(text: str) -> dict[str, str]:
    section = text.split("## Fingerprint", 1)[1].split("\n## ", 1)[0]
    return {m.group(1).strip(): m.group(2).strip() for m in re.finditer(r"^- ([^:]+): `([^`]*)`", section, re.M)}


@pytest.mark.parametrize("name", SHIPPED)
def test_fingerprint_matches_model_card(name, shipped):
    if name != DEFAULT_MODEL:
        shipped = load_captioner(name)
    meta = available_models()[name]
    assert meta["attention"] == shipped.attention_kind
    card = _card_fields((SHIPPED_DIR / f"{name}.md").read_text())
    fp = shipped.encoder.fingerprint()
    assert card["encoder"] == fp["name"] == meta["fingerprint"]["name"]
    assert card["encoder weights sha256"] == fp["weights_sha256"] == meta["fingerprint"]["weights_sha256"]
    assert int(card["input size"]) == fp["input_size"]
    assert card["grid"] == "x".join(map(str, fp["grid_hw"]))
    t = fp["transform"]
    assert card["preprocessing"] == f"resize {t['resize']} {t['interpolation']}, mean {t['mean']}, std {t['std']}"
    assert int(card["vocabulary size"]) == len(shipped.vocab) == meta["fingerprint"]["vocab_size"]
    assert card["weights sha256"] == meta["weights_sha256"]


def test_cli_captions_without_a_checkpoint_and_lists_models(tmp_path, capsys):
    photo = tmp_path / "astronaut.jpg"
    sample_photo("astronaut").save(photo)
    assert cli_main(["caption", "--list-models"]) == 0
    assert DEFAULT_MODEL in capsys.readouterr().out
    assert cli_main(["caption", str(photo), "--beam", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert PEOPLE & set(result["words"])


def test_export_round_trip_and_damaged_files(tmp_path, smoke_checkpoint):
    export_model(smoke_checkpoint, "tiny", tmp_path, dtype="float32")
    model = load_shipped("tiny", directory=tmp_path)
    original = load_captioner(smoke_checkpoint)
    for key, value in original.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    weights = tmp_path / "tiny.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    with pytest.raises(ShippedModelError, match="SHA-256"):
        load_shipped("tiny", directory=tmp_path)
    (tmp_path / "tiny.json").write_text("{")
    with pytest.raises(ShippedModelError, match="unreadable"):
        load_shipped("tiny", directory=tmp_path)
    with pytest.raises(ShippedModelError, match="no shipped model named 'nope'"):
        load_shipped("nope")


def test_a_damaged_shipped_json_is_reported_by_name(tmp_path, smoke_checkpoint, monkeypatch, capsys):
    """A truncated NAME.json beside its weights used to make the model vanish from available_models without
    a word (the JSONDecodeError was swallowed); now the listing warns naming the file, loading the name says
    why it cannot, and `caption --list-models` prints it and exits 1."""
    import captioner.zoo as zoo

    export_model(smoke_checkpoint, "tiny", tmp_path, dtype="float32")
    export_model(smoke_checkpoint, "intact", tmp_path, dtype="float32")
    meta = tmp_path / "tiny.json"
    meta.write_text(meta.read_text()[:200])  # cut off mid-file, as by a full disk
    with pytest.warns(RuntimeWarning, match=r"tiny\.json.*not valid JSON"):
        models = available_models(tmp_path)
    assert sorted(models) == ["intact"]
    monkeypatch.setattr(zoo, "SHIPPED_DIR", tmp_path)
    with pytest.raises(ShippedModelError, match=r"tiny\.json: unreadable model metadata"):
        load_captioner("tiny")
    assert load_captioner("intact").shipped_name == "intact"
    assert cli_main(["caption", "--list-models"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("intact:") and "tiny.json" in err and "not valid JSON" in err
