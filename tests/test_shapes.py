"""Tests for captioner/data/shapes.py: the synthetic shapes data set."""

import json
import os

import numpy as np
import pytest

from captioner.commands.shapes import main
from captioner.data import shapes
from captioner.data.images import load_image
from captioner.data.shapes import COLOURS, SHAPES, SIZES, generate_shapes
from captioner.data.vocab import Vocab, tokenize

SMALL = dict(n_train=10, n_val=3, n_test=3)
SIZE_WORDS = {"small": {"small", "little"}, "large": {"large", "big"}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    # More images than SMALL so every object count and relation shows up; 96 px keeps it quick.
    path = generate_shapes(out, n_train=60, n_val=5, n_test=5, image_size=96, seed=3)
    return out, json.loads(path.read_text())


def _files(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes(tmp_path):
    a = generate_shapes(tmp_path / "a", seed=7, **SMALL).parent
    b = generate_shapes(tmp_path / "b", seed=7, **SMALL).parent
    files_a, files_b = _files(a), _files(b)
    assert len(files_a) == 1 + 16
    assert files_a == files_b


def test_different_seed_gives_different_data(tmp_path):
    a = _files(generate_shapes(tmp_path / "a", seed=1, **SMALL).parent)
    b = _files(generate_shapes(tmp_path / "b", seed=2, **SMALL).parent)
    assert a["dataset_shapes.json"] != b["dataset_shapes.json"]
    assert sum(a[k] != b[k] for k in a if k.endswith(".png")) >= 14


def test_training_images_do_not_depend_on_other_split_sizes(tmp_path):
    a = _files(generate_shapes(tmp_path / "a", n_train=4, n_val=1, n_test=1).parent)
    b = _files(generate_shapes(tmp_path / "b", n_train=4, n_val=5, n_test=0).parent)
    assert all(a[f"images/{i:06d}.png"] == b[f"images/{i:06d}.png"] for i in range(4))


def test_layout_splits_and_ids(tmp_path):
    path = generate_shapes(tmp_path, **SMALL)
    assert path == tmp_path / "dataset_shapes.json"
    d = json.loads(path.read_text())
    assert d["dataset"] == "shapes"
    assert d["params"]["n_train"] == 10 and d["params"]["image_size"] == 224
    images = d["images"]
    assert [e["split"] for e in images] == ["train"] * 10 + ["val"] * 3 + ["test"] * 3
    assert len({e["imgid"] for e in images}) == 16
    sentids = [s["sentid"] for e in images for s in e["sentences"]]
    assert len(sentids) == len(set(sentids)) == 16 * 5
    for e in images:
        assert all(s["imgid"] == e["imgid"] for s in e["sentences"])
        assert e["sentids"] == [s["sentid"] for s in e["sentences"]]
        im = load_image(tmp_path / e["filepath"] / e["filename"])
        assert im.size == (224, 224)


def test_idempotent_reuse_and_regeneration(tmp_path):
    path = generate_shapes(tmp_path, **SMALL)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.png")} | {path: path.stat().st_mtime_ns}
    os.utime(path, ns=(1, 1))  # a rewrite would change this
    assert generate_shapes(tmp_path, **SMALL) == path
    assert path.stat().st_mtime_ns == 1
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items() if p != path)

    # A missing image means an incomplete data set: it is regenerated.
    (tmp_path / "images" / "000004.png").unlink()
    generate_shapes(tmp_path, **SMALL)
    assert (tmp_path / "images" / "000004.png").is_file() and path.stat().st_mtime_ns != 1

    # Different parameters regenerate, and images of the larger old set do not linger.
    generate_shapes(tmp_path, n_train=4, n_val=1, n_test=1)
    assert len(list((tmp_path / "images").glob("*.png"))) == 6
    assert json.loads(path.read_text())["params"]["n_train"] == 4


def test_interrupted_generation_is_not_mistaken_for_complete(tmp_path, monkeypatch):
    generate_shapes(tmp_path, **SMALL)
    calls = {"n": 0}
    real_draw = shapes._draw_scene

    def crash_after_two(rng, size):
        calls["n"] += 1
        if calls["n"] > 2:
            raise KeyboardInterrupt
        return real_draw(rng, size)

    monkeypatch.setattr(shapes, "_draw_scene", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        generate_shapes(tmp_path, n_train=10, n_val=3, n_test=4)
    assert not (tmp_path / "dataset_shapes.json").exists()  # the old JSON is gone, no new one claims completeness
    monkeypatch.undo()
    generate_shapes(tmp_path, n_train=10, n_val=3, n_test=4)
    assert len(json.loads((tmp_path / "dataset_shapes.json").read_text())["images"]) == 17


def test_objects_are_valid_inside_and_apart(dataset):
    _, d = dataset
    size = d["params"]["image_size"]
    counts = set()
    for e in d["images"]:
        objects = e["objects"]
        counts.add(len(objects))
        assert 1 <= len(objects) <= 3
        for o in objects:
            assert o["shape"] in SHAPES and o["colour"] in COLOURS and o["size"] in SIZES
            x0, y0, x1, y1 = o["box"]
            assert 0 <= x0 < x1 <= size and 0 <= y0 < y1 <= size
            side = (x1 - x0) * 224 / size
            assert (side >= 75) if o["size"] == "large" else (side <= 60)
        for i, a in enumerate(objects):
            for b in objects[i + 1:]:
                overlap_x = min(a["box"][2], b["box"][2]) - max(a["box"][0], b["box"][0])
                overlap_y = min(a["box"][3], b["box"][3]) - max(a["box"][1], b["box"][1])
                assert overlap_x <= 0 or overlap_y <= 0
        centres = [o["box"][0] + o["box"][2] for o in objects]
        assert centres == sorted(centres)  # stored left to right
    assert counts == {1, 2, 3}


def test_pixels_at_object_centres_have_the_named_colour(dataset):
    out, d = dataset
    palette = {name: np.array(rgb) for name, rgb in shapes._RGB.items()}
    for e in d["images"]:
        pixels = np.asarray(load_image(out / e["filepath"] / e["filename"])).astype(int)
        for o in e["objects"]:
            x0, y0, x1, y1 = o["box"]
            colour = pixels[(y0 + y1) // 2, (x0 + x1) // 2]
            nearest = min(palette, key=lambda name: np.abs(palette[name] - colour).sum())
            assert nearest == o["colour"]


def test_refs_point_at_words_of_their_object(dataset):
    _, d = dataset
    attribute_words = set(SHAPES) | set(COLOURS) | set().union(*SIZE_WORDS.values())
    for e in d["images"]:
        objects = e["objects"]
        assert len(e["sentences"]) == 5
        for s in e["sentences"]:
            tokens = s["tokens"]
            referred = set()
            for t, o in s["refs"]:
                assert 0 <= t < len(tokens) and 0 <= o < len(objects)
                obj = objects[o]
                assert tokens[t] in {obj["shape"], obj["colour"]} | SIZE_WORDS[obj["size"]]
                referred.add(t)
            # Every attribute word is covered, and each object is named in every sentence.
            assert {t for t, w in enumerate(tokens) if w in attribute_words} == referred
            assert {o for _, o in s["refs"]} == set(range(len(objects)))


def test_captions_tokenize_back_and_fit_a_small_vocab(dataset):
    _, d = dataset
    sentences = [s for e in d["images"] for s in e["sentences"]]
    for s in sentences:
        assert tokenize(s["raw"]) == s["tokens"]
        assert 3 <= len(s["tokens"]) <= 16
    vocab = Vocab.build(s["tokens"] for s in sentences)
    assert len(vocab) < 45
    assert all(vocab.unk_id not in vocab.encode(s["tokens"]) for s in sentences)
    # References differ in wording, so a model has more than one way to be right.
    assert all(len({" ".join(s["tokens"]) for s in e["sentences"]}) >= 4 for e in d["images"])


def _centre(box):
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


@pytest.mark.parametrize("box_a, box_b, expected", [
    ([0, 0, 10, 10], [50, 5, 60, 15], "left"),
    ([50, 5, 60, 15], [0, 0, 10, 10], "right"),
    ([0, 0, 10, 10], [5, 50, 15, 60], "above"),
    ([5, 50, 15, 60], [0, 0, 10, 10], "below"),
])
def test_relation(box_a, box_b, expected):
    assert shapes.relation(box_a, box_b) == expected


def test_relation_words_match_box_centres(dataset):
    _, d = dataset
    phrases = {"to the left of": "left", "to the right of": "right", "above": "above", "below": "below"}
    checked = 0
    for e in d["images"]:
        if len(e["objects"]) != 2:
            continue
        (ax, ay), (bx, by) = (_centre(o["box"]) for o in e["objects"])
        # Sentence 0 names object 0 first, sentence 3 names object 1 first with the inverse relation.
        for s, (px, py, qx, qy) in ((e["sentences"][0], (ax, ay, bx, by)), (e["sentences"][3], (bx, by, ax, ay))):
            text = " ".join(s["tokens"])
            found = [rel for phrase, rel in phrases.items() if f" {phrase} " in text]
            assert len(found) == 1, text
            rel = found[0]
            dx, dy = qx - px, qy - py  # where the second-named object lies relative to the first
            if rel in ("left", "right"):
                assert abs(dx) >= abs(dy) and (dx > 0) == (rel == "left"), (text, e["objects"])
            else:
                assert abs(dy) > abs(dx) and (dy > 0) == (rel == "above"), (text, e["objects"])
            checked += 1
    assert checked >= 10


def test_main_writes_then_reuses(tmp_path, capsys):
    args = ["--out", str(tmp_path), "--n-train", "3", "--n-val", "1", "--n-test", "1", "--image-size", "64"]
    assert main(args + ["--seed", "5"]) == 0
    first = capsys.readouterr().out
    assert "wrote" in first and "5 images" in first and str(tmp_path) in first
    assert main(args + ["--seed", "5"]) == 0
    assert "reused" in capsys.readouterr().out
    d = json.loads((tmp_path / "dataset_shapes.json").read_text())
    assert d["params"]["seed"] == 5 and load_image(tmp_path / "images" / "000000.png").size == (64, 64)


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="n_val"):
        generate_shapes(tmp_path, n_train=1, n_val=-1, n_test=0)
    with pytest.raises(ValueError, match="image_size"):
        generate_shapes(tmp_path, image_size=8)


def test_a_second_process_waits_for_the_one_generating_the_same_root_then_finds_it_done(tmp_path, caplog):
    """Two `captioner extract` runs that had to regenerate one shapes root together both deleted stale images, and
    one ended in FileNotFoundError: the generation now holds the root's lock, and a second one waits for it."""
    import fcntl
    import threading

    out = tmp_path / "shapes"
    generate_shapes(out, n_train=3, n_val=1, n_test=1, image_size=32)  # what is on disk: a smaller set
    out.mkdir(exist_ok=True)
    held = open(shapes.lock_path(out), "a")  # another process generating here (flock: per open file)
    fcntl.flock(held, fcntl.LOCK_EX)
    done = []
    with caplog.at_level("WARNING"):
        worker = threading.Thread(target=lambda: done.append(
            generate_shapes(out, n_train=6, n_val=2, n_test=2, image_size=32)))
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive() and not done  # waiting, not drawing beside the other
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()
        worker.join(timeout=60)
    assert done and "waiting for another process that is generating the shapes data" in caplog.text
    assert len(list((out / "images").glob("*.png"))) == 10
