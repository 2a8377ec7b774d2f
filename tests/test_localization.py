"""GVD's grounding figures (captioner/evaluation/localization.py), computed by hand on small maps: the upsampled
map, the box of its largest region above half its maximum, IoU, the teacher-forced accuracy, GVD's generated
F1_all / F1_loc (each caption against each reference; F1 of the class-averaged precision and recall) and the
project's per-photo variant; GVD's class vocabulary; then through BoxGrounding on Flickr30k Entities files in their
published format."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from entities_fixture import write_photo  # tests/entities_fixture.py

from captioner.data.entities import lemma, read_entities
from captioner.evaluation.grounding import BoxGrounding, CaptionRead, format_grounding
from captioner.evaluation.localization import (
    GVD_CLASSES,
    Localization,
    LocalizationFigures,
    Reference,
    frequent_classes,
    iou,
    localises,
    map_box,
    object_classes,
    read_classes,
    references,
    upsample,
)

GRID = (4, 4)


def cell(index: int, grid: tuple[int, int] = GRID) -> np.ndarray:
    """A one-hot map (L,): what hard attention's one-cell read scores."""
    a = np.zeros(grid[0] * grid[1])
    a[index] = 1.0
    return a


def cell_box(index: int, grid: tuple[int, int] = GRID) -> tuple[float, float, float, float]:
    r, c = divmod(index, grid[1])
    return (c / grid[1], r / grid[0], (c + 1) / grid[1], (r + 1) / grid[0])


def test_upsampling_interpolates_between_cell_centres():
    # per axis, 2 pixels per cell: centres at -0.25 (held at cell 0), 0.25, 0.75, 1.25 (held at cell 1)
    weights = np.array([1.0, 0.75, 0.25, 0.0])
    assert np.allclose(upsample(np.array([1.0, 0.0, 0.0, 0.0]), (2, 2), per_cell=2), np.outer(weights, weights))
    assert np.array_equal(upsample(np.arange(6.0), (2, 3), per_cell=1), np.arange(6.0).reshape(2, 3))


def test_the_box_is_the_largest_region_above_half_the_maximum():
    a = np.array([[1.0, 0, 0, 0],  # a lone peak: one cell, above the threshold, but the smaller region
                  [0, 0, 0.8, 0.8],
                  [0, 0, 0.8, 0.6],
                  [0, 0, 0, 0.4]]).reshape(-1)  # 0.4 < 0.5: outside
    assert map_box(a, GRID, per_cell=1) == (0.5, 0.25, 1.0, 0.75)
    assert map_box(a, GRID, threshold=0.9, per_cell=1) == (0.0, 0.0, 0.25, 0.25)  # only the peak is left
    # upsampled (16 pixels a cell), a one-hot map's region is its cell: (1 - |dx|)(1 - |dy|) >= 0.5 reaches the
    # cell's edges on its axes only
    for index in (0, 5, 15):
        assert map_box(cell(index), GRID) == pytest.approx(cell_box(index))
    assert map_box(np.full(16, np.nan), GRID) == (0.0, 0.0, 1.0, 1.0)  # no region: the whole photo


def test_iou_and_the_hit_at_one_half():
    assert iou((0, 0, 0.5, 0.5), (0.25, 0, 0.75, 0.5)) == pytest.approx(1 / 3)
    assert iou((0, 0, 0.5, 0.5), (0.5, 0.5, 1, 1)) == 0.0
    assert iou((0, 0, 0.5, 0.5), (0, 0, 0.5, 0.5)) == 1.0
    assert localises(cell(0), [(0, 0, 0.25, 0.4)], GRID)  # IoU 0.0625 / 0.1 = 0.625
    assert not localises(cell(0), [(0, 0, 0.5, 0.5)], GRID)  # IoU 0.25
    assert localises(cell(0), [(0.5, 0.5, 1, 1), (0, 0, 0.25, 0.25)], GRID)  # any box of the phrase


