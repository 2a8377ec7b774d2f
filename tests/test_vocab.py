"""Tests for captioner/data/vocab.py: tokenizer and JSON vocabulary."""

import json

import pytest

from captioner.data.vocab import END, PAD, START, UNK, Vocab, tokenize


def test_tokenize_lowercases_and_splits_punctuation():
    assert tokenize("A dog's ball, on the GRASS.") == ["a", "dog's", "ball", ",", "on", "the", "grass", "."]
    assert tokenize("Two  men\tplay\n(football)!") == ["two", "men", "play", "(", "football", ")", "!"]
    assert tokenize("") == []


def test_tokenize_is_unicode_safe():
    assert tokenize("Un CAFÉ à Straße") == ["un", "café", "à", "straße"]
    assert tokenize("don’t") == ["don't"]  # curly apostrophe folds to the straight one
    assert tokenize("ＡＢＣ") == ["abc"]  # full-width letters fold under NFKC


def test_build_orders_by_count_then_word_and_specials_first():
    vocab = Vocab.build([["b", "a", "c"], ["c", "b"], ["c"]])
    assert vocab.words == [PAD, START, END, UNK, "c", "b", "a"]
    assert (vocab.pad_id, vocab.start_id, vocab.end_id, vocab.unk_id) == (0, 1, 2, 3)
    assert len(vocab) == 7 and "a" in vocab and "z" not in vocab


def test_build_does_not_duplicate_special_tokens():
    vocab = Vocab.build([[START, "a", END, UNK, PAD]])
    assert vocab.words == [PAD, START, END, UNK, "a"]


def test_min_count_threshold():
    vocab = Vocab.build([["x", "y"], ["x", "z"], ["x", "y"]], min_count=2)
    assert vocab.words[4:] == ["x", "y"]
    assert "z" not in vocab
    with pytest.raises(ValueError):
        Vocab.build([["a"]], min_count=0)


def test_unknown_words_map_to_unk():
    vocab = Vocab.build([["a", "cat"]])
    assert vocab.id("dog") == vocab.unk_id
    assert vocab.encode(["a", "dog"]) == [1, vocab.id("a"), 3, 2]
    assert vocab.decode([1, vocab.id("a"), 3, 2]) == ["a"]
    assert vocab.decode([1, vocab.id("a"), 3, 2], keep_unk=True) == ["a", UNK]


def test_encode_wraps_and_truncates():
    vocab = Vocab.build([["a", "b", "c", "d"]])
    ids = vocab.encode(["a", "b", "c", "d"])
    assert ids[0] == vocab.start_id and ids[-1] == vocab.end_id and len(ids) == 6
    short = vocab.encode(["a", "b", "c", "d"], max_length=2)
    assert short == [vocab.start_id, vocab.id("a"), vocab.id("b"), vocab.end_id]
    assert vocab.encode(["a"], max_length=0) == [vocab.start_id, vocab.end_id]


def test_decode_stops_at_end_and_drops_specials():
    vocab = Vocab.build([["a", "b"]])
    a, b = vocab.id("a"), vocab.id("b")
    assert vocab.decode([vocab.start_id, a, vocab.pad_id, b, vocab.end_id, a, b]) == ["a", "b"]
    assert vocab.decode(vocab.encode(["b", "a"])) == ["b", "a"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.decode([999])


def test_json_round_trip_has_no_pickle(tmp_path):
    vocab = Vocab.build([tokenize("a red circle left of a blue café"), ["a"]], min_count=1)
    path = tmp_path / "sub" / "vocab.json"
    vocab.save(path)
    raw = path.read_bytes()
    assert not raw.startswith(b"\x80")  # a pickle stream starts with the PROTO opcode
    d = json.loads(raw.decode("utf-8"))
    assert d["format"] == "captioner-vocab" and d["version"] == 1 and d["min_count"] == 1
    assert d["words"] == vocab.words
    loaded = Vocab.load(path)
    assert loaded == vocab and loaded.min_count == 1
    assert Vocab.from_dict(vocab.to_dict()).words == vocab.words
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]  # no temp file left behind


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": "other"}, "not a vocabulary"),
        ({"version": 99}, "version"),
        ({"words": ["a", PAD, START, END, UNK]}, "must start with"),
        ({"words": [PAD, START, END, UNK, "a", "a"]}, "duplicate"),
        ({"words": [PAD, START, END, UNK, 5]}, "non-empty strings"),
        ({"min_count": 0}, "min_count"),
    ],
)
def test_from_dict_rejects_bad_input(change, message):
    d = Vocab.build([["a"]]).to_dict()
    d.update(change)
    with pytest.raises(ValueError, match=message):
        Vocab.from_dict(d)


def test_from_dict_missing_key_lists_present_keys():
    d = Vocab.build([["a"]]).to_dict()
    del d["words"]
    with pytest.raises(ValueError, match="lacks"):
        Vocab.from_dict(d)


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "v.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="v.json"):
        Vocab.load(bad)
    with pytest.raises(ValueError, match="missing.json"):
        Vocab.load(tmp_path / "missing.json")
