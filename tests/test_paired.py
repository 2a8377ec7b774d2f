"""The paired comparison (evaluation/paired.py, `captioner score --compare`): BLEU from summed statistics equals
coco-caption's, the bootstrap interval by hand on two photos, box figures per photo, and the command's refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from captioner.cli import main as cli_main
from captioner.evaluation.grounding import BoxGrounding
from captioner.evaluation.paired import (
    PhotoFigures,
    bleu_statistics,
    corpus_bleu,
    paired_intervals,
    resample_weights,
)
from captioner.evaluation.results import ResultsError, read_photo_boxes
from tests.test_entities import photo_folder  # noqa: F401  (the fixture)


def test_bleu_from_summed_statistics_equals_coco_captions_corpus_bleu():
    from pycocoevalcap.bleu.bleu import Bleu

    res = {"1": ["a man rides a horse"], "2": ["two dogs run"], "3": ["a dog runs on the grass in a park"]}
    gts = {"1": ["a man is riding a horse", "a person rides a brown horse"],
           "2": ["two dogs run on sand", "dogs running"],
           "3": ["a dog runs across the grass", "the dog is running in a park"]}
    expected = Bleu(4).compute_score(gts, res, verbose=0)[0]
    stats = np.stack([bleu_statistics(res[i][0].split(), [r.split() for r in gts[i]]) for i in sorted(res)])
    for n in (1, 2, 3, 4):
        ours = np.stack([bleu_statistics(res[i][0].split(), [r.split() for r in gts[i]], n) for i in sorted(res)])
        assert corpus_bleu(ours.sum(0), n) == pytest.approx(expected[n - 1], rel=1e-9)
    # photo 2's hypothesis has 3 words and its references 5 and 2: the closest length (on a tie the shorter) is 2
    assert stats[1, 9] == 2 and stats[1, 8] == 3
    # photo 1: "a man rides a horse" against both references: unigrams a a man rides horse all matched (a twice)
    assert stats[0, 0] == 5 and stats[0, 4] == 5


def test_the_interval_by_hand_on_two_photos():
    # CIDEr-D per photo: A 0.5, 0.5; B 0.51, 0.53: the differences are 1 and 3 points. A resample draws two photos:
    # both the first (p 1/4): +1; one of each (p 1/2): +2; both the second (p 1/4): +3. The 2.5th percentile of
    # 2,000 such draws lies in the first quarter and the 97.5th in the last: the interval is [+1, +3] exactly.
    blank = np.zeros((2, 10))
    a = PhotoFigures({"CIDEr-D": np.array([0.5, 0.5])}, blank, None)
    b = PhotoFigures({"CIDEr-D": np.array([0.51, 0.53])}, blank, None)
    m = paired_intervals(a, b, resamples=2000, seed=0)["CIDEr-D"]
    assert m["A"] == pytest.approx(50.0) and m["B"] == pytest.approx(52.0) and m["difference"] == pytest.approx(2.0)
    assert m["low"] == pytest.approx(1.0) and m["high"] == pytest.approx(3.0)
    # the same figures twice: no difference on any resample
    same = paired_intervals(a, a)["CIDEr-D"]
    assert (same["difference"], same["low"], same["high"]) == (0.0, 0.0, 0.0)


def test_box_figures_resample_as_ratios_of_sums():
    # photo 1: 2 boxed words, both pointed at, the centre holds 1, inside 1.5; photo 2: 1 word, missed, centre 1,
    # inside 0.2. Whole set: pointing 2/3, over the centre (2 - 2)/3, inside 1.7/3.
    boxes = np.array([[2, 2, 1, 1.5], [1, 0, 1, 0.2]])
    f = PhotoFigures({}, np.zeros((2, 10)), boxes)
    figures = f.figures(np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 2.0]]))
    assert figures["pointing"] == pytest.approx([200 / 3, 100.0, 0.0])
    assert figures["pointing - centre"] == pytest.approx([0.0, 50.0, -100.0])
    assert figures["α inside"] == pytest.approx([1.7 / 3, 0.75, 0.2])


def test_resamples_are_seeded_and_draw_as_many_photos_as_there_are():
    w = resample_weights(5, 1000, seed=3)
    assert w.shape == (1000, 5) and (w.sum(1) == 5).all()
    assert (w == resample_weights(5, 1000, seed=3)).all() and not (w == resample_weights(5, 1000, seed=4)).all()


def test_per_photo_box_sums_add_up_to_the_generated_figures(photo_folder):  # noqa: F811
    from captioner.data.entities import read_entities

    entities = read_entities(photo_folder, ["100_a"])
    g = BoxGrounding(entities, (2, 2))
    alphas = np.array([[0, 0, 0, 1], [0.2, 0.2, 0.4, 0.2], [0, 0, 0, 1], [0, 0, 0, 1], [0.7, 0.1, 0.1, 0.1]])
    g.add_generated("100_a", ["two", "men", "and", "a", "cats"], alphas)
    f = g.figures()["generated"]
    photo = g.per_photo["100_a"]
    # "men": inside 0.6, peak cell 2 in the left half; "cats": inside 0.7, peak cell 0 in the top-left box; the
    # centre cell (3) is in neither box
    assert photo == {"words": 2, "pointing": 2, "centre": 0, "inside": pytest.approx(1.3)}
    assert photo["pointing"] / photo["words"] == f["pointing"] and photo["inside"] / photo["words"] == pytest.approx(
        f["inside"])


def _write(path, captions, boxes=None):
    path.write_text(json.dumps([{"image_id": i, "caption": c, **({"boxes": boxes[i]} if boxes else {})}
                                for i, c in captions.items()]))
    return str(path)


@pytest.fixture
def references(tmp_path):
    images = [{"filename": f"{i}.jpg", "split": "val", "sentences": [{"raw": r} for r in refs]} for i, refs in {
        "p1": ["a man rides a horse", "a person riding a horse"],
        "p2": ["two dogs run on the sand", "dogs running on a beach"],
        "p3": ["a child plays in the water", "a kid splashes in a pool"]}.items()]
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"images": images}))
    return str(path)


def test_compare_prints_each_difference_with_its_interval_and_a_files_own_scores(tmp_path, references, capsys):
    a = _write(tmp_path / "a.json", {"p1": "a dog", "p2": "a dog", "p3": "a dog"})
    b = _write(tmp_path / "b.json", {"p1": "a man riding a horse", "p2": "two dogs run on the beach",
                                     "p3": "a child in the water"})
    code = cli_main(["score", "--compare", a, b, "--references", references, "--tokenizer", "simple",
                     "--no-meteor", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["n_images"] == 3 and out["resamples"] == 2000
    cider = out["metrics"]["CIDEr-D"]
    assert cider["difference"] > 0 and cider["low"] <= cider["difference"] <= cider["high"]
    # A and B are each the file's own corpus figures
    for path, key in ((a, "A"), (b, "B")):
        cli_main(["score", path, "--references", references, "--tokenizer", "simple", "--no-meteor", "--json"])
        scores = json.loads(capsys.readouterr().out)["scores"]
        for metric in ("BLEU-4", "ROUGE-L", "CIDEr-D"):
            assert out["metrics"][metric][key] == pytest.approx(scores[metric], abs=1e-9)


def test_compare_refuses_different_photos_naming_both_files(tmp_path, references, capsys):
    a = _write(tmp_path / "a.json", {"p1": "a dog", "p2": "a dog"})
    b = _write(tmp_path / "b.json", {"p1": "a dog", "p3": "a dog"})
    assert cli_main(["score", "--compare", a, b, "--references", references, "--tokenizer", "simple",
                     "--no-meteor"]) == 2
    err = capsys.readouterr().err
    assert "a.json" in err and "b.json" in err and "same photos" in err
    with pytest.raises(SystemExit):  # fewer than 1,000 resamples
        cli_main(["score", "--compare", a, a, "--references", references, "--resamples", "999"])


def test_box_figures_in_a_results_file_are_read_and_checked(tmp_path):
    good = {"p1": {"words": 2, "pointing": 1, "centre": 2, "inside": 1.2}}
    path = _write(tmp_path / "a.json", {"p1": "a dog"}, good)
    assert read_photo_boxes(path) == good
    assert read_photo_boxes(_write(tmp_path / "plain.json", {"p1": "a dog"})) is None
    # a lone word whose whole mass lies inside its boxes, summed in floating point (met in a real results file)
    rounded = {"p1": {"words": 1, "pointing": 1, "centre": 1, "inside": 1.0000000000000002}}
    assert read_photo_boxes(_write(tmp_path / "rounded.json", {"p1": "a dog"}, rounded)) == rounded
    for bad in ({"words": 1, "pointing": 2, "centre": 0, "inside": 0.5}, {"words": 1, "pointing": 0, "centre": 0},
                {"words": 1, "pointing": -1, "centre": 0, "inside": 0}, {"words": 2, "pointing": 0, "centre": 0,
                                                                         "inside": 2.01}):
        with pytest.raises(ResultsError, match="bad.json"):
            read_photo_boxes(_write(tmp_path / "bad.json", {"p1": "a dog"}, {"p1": bad}))
