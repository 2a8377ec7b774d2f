"""Attention grounding on COCO instance masks, from a tiny instances file in COCO's real format."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from captioner.evaluation.regions import CocoInstances, coco_image_id, word_shares


@pytest.fixture
def instances(tmp_path):
    doc = {
        "images": [{"id": 42, "width": 20, "height": 20, "file_name": "COCO_val2014_000000000042.jpg"}],
        "categories": [{"id": 18, "name": "dog", "supercategory": "animal"},
                       {"id": 88, "name": "teddy bear", "supercategory": "indoor"}],
        "annotations": [{"id": 1, "image_id": 42, "category_id": 18, "iscrowd": 0, "area": 200.0,
                         "bbox": [0, 0, 10, 20], "segmentation": [[0, 0, 10, 0, 10, 20, 0, 20]]}],
    }
    path = tmp_path / "instances_val2014.json"
    path.write_text(json.dumps(doc))
    return CocoInstances(path)


def grounding(instances, image_id, words, alphas, grid_hw):
    """The mean share of one caption's category words, or None when no word names a category."""
    shares = word_shares(instances.image_regions(image_id, words), alphas, grid_hw)
    return float(np.mean(shares)) if shares else None


def test_attention_on_the_dog_mask_scores_one_and_off_it_zero(instances):
    left = np.array([[0.5, 0.0, 0.5, 0.0]])  # 2x2 grid, mass in the left column, where the dog is
    right = np.array([[0.0, 0.5, 0.0, 0.5]])
    assert grounding(instances, 42, ["dog"], left, (2, 2)) == pytest.approx(1.0, abs=0.05)
    assert grounding(instances, 42, ["dogs"], right, (2, 2)) == pytest.approx(0.0, abs=0.05)


def test_words_without_a_region_are_ignored(instances):
    alphas = np.full((3, 4), 0.25)
    assert grounding(instances, 42, ["a", "cat", "sleeps"], alphas, (2, 2)) is None  # cat: not in the image/file
    assert grounding(instances, 7, ["dog"], alphas[:1], (2, 2)) is None  # image not in the file
    assert grounding(instances, 42, ["teddy", "dog"], np.full((2, 4), 0.25), (2, 2)) == pytest.approx(0.5)
    assert instances.category("teddy") is None  # multi-word names are not matched word by word


def test_missing_instances_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="instances_val2014.json"):
        CocoInstances(tmp_path / "instances_val2014.json")


def test_coco_image_id_from_file_name():
    assert coco_image_id(SimpleNamespace(path=Path("x/COCO_val2014_000000391895.jpg"))) == 391895
    assert coco_image_id(SimpleNamespace(path=Path("x/photo.jpg"))) is None
