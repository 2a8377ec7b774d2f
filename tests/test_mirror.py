"""data.mirror: mirrored training copies, their feature-cache keys and their captions."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from captioner.commands import extract
from captioner.data import datasets
from captioner.data.datasets import (
    MIRROR_SUFFIX,
    ImageRecord,
    mirrored_records,
    swap_left_right_text,
    swap_left_right_tokens,
)
from captioner.data.features import FeatureCache, extract_features
from captioner.data.images import load_image
from tests.test_features import SIZE, _extract_argv, make_images

torch.set_num_threads(1)


def test_caption_swap_exchanges_left_and_right_only():
    tokens = "a dog on the left of a man , right hand up , leftover cake".split()
    assert swap_left_right_tokens(tokens) == \
        "a dog on the right of a man , left hand up , leftover cake".split()
    assert swap_left_right_text("Left of the man, a dog turns right.") == "Right of the man, a dog turns left."
    assert swap_left_right_text("a bright, upright leftover") == "a bright, upright leftover"  # words, not parts


def _record(i: int, path: Path) -> ImageRecord:
    return ImageRecord(image_id=f"id{i}", path=path, captions=[["a", "cat", "on", "the", "left"]],
                       raw=["A cat on the left."], objects=[{"name": "cat", "box": [0, 0, 1, 1]}])


def test_mirrored_records_are_new_keys_for_the_same_file():
    original = [_record(0, Path("a.jpg")), _record(1, Path("b.jpg"))]
    mirrored = mirrored_records(original)
    assert [m.image_id for m in mirrored] == ["id0" + MIRROR_SUFFIX, "id1" + MIRROR_SUFFIX]
    assert all(m.mirrored and not o.mirrored and m.path == o.path for m, o in zip(mirrored, original))
    assert mirrored[0].captions == [["a", "cat", "on", "the", "right"]] and mirrored[0].raw == ["A cat on the right."]
    assert original[0].captions == [["a", "cat", "on", "the", "left"]]  # the originals are untouched
    assert mirrored[0].objects == []
    with pytest.raises(ValueError, match="already a mirrored copy"):
        mirrored_records(mirrored)


@pytest.fixture(scope="module")
def encoder():
    from captioner.models.encoder import build_encoder

    torch.manual_seed(0)
    return build_encoder("efficientnet_lite0", pretrained=False, input_size=SIZE, stage=2)


def test_mirrored_grids_sit_beside_the_originals_and_are_the_flipped_images(tmp_path, encoder):
    """The cache holds <id> and <id>#mirror; the mirrored row is the encoder's grid of the flipped image,
    and a cache first filled with the originals only is extended without recomputing them."""
    images = make_images(tmp_path / "images", 3)
    originals = [_record(i, r.path) for i, r in enumerate(images)]
    cache_dir = tmp_path / "cache"
    extract_features(encoder, originals, cache_dir, batch_size=2, num_workers=0, progress=False)
    before = FeatureCache.open(cache_dir).get_batch(["id0", "id1", "id2"]).copy()
    mirrored = mirrored_records(originals)
    cache = extract_features(encoder, originals + mirrored, cache_dir, batch_size=2, num_workers=0, progress=False)
    assert cache.stats["processed"] == 3  # only the mirrored copies were computed
    assert set(cache.rows) == {"id0", "id1", "id2", "id0#mirror", "id1#mirror", "id2#mirror"}
    np.testing.assert_array_equal(cache.get_batch(["id0", "id1", "id2"]), before)
    x = torch.stack([encoder.transform(load_image(r.path)) for r in originals])  # (3, 3, S, S)
    with torch.inference_mode():
        flipped = encoder.backbone_features(x.flip(-1)).float().numpy()  # (3, L, D)
    for i in range(3):
        got = cache.get(f"id{i}#mirror").astype(np.float32)
        np.testing.assert_allclose(got, flipped[i], rtol=2e-3, atol=2e-3)
        assert not np.allclose(got, before[i].astype(np.float32), atol=1e-2)  # the images are not symmetric


def test_extract_command_caches_the_mirrored_training_copies_only(tmp_path, monkeypatch, capsys):
    images = make_images(tmp_path / "images", 3)
    records = {"train": [_record(i, r.path) for i, r in enumerate(images[:2])],
               "val": [_record(2, images[2].path)], "test": []}
    monkeypatch.setattr(datasets, "load_records", lambda data, split: records[split])
    assert extract.main(_extract_argv(tmp_path) + ["--set", "data.mirror=true"]) == 0
    assert "5 grids cached" in capsys.readouterr().out
    (directory,) = (tmp_path / "features").iterdir()
    rows = json.loads((directory / "index.json").read_text())["rows"]
    assert set(rows) == {"id0", "id1", "id2", "id0#mirror", "id1#mirror"}  # val is never mirrored


def test_training_with_mirror_reads_both_copies(tmp_path):
    """One epoch on the shapes smoke data with data.mirror: twice the training captions, so twice the steps."""
    import math

    from captioner.config import load_config
    from captioner.data.datasets import load_records
    from captioner.store.checkpoint import load_checkpoint
    from captioner.training.loop import train

    steps = {}
    for mirror in (False, True):
        cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml",
                          [f"train.run_dir={tmp_path / str(mirror)}", "train.epochs=1", f"data.mirror={mirror}",
                           f"data.root={tmp_path / 'smoke'}", "train.tensorboard_images=0"])
        run_dir = train(cfg)
        steps[mirror] = load_checkpoint(run_dir / "last.pt")["step"]
    n_captions = sum(len(r.captions) for r in load_records(cfg.data, "train"))
    assert steps == {False: math.ceil(n_captions / cfg.train.batch_size),
                     True: math.ceil(2 * n_captions / cfg.train.batch_size)}
