"""Caption readers on tiny fixtures written in each real format, their errors, and the torch datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.config import DataConfig, ShapesConfig
from captioner.data.datasets import (
    CaptionDataset,
    DataError,
    GridCaptionDataset,
    ImageCaptionDataset,
    build_vocab,
    collate_captions,
    load_records,
    read_karpathy,
)


def _image(path: Path, colour=(255, 0, 0)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)


def _karpathy(tmp_path: Path, images: list[dict], name="dataset_coco.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"dataset": "coco", "images": images}))
    return path


def _kimage(filename, split, captions, filepath="imgs"):
    return {"filename": filename, "filepath": filepath, "split": split, "imgid": 0,
            "sentences": [{"tokens": c.split(), "raw": c.capitalize() + "."} for c in captions]}


@pytest.fixture
def karpathy_root(tmp_path):
    for name in "abcd":
        _image(tmp_path / "imgs" / f"{name}.jpg")
    _karpathy(tmp_path, [
        _kimage("a.jpg", "train", ["a red dog", "a dog runs"]),
        _kimage("b.jpg", "restval", ["a blue cat"]),
        _kimage("c.jpg", "val", ["a green bird"]),
        _kimage("d.jpg", "test", ["a big zebra"]),
    ])
    return tmp_path


def test_karpathy_splits_restval_and_paths(karpathy_root):
    data = DataConfig(format="karpathy", root=str(karpathy_root))  # finds the one dataset_*.json in root
    train = load_records(data, "train")
    assert [r.image_id for r in train] == ["a", "b"]
    assert train[0].path == karpathy_root / "imgs" / "a.jpg"
    assert train[0].captions == [["a", "red", "dog"], ["a", "dog", "runs"]]
    assert train[0].raw == ["A red dog.", "A dog runs."]
    data.restval = False
    assert [r.image_id for r in load_records(data, "train")] == ["a"]
    assert [r.image_id for r in load_records(data, "test")] == ["d"]


def test_karpathy_flickr_without_filepath(tmp_path):
    _image(tmp_path / "x.jpg")
    image = _kimage("x.jpg", "val", ["two dogs"])
    del image["filepath"]
    path = _karpathy(tmp_path, [image], name="dataset_flickr8k.json")
    (record,) = read_karpathy(path, tmp_path, "val")
    assert record.path == tmp_path / "x.jpg"


@pytest.mark.parametrize("images, message", [
    ([_kimage("a.jpg", "train", ["a dog"]), _kimage("a.jpg", "train", ["a cat"])], "listed twice"),
    ([_kimage("a.jpg", "train", ["a dog", ""])], r"empty caption for image 'a.jpg' \(images\[0\].sentences\[1\]\)"),
    ([_kimage("a.jpg", "val", ["a dog"])], "split 'train' has no images"),
    ([_kimage("a.jpg", "train", ["a dog"], filepath="missing")], "image directory not found"),
])
def test_karpathy_bad_data_errors_name_file_and_entry(tmp_path, images, message):
    _image(tmp_path / "imgs" / "a.jpg")
    path = _karpathy(tmp_path, images)
    with pytest.raises(DataError, match=message) as err:
        read_karpathy(path, tmp_path, "train")
    assert str(path) in str(err.value)


def test_missing_caption_file_names_path_and_download(tmp_path):
    data = DataConfig(format="karpathy", root=str(tmp_path), captions=str(tmp_path / "dataset_coco.json"))
    with pytest.raises(DataError, match="caption_datasets.zip") as err:
        load_records(data, "train")
    assert str(tmp_path / "dataset_coco.json") in str(err.value)
    with pytest.raises(DataError, match=r"Flickr8k_Dataset.zip \(images\) and Flickr8k_text.zip"):
        load_records(DataConfig(format="flickr8k", root=str(tmp_path)), "train")
    with pytest.raises(DataError, match="annotations_trainval2014.zip"):
        load_records(DataConfig(format="coco", root=str(tmp_path)), "train")


# ----------------------------------------------------------------------------- COCO


def _coco_file(path: Path, images: list[tuple[int, str]], captions: list[tuple[int, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "info": {}, "licenses": [],
        "images": [{"id": i, "file_name": f, "width": 8, "height": 8} for i, f in images],
        "annotations": [{"id": k, "image_id": i, "caption": c} for k, (i, c) in enumerate(captions)],
    }))


@pytest.fixture
def coco_root(tmp_path):
    train_names = ["COCO_train2014_000000000001.jpg", "COCO_train2014_000000000002.jpg"]
    val_names = ["COCO_val2014_000000000003.jpg", "COCO_val2014_000000000004.jpg"]
    for n in train_names:
        _image(tmp_path / "train2014" / n)
    for n in val_names:
        _image(tmp_path / "val2014" / n)
    _coco_file(tmp_path / "annotations" / "captions_train2014.json", [(1, train_names[0]), (2, train_names[1])],
               [(1, "A Dog, running."), (1, "a brown dog"), (2, "Two cats")])
    _coco_file(tmp_path / "annotations" / "captions_val2014.json", [(3, val_names[0]), (4, val_names[1])],
               [(3, "A bird."), (4, "A horse!")])
    split = _karpathy(tmp_path, [
        _kimage(train_names[0], "train", ["x"], filepath="train2014"),
        _kimage(train_names[1], "restval", ["x"], filepath="train2014"),
        _kimage(val_names[0], "val", ["x"], filepath="val2014"),
        _kimage(val_names[1], "test", ["x"], filepath="val2014"),
    ])
    return tmp_path, split


def test_coco_annotations_by_file_and_by_karpathy_split(coco_root):
    root, split_file = coco_root
    data = DataConfig(format="coco", root=str(root))
    train = load_records(data, "train")
    assert [r.image_id for r in train] == ["COCO_train2014_000000000001", "COCO_train2014_000000000002"]
    assert train[0].captions == [["a", "dog", ",", "running", "."], ["a", "brown", "dog"]]  # tokenized here
    assert train[0].raw[0] == "A Dog, running."
    assert train[0].path == root / "train2014" / "COCO_train2014_000000000001.jpg"
    assert len(load_records(data, "val")) == 2
    with pytest.raises(DataError, match="split_file"):
        load_records(data, "test")
    data.split_file = str(split_file)
    assert [r.image_id for r in load_records(data, "test")] == ["COCO_val2014_000000000004"]
    assert len(load_records(data, "train")) == 2  # restval folded in
    data.restval = False
    assert len(load_records(data, "train")) == 1


def test_coco_duplicate_image_and_empty_caption(tmp_path):
    _image(tmp_path / "train2014" / "a.jpg")
    ann = tmp_path / "annotations" / "captions_train2014.json"
    _coco_file(ann, [(1, "a.jpg"), (1, "a.jpg")], [(1, "a dog")])
    with pytest.raises(DataError, match="listed twice") as err:
        load_records(DataConfig(format="coco", root=str(tmp_path)), "train")
    assert str(ann) in str(err.value)
    _coco_file(ann, [(1, "a.jpg")], [(1, "a dog"), (1, "  ")])
    with pytest.raises(DataError, match="empty caption for image 'a.jpg'"):
        load_records(DataConfig(format="coco", root=str(tmp_path)), "train")


# ----------------------------------------------------------------------------- Flickr8k


def _flickr(tmp_path: Path, token_lines: list[str]) -> DataConfig:
    root = tmp_path / "Flicker8k_Dataset"
    for n in ("1.jpg", "2.jpg", "3.jpg"):
        _image(root / n)
    text = tmp_path / "text"
    text.mkdir()
    (text / "Flickr8k.token.txt").write_text("\n".join(token_lines) + "\n")
    (text / "Flickr_8k.trainImages.txt").write_text("1.jpg\n2.jpg\n")
    (text / "Flickr_8k.devImages.txt").write_text("3.jpg\n")
    (text / "Flickr_8k.testImages.txt").write_text("")
    return DataConfig(format="flickr8k", root=str(root), captions=str(text / "Flickr8k.token.txt"))


def test_flickr8k_token_and_split_files(tmp_path):
    data = _flickr(tmp_path, ["1.jpg#1\tA dog runs .", "1.jpg#0\tA black dog", "2.jpg#0\tA cat", "3.jpg#0\tA bird"])
    train = load_records(data, "train")
    assert [r.image_id for r in train] == ["1", "2"]
    assert train[0].raw == ["A black dog", "A dog runs ."]  # caption index order
    assert train[0].captions[1] == ["a", "dog", "runs", "."]
    assert train[0].path == tmp_path / "Flicker8k_Dataset" / "1.jpg"
    assert [r.image_id for r in load_records(data, "val")] == ["3"]
    with pytest.raises(DataError, match="Flickr_8k.testImages.txt: split 'test' has no images"):
        load_records(data, "test")


@pytest.mark.parametrize("lines, message", [
    (["1.jpg#0\tA dog", "2.jpg#0\tA cat", "1.jpg#0\tA dog again"],
     r"Flickr8k.token.txt:3: caption 1.jpg#0 listed twice"),
    (["1.jpg#0\tA dog", "2.jpg#0\t ..."[:8]], r"Flickr8k.token.txt:2: empty caption for image '2.jpg'"),
    (["1.jpg#0\tA dog", "no tab here"], r"Flickr8k.token.txt:2: expected"),
    (["1.jpg#0\tA dog"], r"Flickr_8k.trainImages.txt:2: image '2.jpg' has no captions"),
])
def test_flickr8k_errors_name_file_and_line(tmp_path, lines, message):
    data = _flickr(tmp_path, lines)
    with pytest.raises(DataError, match=message):
        load_records(data, "train")


# ----------------------------------------------------------------------------- shapes


def test_shapes_generated_on_first_use(tmp_path):
    data = DataConfig(format="shapes", root=str(tmp_path / "shapes"),
                      shapes=ShapesConfig(n_train=3, n_val=2, n_test=1, image_size=32))
    train = load_records(data, "train")
    assert len(train) == 3 and len(load_records(data, "val")) == 2
    assert all(r.path.is_file() for r in train)
    from captioner.data.shapes import SHAPES

    objects = [o for r in train for o in r.objects]
    assert objects and all(o["name"] in SHAPES and len(o["box"]) == 4 for o in objects)


def test_unknown_format_and_split():
    with pytest.raises(DataError, match="valid formats: shapes, karpathy, coco, flickr8k"):
        load_records(DataConfig(format="nope"), "train")
    with pytest.raises(DataError, match="valid splits"):
        load_records(DataConfig(format="karpathy"), "dev")


# ----------------------------------------------------------------------------- datasets


class _Cache:
    def __init__(self, ids, L=4, D=3):
        self.grids = {i: np.full((L, D), k, dtype=np.float16) for k, i in enumerate(ids)}

    def __contains__(self, image_id):
        return image_id in self.grids

    def get(self, image_id):
        return self.grids[image_id]

    def get_batch(self, ids):
        return np.stack([self.grids[i] for i in ids])


def test_vocab_from_train_only_and_grid_dataset_collate(karpathy_root):
    data = DataConfig(format="karpathy", root=str(karpathy_root))
    train, val = load_records(data, "train"), load_records(data, "val")
    vocab = build_vocab(train)
    assert "dog" in vocab and "bird" not in vocab  # val words do not leak into the vocabulary
    cache = _Cache([r.image_id for r in train])
    ds = GridCaptionDataset(train, vocab, max_length=2, cache=cache)
    assert len(ds) == 3  # every caption of every image is an item
    assert ds.n_truncated == 3  # all three captions have 3 words > max_length 2
    batch = collate_captions([ds[0], ds[2]])
    assert batch.inputs.shape == (2, 4, 3) and batch.inputs.dtype == torch.float32
    assert batch.captions.shape == (2, 4)  # <start> w w <end>
    assert batch.lengths.tolist() == [4, 4]
    assert batch.captions[:, 0].eq(vocab.start_id).all()
    assert batch.inputs[1, 0, 0].item() == 1.0  # item 2 is image b's caption
    per_image = GridCaptionDataset(train, vocab, max_length=20, cache=cache, per_image=True)
    assert len(per_image) == 2
    with pytest.raises(DataError, match="feature cache lacks 1 images"):
        GridCaptionDataset(val, vocab, max_length=20, cache=cache)


def test_collate_pads_to_longest():
    items = [(torch.zeros(2, 1), torch.tensor([1, 5, 2]), 0), (torch.ones(2, 1), torch.tensor([1, 5, 6, 7, 2]), 1)]
    batch = collate_captions(items)
    assert batch.captions.tolist() == [[1, 5, 2, 0, 0], [1, 5, 6, 7, 2]]
    assert batch.lengths.tolist() == [3, 5]
    assert batch.indices.tolist() == [0, 1]


def test_image_dataset_loads_and_transforms(karpathy_root):
    train = load_records(DataConfig(format="karpathy", root=str(karpathy_root)), "train")
    vocab = build_vocab(train)
    ds = ImageCaptionDataset(train, vocab, max_length=20,
                             transform=lambda im: torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255)
    x, caption, index = ds[0]
    assert x.shape == (3, 8, 8) and x[0].min() > 0.9 and x[1].max() < 0.1  # red fixture image (JPEG)
    assert isinstance(ds, CaptionDataset) and caption[0] == vocab.start_id and index == 0


@pytest.mark.parametrize("preload_bytes", [0, 1 << 20])
def test_grid_dataset_batched_fetch_matches_per_item(karpathy_root, preload_bytes):
    from torch.utils.data import DataLoader

    train = load_records(DataConfig(format="karpathy", root=str(karpathy_root)), "train")
    vocab = build_vocab(train)
    ds = GridCaptionDataset(train, vocab, max_length=20, cache=_Cache([r.image_id for r in train]),
                            preload_bytes=preload_bytes)
    assert (ds.grids is not None) == (preload_bytes > 0)
    (batch,) = list(DataLoader(ds, batch_size=3, collate_fn=collate_captions))  # uses __getitems__
    expected = collate_captions([ds[i] for i in range(3)])
    for name in ("inputs", "captions", "lengths", "indices"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name


# ----------------------------------------------------------------------------- float16 rows to the device


def _records(n: int, captions: int = 2) -> list:
    from captioner.data.records import ImageRecord

    words = ["a", "dog", "cat", "runs", "on", "grass", "red", "ball"]
    return [ImageRecord(image_id=f"im{i}", path=Path(f"im{i}.jpg"),
                        captions=[[words[(i + j + k) % 8] for k in range(2 + (i + j) % 4)] for j in range(captions)],
                        raw=[f"caption {j}" for j in range(captions)]) for i in range(n)]


def _random_cache(tmp_path: Path, records: list, L: int = 6, D: int = 5):
    """A real FeatureCache (captioner/data/features.py) of random float16 rows, written by its own writer."""
    from captioner.data.features import CacheWriter, FeatureCache

    values = np.random.default_rng(0).standard_normal((len(records), L, D)).astype(np.float16)  # (N, L, D)
    with CacheWriter(tmp_path / "cache", [r.image_id for r in records], {"name": "random"}, (2, 3), D) as w:
        w.write(np.arange(len(records)), values)
    return FeatureCache.open(tmp_path / "cache")


def test_fp16_rows_widened_on_to_are_bit_identical_to_widening_on_the_cpu(tmp_path):
    """The training loader's batches keep the cache's float16; CaptionBatch.to widens them to exactly the float32
    tensor the CPU used to make (pad_batch(inputs.float(), ...)), so the model sees the same values."""
    from captioner.training.inputs import epoch_loader

    records = _records(9)
    cache = _random_cache(tmp_path, records)
    # one item per image: item i is record i, so each batch's indices name its items
    ds = GridCaptionDataset(records, build_vocab(records), max_length=20, cache=cache, per_image=True,
                            preload_bytes=0)
    for batch in epoch_loader(ds, 4, epoch=0, seed=0, rank=0, world=1, shuffle=True, num_workers=0,
                              pin_memory=False):
        assert batch.inputs.dtype == torch.float16  # (B, L, D), as cached
        moved = batch.to("cpu")
        before = collate_captions(ds.__getitems__(batch.indices.tolist()))  # the default collate widens on the CPU
        cpu_widened = torch.from_numpy(cache.get_batch([records[i].image_id for i in batch.indices.tolist()])).float()
        assert moved.inputs.dtype == torch.float32
        assert torch.equal(moved.inputs, before.inputs) and torch.equal(moved.inputs, cpu_widened)
        assert torch.equal(moved.captions, before.captions) and torch.equal(moved.lengths, before.lengths)


def test_caption_batch_pin_memory_preserves_values():
    batch = collate_captions([(torch.randn(3, 2).half(), torch.tensor([1, 5, 2]), 4)], widen=False)
    assert callable(getattr(batch, "pin_memory", None))  # DataLoader(pin_memory=True) calls it on custom types
    try:
        pinned = batch.pin_memory()
    except RuntimeError as err:  # pinning needs an accelerator's driver
        pytest.skip(f"torch cannot pin memory here: {err}")
    assert isinstance(pinned, type(batch)) and pinned.inputs.is_pinned() and pinned.captions.is_pinned()
    for name in ("inputs", "captions", "lengths", "indices"):
        assert torch.equal(getattr(pinned, name), getattr(batch, name)), name
    assert pinned.inputs.dtype == torch.float16


@pytest.mark.gpu
def test_the_training_loader_pins_its_batches_and_to_widens_on_the_gpu(tmp_path):
    """On CUDA the loader pins its batches, as training asks on a GPU; the dry run (CAPTIONER_GPU_TEST_DEVICE=cpu)
    runs the same loader unpinned, as training does on the CPU, and checks the rest."""
    from captioner.training.inputs import epoch_loader

    device = os.environ.get("CAPTIONER_GPU_TEST_DEVICE", "cuda")
    records = _records(6)
    ds = GridCaptionDataset(records, build_vocab(records), max_length=20, cache=_random_cache(tmp_path, records),
                            preload_bytes=0)
    for batch in epoch_loader(ds, 4, epoch=0, seed=0, rank=0, world=1, shuffle=True, num_workers=2,
                              pin_memory=device == "cuda"):
        assert batch.inputs.is_pinned() == (device == "cuda") and batch.inputs.dtype == torch.float16
        moved = batch.to(device)
        assert moved.inputs.dtype == torch.float32 and moved.inputs.device.type == device
        assert torch.equal(moved.inputs.cpu(), batch.inputs.float())


def test_grid_dataset_on_a_file_pickles_and_keeps_its_order_with_workers(tmp_path):
    """Grids read from the file (not preloaded): the dataset pickles without the open file, and the training
    loader gives the same batches in the same order with 0 and 2 workers, epoch after epoch."""
    import pickle

    from captioner.training.inputs import epoch_loader

    records = _records(11, captions=3)
    vocab = build_vocab(records)
    cache = _random_cache(tmp_path, records)
    ds = GridCaptionDataset(records, vocab, max_length=20, cache=cache, preload_bytes=0)
    assert not ds.preloaded
    assert GridCaptionDataset(records, vocab, max_length=20, cache=cache).preloaded  # 11 small rows fit in RAM
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.cache._fd is None and torch.equal(clone.__getitems__([3, 0]).inputs, ds.__getitems__([3, 0]).inputs)

    def batches(workers: int, epoch: int) -> list:
        return list(epoch_loader(ds, 4, epoch=epoch, seed=7, rank=0, world=1, shuffle=True, num_workers=workers,
                                 pin_memory=False))

    for epoch in (0, 1):
        alone, with_workers = batches(0, epoch), batches(2, epoch)
        assert len(alone) == len(with_workers) == 9
        for a, b in zip(alone, with_workers):
            for name in ("inputs", "captions", "lengths", "indices"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(batches(0, 0)[0].indices, batches(0, 1)[0].indices)  # epochs differ
