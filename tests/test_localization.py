"""GVD's grounding figures (captioner/evaluation/localization.py), computed by hand on small maps: the upsampled
map, the box of its largest region above half its maximum, IoU, and the teacher-forced accuracy and generated
F1_all / F1_loc per class; then through BoxGrounding on Flickr30k Entities files in their published format."""

from __future__ import annotations

import numpy as np
import pytest
from entities_fixture import write_photo  # tests/entities_fixture.py

from captioner.data.entities import read_entities
from captioner.evaluation.grounding import BoxGrounding, format_grounding
from captioner.evaluation.localization import Localization, frequent_classes, iou, localises, map_box, upsample

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


def test_accuracy_and_f1_by_hand():
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
    assert g["precision_all"] == pytest.approx((0 + 1 + 0 + 0) / 4)
    assert g["recall_all"] == pytest.approx((0 + 1 + 0 + 0) / 4)
    assert g["f1_all"] == pytest.approx((0 + 1 + 0 + 0) / 4) and g["classes_all"] == 4
    assert g["f1_loc"] == pytest.approx((1 + 0) / 2) and g["classes_loc"] == 2  # dog 2 of 2, man 0 of 1
    # the baselines on the same words: the whole photo never fits a one-cell box; the centre cell (index 10) is the
    # second photo's dog
    whole, centre = f["baselines"]["whole_photo"], f["baselines"]["centre_cell"]
    assert whole["accuracy"] == 0.0 and whole["f1_all"] == 0.0 and whole["f1_loc"] == 0.0
    assert centre["accuracy"] == 0.0 and centre["f1_loc"] == pytest.approx((0.5 + 0) / 2)
    assert centre["f1_all"] == pytest.approx((0 + 0.5 + 0 + 0) / 4)  # dog: precision 1/2, recall 1/2
    empty = Localization(GRID, frozenset()).figures()
    assert empty["teacher_forced"]["accuracy"] is None and empty["generated"]["f1_all"] is None


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
    # generated: man found, dog named in the man's cell; "cat" heads no boxed phrase, so it is no object
    assert loc["generated"]["f1_loc"] == 0.5 and loc["generated"]["classes_all"] == 2
    assert loc["generated"]["f1_all"] == pytest.approx(0.5)
    line, baselines = format_grounding(grounding.figures())[-2:]
    assert baselines.startswith("  the same words' whole photo / centre cell: accuracy 0.0% / 0.0%")
    assert line.startswith("IoU > 0.5 (map at 0.5 of its max, largest region's box; 2 object classes, boxed in 1+")
    assert "teacher-forced accuracy 50.0% over 2 classes" in line


def test_validation_leaves_the_iou_figures_out(tmp_path):
    """Validation reports pointing only: its BoxGrounding computes no box per word (no map_box on its hot path)."""
    write_photo(tmp_path, "301", ["[/EN#1/people A man] walks ."], (100, 100), {"1": [(1, 1, 25, 25)]})
    entities = read_entities(tmp_path, ["301_x"])
    grounding = BoxGrounding(entities, GRID, metrics=("pointing",))
    grounding.add_generated("301_x", ["a", "man", "walks"], np.stack([cell(0)] * 3))
    figures = grounding.figures()
    assert figures["localization"] is None and figures["generated"]["pointing"] == 1.0
    assert not any(line.startswith("IoU") for line in format_grounding(figures))
