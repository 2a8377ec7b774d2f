"""The feature cache (captioner/data/features.py): round trip, resume after a crash, fingerprint checks,
unreadable images, the `captioner extract` command."""

import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.commands import extract
from captioner.data import features as feat
from captioner.data.features import FeatureCache, FeatureCacheError, cache_dir_for, extract_features
from captioner.data.images import load_image
from captioner.models.encoder import build_encoder

torch.set_num_threads(1)
SIZE = 32  # input size: efficientnet_lite0 stage 2 (stride 8) gives a 4 x 4 x 40 grid


@dataclass
class Rec:  # the two ImageRecord fields extraction reads
    image_id: str
    path: Path


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return build_encoder("efficientnet_lite0", pretrained=False, input_size=SIZE, stage=2)


def make_images(folder: Path, n: int, bad: tuple[int, ...] = ()) -> list[Rec]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        path = folder / f"img{i:03d}.png"
        if i in bad:
            path.write_bytes(b"this is not an image")
        else:
            Image.fromarray(rng.integers(0, 256, (24 + i, 40, 3), dtype=np.uint8)).save(path)
        records.append(Rec(f"id{i}", path))
    return records


def direct_grids(encoder, records) -> np.ndarray:
    x = torch.stack([encoder.transform(load_image(r.path)) for r in records])  # (N, 3, S, S)
    with torch.inference_mode():
        return encoder.backbone_features(x).float().numpy()  # (N, L, D)


def count_calls(monkeypatch, encoder) -> list[int]:
    """Batch sizes the backbone sees, so tests can tell which images were (re)computed."""
    seen: list[int] = []
    original = type(encoder).backbone_features

    def counted(images):
        seen.append(images.shape[0])
        return original(encoder, images)

    monkeypatch.setattr(encoder, "backbone_features", counted)
    return seen


def test_round_trip_matches_the_encoder(tmp_path, encoder):
    records = make_images(tmp_path / "images", 7)
    cache = extract_features(encoder, records, tmp_path / "cache", batch_size=3, num_workers=2, progress=False)
    expected = direct_grids(encoder, records)
    assert cache.grid_hw == (4, 4) and cache.dim == 40 and cache.complete and len(cache) == 7
    reopened = FeatureCache.open(tmp_path / "cache", expected_fingerprint=encoder.fingerprint())
    for i, r in enumerate(records):
        grid = reopened.get(r.image_id)
        assert grid.dtype == np.float16 and grid.shape == (16, 40)
        np.testing.assert_allclose(grid.astype(np.float32), expected[i], rtol=2e-3, atol=2e-3)
    batch = reopened.get_batch(["id4", "id1"])
    assert batch.shape == (2, 16, 40)
    np.testing.assert_array_equal(batch[0], reopened.get("id4"))
    assert "id99" not in reopened
    with pytest.raises(KeyError, match="unknown image id"):
        reopened.get("id99")
    # pickles into DataLoader workers without copying the grids
    clone = pickle.loads(pickle.dumps(reopened))
    assert clone._grids is None and np.array_equal(clone.get("id2"), reopened.get("id2"))
    assert cache.stats["processed"] == 7 and cache.stats["images_per_s"] > 0


def test_resume_after_interruption_skips_finished_rows(tmp_path, encoder, monkeypatch):
    records = make_images(tmp_path / "images", 8)
    straight = extract_features(encoder, records, tmp_path / "straight", batch_size=2, num_workers=0,
                                progress=False)

    class Crash(Exception):
        pass

    def crash_after_two(batch_index, n_done):
        if batch_index == 1:
            raise Crash

    calls = count_calls(monkeypatch, encoder)
    with pytest.raises(Crash):
        extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False,
                         on_batch=crash_after_two)
    assert sum(calls) == 4 and len(FeatureCache.open(tmp_path / "cache")) == 4
    calls.clear()
    resumed = extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False)
    assert sum(calls) == 4  # only the four rows the crash left undone
    assert resumed.complete
    np.testing.assert_array_equal(resumed.get_batch([r.image_id for r in records]),
                                  straight.get_batch([r.image_id for r in records]))


