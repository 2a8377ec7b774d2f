"""Words by class (evaluation/word_classes.py), by hand on one annotated photo: a man and a cat boxed, a room as
the scene (tests/test_entities.py's fixture)."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.data.entities import read_entities
from captioner.evaluation.word_classes import WordClassTally, format_word_classes, photo_lexicon
from tests.test_entities import photo_folder  # noqa: F401  (the fixture)


def test_classes_entropy_and_consensus_recall_by_hand(photo_folder):  # noqa: F811
    photo = read_entities(photo_folder, ["100_a"]).get("100_a")
    kinds, named = photo_lexicon(photo)
    # "man" (1 reference) and "cat" (both) head boxed phrases; "room" heads the scene chain of one reference
    assert kinds == {"man": "object", "cat": "object", "room": "scene"} and named == {"man": 1, "cat": 2, "room": 1}
    tally = WordClassTally()
    half = [0.5, 0.5, 0.0, 0.0]  # entropy log 2 / log 4 = 0.5
    alphas = np.array([half, [1.0, 0, 0, 0], half, half, [0.25] * 4])
    tally.add(photo, ["a", "cats", "in", "the", "room"], alphas)
    tally.add(photo, ["a", "man"], np.array([half, [0.25] * 4]))
    f = tally.figures()
    assert (f["object"]["words"], f["scene"]["words"], f["other"]["words"]) == (2, 1, 4)
    assert f["object"]["words_per_caption"] == 1.0 and f["other"]["words_per_caption"] == 2.0
    assert f["object"]["entropy"] == pytest.approx((0.0 + 1.0) / 2) and f["scene"]["entropy"] == pytest.approx(1.0)
    assert f["other"]["entropy"] == pytest.approx(0.5) and f["object"]["alpha_max"] == pytest.approx((1 + 0.25) / 2)
    assert f["object"]["looked"] == pytest.approx(1.0)  # maps that sum to one: no sentinel
    sentinel = WordClassTally()
    # 0.4 and 0.9 of the two words' weight on the photo, the rest on the sentinel
    sentinel.add(photo, ["a", "cat"], np.array([[0.1, 0.1, 0.1, 0.1], [0.5, 0.2, 0.1, 0.1]]))
    assert sentinel.figures()["other"]["looked"] == pytest.approx(0.4)
    assert sentinel.figures()["object"]["looked"] == pytest.approx(0.9)
    # only "cat" is named by two references: the first caption names it (as "cats"), the second does not
    assert f["object"]["recall"] == 0.5 and f["object"]["asked"] == 2
    assert f["scene"]["recall"] is None and f["scene"]["asked"] == 0
    lines = format_word_classes(f)
    assert len(lines) == 4 and lines[1].split()[:2] == ["object", "2"]
