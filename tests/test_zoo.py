"""The shipped pretrained Flickr8k captioner (captioner/store/zoo.py, captioner/pretrained/): it loads offline
without executing code, fits its size limit, matches its model card, and says sensible things about
real photographs (scikit-image's bundled ones, which are not in Flickr8k)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import captioner
from captioner.api import export_model, load_captioner, load_shipped
from captioner.cli import main as cli_main
from captioner.demo import sample_photo
from captioner.store.hub import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, card_metadata, card_scores, split_card
from captioner.store.zoo import DEFAULT_MODEL, SHIPPED_DIR, ShippedModelError, scan_models

PEOPLE = {"man", "woman", "person", "girl", "boy", "lady", "men", "women", "people", "child", "children", "boys",
          "girls", "guy", "player"}
ANIMALS = {"cat", "dog", "cats", "dogs", "kitten", "puppy"}
MAX_BYTES = 12 * 1000 * 1000  # int8 matrices (store/quantize.py): the tree must travel to a GPU node


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(2)
    return load_captioner()  # no argument: the shipped default


@pytest.fixture(scope="module")
def photo_captions(shipped):
    names = ["astronaut", "chelsea", "rocket", "coffee"]
    return dict(zip(names, (o["caption"] for o in shipped.caption([sample_photo(n) for n in names], beam=3))))


def test_default_model_is_shipped_and_listed():
    models, damaged = scan_models()
    assert DEFAULT_MODEL in models and damaged == {}
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
            options = shipped.decode_options.replace_given(beam=3)
            allowed = shipped.generate(grid, options)[0][0].tokens
            forbidden = shipped.generate(grid, options.for_people())[0][0].tokens
        finally:
            bias[shipped.vocab.unk_id] = saved
    assert shipped.vocab.unk_id in allowed
    assert shipped.vocab.unk_id not in forbidden and forbidden


SHIPPED = sorted(scan_models()[0])


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_file_is_safetensors_small_and_loads_without_code(name):
    weights = SHIPPED_DIR / name / WEIGHTS_FILE
    size = weights.stat().st_size
    assert size <= MAX_BYTES, f"{size / 1e6:.1f} MB"
    raw = weights.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])  # safetensors: a JSON header, then raw tensor bytes
    assert header["__metadata__"]["format"] == "captioner-model"
    assert not raw.startswith(b"\x80") and b"PK\x03\x04" not in raw[:4]  # neither a pickle nor a torch zip
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes == {"I8", "F16"}  # matrices in 8 bits, their scales and the vectors in float16
    assert not any(k.startswith("encoder.backbone.") for k in header)  # the dependency installs the backbone


def _card_fields(text: str) -> dict[str, str]:
    section = text.split("## Fingerprint", 1)[1].split("\n## ", 1)[0]
    return {m.group(1).strip(): m.group(2).strip() for m in re.finditer(r"^- ([^:]+): `([^`]*)`", section, re.M)}


@pytest.mark.parametrize("name", SHIPPED)
def test_fingerprint_matches_model_card(name, shipped):
    if name != DEFAULT_MODEL:
        shipped = load_captioner(name)
    meta = scan_models()[0][name]
    assert meta["attention"] == shipped.attention_kind
    card = _card_fields((SHIPPED_DIR / name / CARD_FILE).read_text())
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


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_card_opens_with_the_hub_metadata_of_its_config(name):
    meta = json.loads((SHIPPED_DIR / name / CONFIG_FILE).read_text())
    block, body = split_card((SHIPPED_DIR / name / CARD_FILE).read_text())
    assert block == card_metadata(meta)  # what `captioner export` writes for this config.json
    assert block["library_name"] == "captioner" and block["datasets"] == [meta["dataset"]] != [""]
    values = {m["name"]: m["value"] for m in block["model-index"][0]["results"][0]["metrics"]}
    expected, _ = card_scores(meta["scores"])  # an evaluate --out JSON, or the older {"shipped": ...} form
    assert values == {k: round(v, 2) for k, v in expected.items()} != {}
    assert body.startswith(f"# {name}")


def _safetensors_parts(path: Path) -> tuple[dict, bytes]:
    """(parsed header, tensor bytes) of a safetensors file: the header's metadata map has no fixed order."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def test_re_exporting_the_shipped_model_gives_its_weights_file_byte_for_byte(tmp_path):
    """Its int8 weights read back as float32 and written as int8 again are the same bytes: each group's largest entry
    reads back as exactly 127 times its float16 scale, so the scales, and the rounding against them, repeat."""
    out = tmp_path / DEFAULT_MODEL
    assert cli_main(["export", "--checkpoint", DEFAULT_MODEL, str(out), "--dtype", "int8"]) == 0
    header, tensors = _safetensors_parts(out / WEIGHTS_FILE)
    shipped_header, shipped_tensors = _safetensors_parts(SHIPPED_DIR / DEFAULT_MODEL / WEIGHTS_FILE)
    assert header == shipped_header and tensors == shipped_tensors
    assert load_captioner(out).vocab.to_dict() == load_captioner(DEFAULT_MODEL).vocab.to_dict()


def test_unknown_shipped_name_lists_the_shipped_ones():
    shipped = ", ".join(SHIPPED)
    with pytest.raises(ShippedModelError, match=f"no shipped model named 'nope' \\(shipped: {shipped}"):
        load_shipped("nope")


def test_the_hard_attention_model_is_shipped_and_reads_one_cell_per_word():
    """flickr8k_hard: the paper's stochastic hard attention, decoded as it was chosen (arg-max cell per word)."""
    assert "flickr8k_hard" in SHIPPED
    hard = load_captioner("flickr8k_hard")
    assert hard.shipped_name == "flickr8k_hard" and hard.decoder.stochastic
    out = hard.caption([sample_photo("astronaut")], beam=3)[0]
    assert out["attention_mode"] == "argmax"  # its config's eval.attention_mode, with no flag
    assert PEOPLE & set(out["words"]), out["caption"]
    assert len(out["locations"]) == len(out["words"])
    assert all(0 <= c < out["alphas"].shape[1] for c in out["locations"])
    assert len(set(out["locations"])) >= 2  # it moves


def test_a_damaged_shipped_json_is_reported_by_name(tmp_path, smoke_checkpoint, monkeypatch, capsys):
    """A truncated config.json beside its weights does not make the model vanish without a word (a swallowed
    JSONDecodeError): the scan names the file as damaged, loading the name says why it cannot, and
    `caption --list-models` prints it and exits 1."""
    import captioner.store.zoo as zoo

    export_model(smoke_checkpoint, tmp_path / "tiny", dtype="float32")
    export_model(smoke_checkpoint, tmp_path / "intact", dtype="float32")
    meta = tmp_path / "tiny" / CONFIG_FILE
    meta.write_text(meta.read_text()[:200])  # cut off mid-file, as by a full disk
    models, damaged = scan_models(tmp_path)
    assert sorted(models) == ["intact"] and sorted(damaged) == ["tiny"]
    assert re.search(r"tiny/config\.json.*not valid JSON", damaged["tiny"]), damaged
    monkeypatch.setattr(zoo, "SHIPPED_DIR", tmp_path)
    with pytest.raises(ShippedModelError, match=r"tiny/config\.json: unreadable model config"):
        load_captioner("tiny")
    assert load_captioner("intact").shipped_name == "intact"
    assert cli_main(["caption", "--list-models"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("intact") and "tiny/config.json" in err and "not valid JSON" in err