def test_rows_written_but_not_committed_are_recomputed(tmp_path, encoder, monkeypatch):
    # a crash after the grids hit the file but before the progress file names them: those rows are not done
    records = make_images(tmp_path / "images", 6)
    real_save = feat._save_progress
    saves = []

    def save_then_die(directory, done, failures):
        saves.append(1)
        if len(saves) == 2:
            raise KeyboardInterrupt
        real_save(directory, done, failures)

    monkeypatch.setattr(feat, "_save_progress", save_then_die)
    with pytest.raises(KeyboardInterrupt):  # a commit per batch: the second commit dies
        extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False,
                         commit_every=1)
    monkeypatch.setattr(feat, "_save_progress", real_save)
    partial = FeatureCache.open(tmp_path / "cache")
    assert len(partial) == 2 and "id2" not in partial  # batch 2 was written, never committed
    calls = count_calls(monkeypatch, encoder)
    final = extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False)
    assert sum(calls) == 4 and final.complete
    np.testing.assert_allclose(final.get_batch([r.image_id for r in records]).astype(np.float32),
                               direct_grids(encoder, records), rtol=2e-3, atol=2e-3)


def test_new_images_are_appended_without_recomputing_old_ones(tmp_path, encoder, monkeypatch):
    records = make_images(tmp_path / "images", 6)
    extract_features(encoder, records[:4], tmp_path / "cache", batch_size=4, num_workers=0, progress=False)
    calls = count_calls(monkeypatch, encoder)
    cache = extract_features(encoder, records, tmp_path / "cache", batch_size=4, num_workers=0, progress=False)
    assert sum(calls) == 2 and cache.complete and cache.shape[0] == 6
    np.testing.assert_allclose(cache.get_batch(["id0", "id5"]).astype(np.float32),
                               direct_grids(encoder, [records[0], records[5]]), rtol=2e-3, atol=2e-3)


def test_mismatched_fingerprint_is_refused_naming_the_fields(tmp_path, encoder):
    records = make_images(tmp_path / "images", 2)
    extract_features(encoder, records, tmp_path / "cache", num_workers=0, progress=False)
    other = build_encoder("efficientnet_lite0", pretrained=False, input_size=SIZE, stage=1)
    with pytest.raises(FeatureCacheError) as err:
        FeatureCache.open(tmp_path / "cache", expected_fingerprint=other.fingerprint())
    message = str(err.value)
    assert "stage: cache 2, expected 1" in message and "dim:" in message and "captioner extract" in message
    with pytest.raises(FeatureCacheError, match="different encoder"):
        extract_features(other, records, tmp_path / "cache", num_workers=0, progress=False)


def test_unreadable_images_are_listed_and_skipped(tmp_path, encoder):
    records = make_images(tmp_path / "images", 10, bad=(3,))
    cache = extract_features(encoder, records, tmp_path / "cache", batch_size=4, num_workers=0,
                             max_failure_share=0.2, progress=False)
    assert "id3" not in cache and len(cache) == 9 and cache.stats["failed"] == 1
    assert "img003.png" in cache.failures["id3"]
    with pytest.raises(KeyError, match="img003.png"):
        cache.get("id3")
    assert "id3" in FeatureCache.open(tmp_path / "cache").failures  # survives on disk


def test_too_many_unreadable_images_stop_extraction(tmp_path, encoder):
    records = make_images(tmp_path / "images", 10, bad=(0, 1, 2))
    with pytest.raises(FeatureCacheError, match=r"3 of 10 images.*max_failure_share=0.1.*img000.png"):
        extract_features(encoder, records, tmp_path / "cache", batch_size=4, num_workers=0,
                         max_failure_share=0.1, progress=False)