def test_accuracy_and_the_per_photo_variant_by_hand():
    loc = Localization(GRID, frozenset({"dog", "man", "ball", "frisbee"}))
    # teacher-forced: dog found once in two, man once in one
    loc.add_teacher_forced(cell(0), [cell_box(0)], "dog")
    loc.add_teacher_forced(cell(15), [cell_box(0)], "dog")
    loc.add_teacher_forced(cell(5), [cell_box(5)], "man")
    loc.add_teacher_forced(cell(5), [cell_box(5)], "stairs")  # no object class: not scored
    # photo 1: the dog named and found; a frisbee named that is not there; the ball there, not named
    loc.add_generated(["a", "dog", "catch", "a", "frisbee"], np.stack([cell(3)] * 5),
                      {"dog": [cell_box(3)], "ball": [cell_box(9)]})
    # photo 2: the man named in the wrong place; the dog named twice, its first word found
    maps = np.stack([cell(0), cell(6), cell(0), cell(0), cell(10), cell(0)])
    loc.add_generated(["a", "man", "with", "a", "dog", "dog"], maps,
                      {"man": [cell_box(5)], "dog": [cell_box(10)], "stairs": [cell_box(0)]})  # stairs: no class
    f = loc.figures()
    t, g = f["teacher_forced"], f["generated"]
    assert t == {"accuracy": pytest.approx(0.75), "accuracy_words": pytest.approx(2 / 3), "words": 3, "classes": 2}
    # per class (ball, dog, frisbee, man): localised 0, 2, 0, 0; named 0, 2, 1, 1; annotated 1, 2, 0, 1
    p = g["per_photo"]
    assert p["precision_all"] == pytest.approx((0 + 1 + 0 + 0) / 4)
    assert p["recall_all"] == pytest.approx((0 + 1 + 0 + 0) / 4)
    assert p["f1_all_per_class_mean"] == pytest.approx((0 + 1 + 0 + 0) / 4) and p["classes_all"] == 4
    assert p["f1_loc_per_class_mean"] == pytest.approx((1 + 0) / 2) and p["classes_loc"] == 2  # dog 2/2, man 0/1
    # no reference captions were given: GVD's protocol compared nothing
    assert g["f1_all"] is None and g["f1_loc"] is None and g["references"] == 0 and g["classes"] == 0
    # the baselines on the same words: the whole photo never fits a one-cell box; the centre cell (index 10) is the
    # second photo's dog
    whole, centre = (f["baselines"][m]["per_photo"] for m in ("whole_photo", "centre_cell"))
    assert f["baselines"]["whole_photo"]["accuracy"] == 0.0 and f["baselines"]["centre_cell"]["accuracy"] == 0.0
    assert whole["f1_all_per_class_mean"] == 0.0 and whole["f1_loc_per_class_mean"] == 0.0
    assert centre["f1_loc_per_class_mean"] == pytest.approx((0.5 + 0) / 2)
    assert centre["f1_all_per_class_mean"] == pytest.approx((0 + 0.5 + 0 + 0) / 4)  # dog: precision 1/2, recall 1/2
    empty = Localization(GRID, frozenset()).figures()
    assert empty["teacher_forced"]["accuracy"] is None
    assert empty["generated"]["per_photo"]["f1_all_per_class_mean"] is None


HAT = (0.0, 0.0, 0.5, 0.5)  # four cells: a one-cell box inside it has IoU 1/4, below the hit's 1/2


