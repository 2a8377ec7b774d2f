"""`data.format: captions`: a folder of images and a CSV or JSON-lines captions file (captioner/data/captions_file.py):
references per image, the split column or a seeded split, bad rows reported by file and line, and training on it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from PIL import Image

from captioner.config import ConfigError, load_config
from captioner.data.captions_file import random_splits
from captioner.data.datasets import DataError, load_records
from captioner.training.loop import train

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 180, 30), "yellow": (230, 220, 40)}


def _photo(path: Path, colour: str, size: int = 64) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (size, size), (245, 245, 245))
    image.paste(COLOURS[colour], (size // 4, size // 4, 3 * size // 4, 3 * size // 4))
    image.save(path)


def _folder(root: Path, n: int = 12) -> list[tuple[str, str]]:
    """n photos in two sub-folders; (relative path, colour) of each."""
    photos = []
    for i in range(n):
        colour = list(COLOURS)[i % len(COLOURS)]
        relative = f"{'indoor' if i % 2 else 'outdoor'}/{i:02d}.png"
        _photo(root / relative, colour)
        photos.append((relative, colour))
    return photos


def _config(root: Path, captions: Path, *extra: str):
    return load_config(SMOKE, ["data.format=captions", f"data.root={root}", f"data.captions={captions}", *extra])


def test_csv_rows_are_references_and_the_split_column_decides(tmp_path):
    root = tmp_path / "photos"
    photos = _folder(root, 4)
    lines = ["image,caption,split"]
    for i, (relative, colour) in enumerate(photos):
        split = ["train", "train", "validation", "test"][i]
        lines += [f"{relative},A {colour} square.,{split}", f'{relative}," a square, {colour} ",{split}']
    (tmp_path / "captions.csv").write_text("\n".join(lines) + "\n")
    cfg = _config(root, tmp_path / "captions.csv")
    train_records = load_records(cfg.data, "train")
    assert [r.image_id for r in train_records] == [photos[0][0], photos[1][0]]
    assert train_records[0].path == root / photos[0][0]
    assert train_records[0].raw == ["A red square.", "a square, red"]  # two rows: two references
    assert train_records[0].captions[1] == ["a", "square", ",", "red"]
    assert [r.image_id for r in load_records(cfg.data, "val")] == [photos[2][0]]  # "validation" reads as val
    assert [r.image_id for r in load_records(cfg.data, "test")] == [photos[3][0]]


def test_without_a_split_column_the_images_are_split_by_seeded_shares(tmp_path):
    root = tmp_path / "photos"
    photos = _folder(root, 10)
    rows = [{"file_name": p, "text": f"a {c} square"} for p, c in photos for _ in range(2)]  # imagefolder's names
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(SMOKE, ["data.format=captions", f"data.root={tmp_path / 'photos'}",
                              f"data.captions={tmp_path / 'metadata.jsonl'}", "data.val_share=0.2",
                              "data.test_share=0.3"])
    splits = {s: [r.image_id for r in load_records(cfg.data, s)] for s in ("train", "val", "test")}
    assert [len(splits[s]) for s in ("train", "val", "test")] == [5, 2, 3]
    assert sorted(sum(splits.values(), [])) == sorted(p for p, _ in photos)  # each image in exactly one split
    assert all(len(r.raw) == 2 for r in load_records(cfg.data, "train"))  # its captions travel with it
    images = [p for p, _ in photos]
    assert random_splits(images, 0.2, 0.3, seed=0) == random_splits(list(reversed(images)), 0.2, 0.3, seed=0)
    assert random_splits(images, 0.2, 0.3, seed=0) != random_splits(images, 0.2, 0.3, seed=1)
    # a file with a split column decides the splits: shares set beside it would be ignored, so are refused
    (tmp_path / "split.csv").write_text("image,caption,split\n" + "".join(f"{p},a square,train\n" for p in images))
    cfg.data.captions = str(tmp_path / "split.csv")
    with pytest.raises(DataError, match="split.csv has a 'split' column.*remove data.val_share"):
        load_records(cfg.data, "train")


def test_bad_rows_are_reported_with_file_and_line_and_skipped(tmp_path, caplog):
    root = tmp_path / "photos"
    photos = _folder(root, 6)
    (root / "broken.png").write_bytes(b"not an image at all")
    lines = ["image,caption,split"] + [f"{p},a {c} square,train" for p, c in photos]
    lines.insert(3, "missing.png,a red square,train")  # line 4
    lines.insert(5, f"{photos[0][0]},  ,train")  # line 6: an empty caption
    lines.append("broken.png,a square,train")  # line 10
    lines.append(f"{photos[1][0]},a square,val")  # line 11: its image is in train on line 3
    captions = tmp_path / "captions.csv"
    captions.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        records = load_records(_config(root, captions, "data.max_failure_share=0.4").data, "train")
    reported = [m for m in caplog.messages if "skipped" in m]
    assert reported == [f"{captions}:4: skipped: image missing.png: file not found",
                        f"{captions}:6: skipped: empty caption for {photos[0][0]!r}",
                        f"{captions}:10: skipped: image broken.png: not a recognised image format",
                        f"{captions}:11: skipped: image {photos[1][0]} is in split 'val' here but 'train' on line 3"]
    assert [r.image_id for r in records] == [p for p, _ in photos]
    assert [len(r.raw) for r in records] == [1] * 6
    with pytest.raises(DataError, match=r"captions.csv: 4 of 10 rows are bad \(more than data.max_failure_share=0.3"):
        load_records(_config(root, captions, "data.max_failure_share=0.3").data, "train")


def test_files_it_cannot_read_are_errors_that_name_them(tmp_path):
    root = tmp_path / "photos"
    _folder(root, 2)
    (tmp_path / "c.csv").write_text("path,caption\n00.png,a square\n")
    with pytest.raises(DataError, match=r"c.csv: needs exactly one image column named image or file_name "
                                        r"\(columns found: path, caption\)"):
        load_records(_config(root, tmp_path / "c.csv").data, "train")
    (tmp_path / "c.csv").write_bytes("image,caption\n00.png,un carré rouge\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"c.csv: not UTF-8 text"):
        load_records(_config(root, tmp_path / "c.csv").data, "train")
    (tmp_path / "c.txt").write_text("image,caption\n")
    with pytest.raises(DataError, match=r"unknown captions file type '.txt' \(valid: .csv, .jsonl, .ndjson\)"):
        load_records(_config(root, tmp_path / "c.txt").data, "train")
    with pytest.raises(DataError, match="set data.captions to your CSV or JSON-lines captions file"):
        load_records(load_config(SMOKE, ["data.format=captions", f"data.root={root}"]).data, "train")


def test_keys_one_format_would_ignore_are_refused():
    with pytest.raises(ConfigError, match="data.val_share: set to 0.3, but this run would ignore it"):
        load_config(SMOKE, ["data.val_share=0.3"])  # the shapes format has its own splits
    with pytest.raises(ConfigError, match="data.restval: set to False, but this run would ignore it"):
        load_config(SMOKE, ["data.format=captions", "data.restval=false"])
    with pytest.raises(ConfigError, match=r"data.val_share \+ data.test_share must be < 1"):
        load_config(SMOKE, ["data.format=captions", "data.val_share=0.5", "data.test_share=0.5"])


def test_training_runs_on_a_folder_of_photos_and_a_csv(tmp_path):
    root = tmp_path / "photos"
    photos = _folder(root, 12)
    captions = tmp_path / "captions.csv"
    captions.write_text("image,caption\n" + "".join(f"{p},a {c} square\n{p},a {c} box on white\n"
                                                    for p, c in photos))
    cfg = _config(root, captions, f"train.run_dir={tmp_path / 'run'}", "train.num_threads=1", "train.epochs=4",
                  "train.tensorboard=off", "data.val_share=0.25", "data.test_share=0.25", "train.batch_size=4")
    run = train(cfg)
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert history[-1]["train_xe"] < history[0]["train_xe"]  # 6 photos x 2 captions, 3 steps an epoch
    assert (run / "best.pt").is_file()
    vocab = json.loads((run / "vocab.json").read_text())["words"]
    assert {"square", "box", "white"} <= set(vocab)