def test_fine_tuned_encoder_caches_the_activations_below_its_trained_blocks(tmp_path):
    """What a fine-tuned encoder's cache holds is tested in tests/test_split_cache.py; here: the rows are the
    bottom's, not the grid, and the cache is keyed by the split."""
    tuned = build_encoder("efficientnet_lite0", pretrained=False, input_size=SIZE, stage=2, finetune_blocks=1)
    cache = extract_features(tuned, make_images(tmp_path / "images", 1), tmp_path / "cache", progress=False,
                             num_workers=0)
    assert cache.fingerprint == tuned.cache_fingerprint() and "split" in cache.fingerprint
    assert cache.shape == (1, 16, tuned.cache_shape[2])


def test_cache_dir_for():
    from captioner.config import DataConfig

    fp = {"name": "timm:resnet18", "stage": 4}
    assert cache_dir_for(DataConfig(features_dir="/x/y"), fp) == Path("/x/y")
    auto = cache_dir_for(DataConfig(root="data/coco"), fp)
    assert auto.parent == Path("data/coco/features") and auto.name.startswith("timm_resnet18-")
    assert cache_dir_for(DataConfig(root="data/coco"), {**fp, "stage": 3}) != auto


def _extract_argv(root: Path) -> list[str]:
    """`captioner extract` arguments for a tiny random encoder over the data root ``root``."""
    return ["--set", f"data.root={root}", "--set", "model.encoder.pretrained=false",
            "--set", f"model.encoder.input_size={SIZE}", "--set", "model.encoder.stage=2",
            "--set", "data.num_workers=0", "--no-progress"]


def test_extract_command(tmp_path, monkeypatch, capsys):
    from captioner.data import datasets

    records = {"train": make_images(tmp_path / "images", 3), "val": [], "test": []}
    monkeypatch.setattr(datasets, "load_records", lambda data, split: records[split])
    argv = _extract_argv(tmp_path)
    assert extract.main(argv) == 0
    out = capsys.readouterr().out
    assert "images/s" in out and "3 grids cached" in out
    (directory,) = (tmp_path / "features").iterdir()
    index = json.loads((directory / "index.json").read_text())
    assert index["grid_hw"] == [4, 4] and index["dim"] == 40 and set(index["rows"]) == {"id0", "id1", "id2"}
    # a fine-tuned encoder caches the activations below its trained block, in a directory of its own
    assert extract.main(argv + ["--set", "model.encoder.finetune_blocks=1"]) == 0
    assert "activations below the trained blocks 4x4x40" in capsys.readouterr().out
    split = [d for d in (tmp_path / "features").iterdir() if d != directory]
    assert len(split) == 1
    index = json.loads((split[0] / "index.json").read_text())
    assert index["fingerprint"]["split"] == {"finetune_blocks": 1, "cached_hw": [4, 4], "cached_dim": 40}
    assert set(index["rows"]) == {"id0", "id1", "id2"}


def test_extract_command_skips_a_split_the_data_set_lacks_unless_named(tmp_path, monkeypatch, capsys):
    """Flickr8k as built here has no test split: the default extracts train and val and says so;
    naming the missing split is still an error."""
    from captioner.data import datasets

    records = {"train": make_images(tmp_path / "images", 2), "val": []}

    def load_records(data, split):
        if split not in records:
            raise datasets.EmptySplitError(f"dataset.json: split {split!r} has no images")
        return records[split]

    monkeypatch.setattr(datasets, "load_records", load_records)
    argv = _extract_argv(tmp_path)
    assert extract.main(argv) == 0
    out = capsys.readouterr().out
    assert "skipping split 'test'" in out and "2 grids cached" in out
    assert extract.main(argv + ["--splits", "train,test"]) == 1
    assert "split 'test' has no images" in capsys.readouterr().err


# ----------------------------------------------------------------------------- commits and reads


def _progress_rows(directory: Path) -> int:
    return json.loads((directory / "progress.json").read_text())["n_done"]