def test_gvd_hits_misses_misplaced_and_hallucinated_objects():
    """GVD's protocol (eval_grd_flickr30k_entities.py, grd_eval): the caption against each reference in turn."""
    loc = Localization(GRID, frozenset({"dog", "man", "hat", "ball", "frisbee"}))
    refs = [Reference((("dog", (cell_box(3),)), ("man", (cell_box(5),)), ("hat", (HAT,))), frozenset()),
            Reference((("dog", (cell_box(3),)), ("ball", (cell_box(9),))), frozenset())]
    # the man and the dog placed right, the hat misplaced (its box one cell of its four: IoU 1/4), a frisbee that no
    # reference names; the ball of the second reference never named
    lemmas = ["a", "man", "in", "a", "hat", "walk", "a", "dog", "frisbee"]
    maps = np.stack([cell(15), cell(5), cell(15), cell(15), cell(0), cell(15), cell(15), cell(3), cell(0)])
    loc.add_generated(lemmas, maps, {}, refs)
    g = loc.figures()["generated"]
    assert g["references"] == 2 and g["classes"] == 4  # num_vocab: dog, man, hat, ball (the frisbee is in none)
    # precision, per class over (word, reference): man [hit, hallucinated in the second], hat [misplaced,
    # hallucinated], dog [hit, hit], frisbee [hallucinated, hallucinated]; summed, over the 4 classes
    assert g["precision_all"] == pytest.approx((1 / 2 + 0 + 1 + 0) / 4)
    # recall, per class over the references' objects: dog [hit, hit], man [hit], hat [misplaced], ball [not named]
    assert g["recall_all"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    p, r = 1.5 / 4, 2 / 4
    assert g["f1_all"] == pytest.approx(2 * p * r / (p + r))  # 3/7
    # _loc: only where the caption names the class and the reference has an object of it: man [hit], hat
    # [misplaced], dog [hit, hit] both ways; no hallucination, no unnamed ball
    assert g["precision_loc"] == pytest.approx((1 + 0 + 1) / 4) and g["recall_loc"] == pytest.approx((1 + 0 + 1) / 4)
    assert g["f1_loc"] == pytest.approx(0.5)
    # the baselines' boxes fit no object: the whole photo (IoU 1/16 with a cell, 1/4 with the hat), the centre cell
    for method in ("whole_photo", "centre_cell"):
        b = loc.figures()["baselines"][method]
        assert b["precision_all"] == 0.0 and b["f1_all"] == 0.0 and b["f1_loc"] == 0.0


def test_gvd_reads_the_first_object_of_a_class_and_the_first_word():
    """Precision reads every word of the caption against the reference's first object of its class; recall reads
    every object of the reference against the caption's first word of its class."""
    loc = Localization(GRID, frozenset({"dog"}))
    two_dogs = Reference((("dog", (cell_box(3),)), ("dog", (cell_box(12),))), frozenset())
    loc.add_generated(["dog", "dog"], np.stack([cell(12), cell(3)]), {}, [two_dogs])
    g = loc.figures()["generated"]
    # precision: the words at cells 12 and 3 against the first dog (cell 3): [miss, hit]; recall: the dogs at cells
    # 3 and 12 against the first word (cell 12): [miss, hit]
    assert g["precision_all"] == 0.5 and g["recall_all"] == 0.5 and g["f1_all"] == 0.5


def test_gvd_takes_f1_from_the_averaged_precision_and_recall():
    loc = Localization(GRID, frozenset({"dog", "man"}))
    dog, man = ("dog", (cell_box(3),)), ("man", (cell_box(5),))
    # photo 1: dog and man both placed right; one reference boxes both, three name the dog without a box (excluded)
    # and do not name the man (hallucinated)
    unboxed_dog = Reference((), frozenset({"dog"}))
    loc.add_generated(["dog", "man"], np.stack([cell(3), cell(5)]), {}, [Reference((dog, man), frozenset())]
                      + [unboxed_dog] * 3)
    # photo 2: a caption naming no object, three references with a dog
    loc.add_generated(["a", "scene"], np.stack([cell(0), cell(0)]), {}, [Reference((dog,), frozenset())] * 3)
    g = loc.figures()["generated"]
    # dog: precision 1 of 1, recall 1 of 4; man: precision 1 of 4, recall 1 of 1
    precision, recall = (1 + 1 / 4) / 2, (1 / 4 + 1) / 2
    assert g["precision_all"] == pytest.approx(precision) and g["recall_all"] == pytest.approx(recall)
    assert g["f1_all"] == pytest.approx(2 * precision * recall / (precision + recall))  # 0.625
    per_class_f1 = 2 * 1 * (1 / 4) / (1 + 1 / 4)  # 0.4 for each class
    assert g["f1_all"] != pytest.approx(per_class_f1)  # not the mean of the per-class F1s
    # _loc: the pairs where the caption names the class and the reference boxes it: all hits
    assert g["precision_loc"] == 1.0 and g["recall_loc"] == 1.0 and g["f1_loc"] == 1.0


def test_a_class_named_without_a_box_is_no_hallucination_under_gvd(tmp_path):
    """Photo 400 boxes the grass; photo 401 names it as a scene chain only. A caption that places the dog and the
    grass rightly on both: GVD leaves the second grass out, the per-photo variant counts it as hallucinated."""
    for photo_id, grass in (("400", "[/EN#2/other grass]"), ("401", "[/EN#2/scene the grass]")):
        write_photo(tmp_path, photo_id, [f"[/EN#1/animals A dog] runs on {grass} ."], (100, 100),
                    {"1": [(76, 1, 100, 25)], "2": [(1, 76, 25, 100)] if photo_id == "400" else "scene"})
    entities = read_entities(tmp_path, ["400", "401"])
    figures = LocalizationFigures.build(GRID, entities, 1)
    assert figures.vocabulary == "gvd"  # dog and grass are among GVD's classes
    for photo in entities.images.values():
        annotated = {key: boxes for key, (boxes, _) in photo.boxed_heads().items()}
        figures.add(SimpleNamespace(setting="generated", lemmas=["a", "dog", "on", "grass"], photo=photo,
                                    maps=np.stack([cell(0), cell(3), cell(0), cell(12)]), annotated=annotated))
    g = figures.figures()["localization"]["generated"]
    assert g["classes"] == 2 and g["references"] == 2
    # GVD: dog [hit, hit], grass [hit] (photo 401's grass: named by its reference, not boxed: not counted)
    assert g["precision_all"] == pytest.approx((1 + 1) / 2)  # it would be (1 + 1/2) / 2 counted as hallucinated
    assert g["recall_all"] == pytest.approx((1 + 1) / 2) and g["f1_all"] == pytest.approx(1.0)
    # per photo: grass named on two photos, annotated (and found) on one: precision 1/2
    p = g["per_photo"]
    assert p["precision_all"] == pytest.approx((1 + 1 / 2) / 2) and p["recall_all"] == pytest.approx((1 + 1) / 2)
    assert p["f1_all_per_class_mean"] == pytest.approx((1 + 2 * (1 / 2) * 1 / (1 / 2 + 1)) / 2)
    # the references as GVD's comparison reads them
    assert references(entities.images["401"], figures.localization.classes) == [
        Reference((("dog", ((0.75, 0.0, 1.0, 0.25),)),), frozenset({"grass"}))]


def test_gvd_vocabulary_read_by_lemma(tmp_path):
    classes = read_classes()  # GVD's 480 names
    names = [line for line in GVD_CLASSES.read_text().splitlines() if line and not line.startswith("#")]
    assert len(names) == 480 and len(set(classes.values())) == 477  # people, outfits, papers fold into another
    assert {classes[lemma(w)] for w in ("dogs", "people", "persons")} == {"dog", "person"}
    assert [classes[lemma(w)] for w in ("stairs", "sunglasses", "glasses", "trunks", "graffiti")] == [
        "stair", "sunglass", "glass", "trunk", "graffitus"]
    assert "walk" not in classes and "a" not in classes
    own = tmp_path / "names.txt"
    own.write_text("# my classes\ndog\nhorses\n")
    assert object_classes(own, []) == {"dog": "dog", "horse": "horses"}
    assert object_classes("frequent", [], 1) == {}
    # a word of a class is scored under the class: "glasses" teacher-forced counts as GVD's "glass"
    loc = Localization(GRID, classes)
    loc.add_teacher_forced(cell(0), [cell_box(0)], "glasses")
    assert loc.figures()["teacher_forced"]["classes"] == 1 and dict(loc.teacher["model"]) == {"glass": [True]}


def test_box_grounding_reports_them_from_the_published_files(tmp_path):
    # a 100x100 photo, 4x4 grid: the man in the top-left cell (pixels 1-25), the dog in the bottom-right one
    write_photo(tmp_path, "300", ["[/EN#1/people A man] walks [/EN#2/animals a dog] ."], (100, 100),
                {"1": [(1, 1, 25, 25)], "2": [(76, 76, 100, 100)]})
    entities = read_entities(tmp_path, ["300_x"])
    assert frequent_classes(entities.images.values(), 2) == frozenset()  # each boxed in one photo only
    grounding = BoxGrounding(entities, GRID, class_photos=1)
    photo = entities.get("300_x")
    alphas = np.stack([cell(5), cell(0), cell(5), cell(5), cell(0)])  # a man walks a dog: the dog's map misses
    grounding.add_teacher_forced(photo, 0, alphas)
    grounding.add_generated("300_x", ["a", "man", "walks", "a", "dog", "and", "a", "cat"], np.stack([cell(0)] * 8))
    loc = grounding.figures()["localization"]
    assert loc["teacher_forced"] == {"accuracy": 0.5, "accuracy_words": 0.5, "words": 2, "classes": 2}
    # generated, per photo: man found, dog named in the man's cell, a cat (a GVD class) named that is not boxed
    p = loc["generated"]["per_photo"]
    assert p["f1_loc_per_class_mean"] == 0.5 and p["classes_all"] == 3
    assert p["f1_all_per_class_mean"] == pytest.approx((1 + 0 + 0) / 3)
    # GVD's: man [hit], dog [misplaced], the cat hallucinated but in no reference's objects: (1 + 0 + 0) / 2 both
    # ways. They need the caption's photo, which grounding.CaptionRead carries once it has a ``photo`` field.
    expected = 0.5 if "photo" in CaptionRead.__dataclass_fields__ else None
    assert loc["generated"]["f1_all"] == expected and loc["generated"]["f1_loc"] == expected
    line, gvd, per_photo, baselines = format_grounding(grounding.figures())[-4:]
    assert baselines.startswith("  the same words' whole photo / centre cell: accuracy 0.0% / 0.0%")
    assert line.startswith("IoU > 0.5 (map at 0.5 of its max, largest region's box; 477 object classes, GVD's 480 "
                           "names): teacher-forced accuracy 50.0% over 2 classes")
    assert gvd.startswith("  generated, GVD's protocol") and per_photo.startswith("  generated, per photo:")


def test_validation_leaves_the_iou_figures_out(tmp_path):
    """Validation reports pointing only: its BoxGrounding computes no box per word (no map_box on its hot path)."""
    write_photo(tmp_path, "301", ["[/EN#1/people A man] walks ."], (100, 100), {"1": [(1, 1, 25, 25)]})
    entities = read_entities(tmp_path, ["301_x"])
    grounding = BoxGrounding(entities, GRID, metrics=("pointing",))
    grounding.add_generated("301_x", ["a", "man", "walks"], np.stack([cell(0)] * 3))
    figures = grounding.figures()
    assert figures["localization"] is None and figures["generated"]["pointing"] == 1.0
    assert not any(line.startswith("IoU") for line in format_grounding(figures))