def test_commits_every_n_batches_and_at_the_end(tmp_path, encoder, monkeypatch):
    records = make_images(tmp_path / "images", 10)
    real_save = feat._save_progress
    committed: list[int] = []  # rows the progress file names, at each commit

    def counted(directory, done, failures):
        committed.append(int(done.sum()))
        real_save(directory, done, failures)

    monkeypatch.setattr(feat, "_save_progress", counted)
    cache = extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False,
                             commit_every=2)
    assert committed == [4, 8, 10] and cache.complete  # after batches 2 and 4, then the fifth at the end
    committed.clear()
    extract_features(encoder, records, tmp_path / "cache", num_workers=0, progress=False)
    assert committed == []  # nothing left to do: no commit
    committed.clear()
    extract_features(encoder, records, tmp_path / "timed", batch_size=2, num_workers=0, progress=False,
                     commit_every=100, commit_seconds=0.0)
    assert committed == [2, 4, 6, 8, 10]  # the clock's limit commits every batch here


def test_a_kill_between_commits_resumes_from_the_last_commit(tmp_path, encoder, monkeypatch):
    """Commits every 3 batches; the second commit dies (as a kill would): rows 0-5 are committed, rows 6-11 were
    written but are not trusted, and the resumed run computes exactly those and matches an uninterrupted run."""
    records = make_images(tmp_path / "images", 14)
    straight = extract_features(encoder, records, tmp_path / "straight", batch_size=2, num_workers=0,
                                progress=False)
    real_save = feat._save_progress
    saves = []

    def die_at_second(directory, done, failures):
        saves.append(int(done.sum()))
        if len(saves) == 2:
            raise KeyboardInterrupt
        real_save(directory, done, failures)

    monkeypatch.setattr(feat, "_save_progress", die_at_second)
    with pytest.raises(KeyboardInterrupt):
        extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False,
                         commit_every=3)
    assert saves == [6, 12]  # the dying commit was not retried on the way out
    monkeypatch.setattr(feat, "_save_progress", real_save)
    partial = FeatureCache.open(tmp_path / "cache")
    assert len(partial) == 6 == _progress_rows(tmp_path / "cache") and "id6" not in partial
    calls = count_calls(monkeypatch, encoder)
    resumed = extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False,
                               commit_every=3)
    assert sum(calls) == 8 and resumed.complete
    ids = [r.image_id for r in records]
    np.testing.assert_array_equal(resumed.get_batch(ids), straight.get_batch(ids))


def test_an_error_between_commits_keeps_the_rows_written(tmp_path, encoder, monkeypatch):
    """An exception outside a commit (a failing batch, Ctrl-C) commits what was written before it stops."""
    records = make_images(tmp_path / "images", 10)

    class Crash(Exception):
        pass

    def crash_at_third(batch_index, n_done):
        assert n_done == 2 * (batch_index + 1)  # written rows, committed or not
        if batch_index == 2:
            raise Crash

    with pytest.raises(Crash):
        extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False,
                         on_batch=crash_at_third, commit_every=50)
    assert len(FeatureCache.open(tmp_path / "cache")) == 6 == _progress_rows(tmp_path / "cache")
    calls = count_calls(monkeypatch, encoder)
    assert extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0,
                            progress=False).complete
    assert sum(calls) == 4


def test_rows_are_read_with_pread_as_the_memmap_holds_them(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"id{i}" for i in range(7)]
    grids = rng.standard_normal((7, 6, 5)).astype(np.float16)  # (N, L, D)
    with feat.CacheWriter(tmp_path / "cache", ids, {"name": "random"}, (2, 3), 5) as writer:
        writer.write(np.arange(7), grids)
        writer.end_batch()
    cache = FeatureCache.open(tmp_path / "cache")
    order = ["id5", "id0", "id5", "id3"]  # any order, repeats included
    batch = cache.get_batch(order)
    assert batch.dtype == np.float16 and batch.shape == (4, 6, 5)
    np.testing.assert_array_equal(batch, grids[[5, 0, 5, 3]])
    np.testing.assert_array_equal(batch, cache.grids[[5, 0, 5, 3]])
    np.testing.assert_array_equal(cache.get("id6"), grids[6])
    assert cache.get_batch([]).shape == (0, 6, 5)
    clone = pickle.loads(pickle.dumps(cache))  # into a worker: it opens the file itself
    assert clone._fd is None and clone._grids is None
    np.testing.assert_array_equal(clone.get_batch(order), batch)
