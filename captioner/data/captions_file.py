"""Your own data: a folder of images and a CSV or JSON-lines file of captions (``data.format: captions``).

One row per caption; several rows naming one image are several references for it::

    image,caption,split                       {"image": "beach/01.jpg", "caption": "Two dogs run on the sand."}
    beach/01.jpg,Two dogs run on the sand.,train
    beach/01.jpg,A pair of dogs at the sea.,train

``image`` is a path relative to the image folder (``data.root``); Hugging Face's ``imagefolder`` names work
too (``file_name``, ``text``). ``split`` (train | val | test; ``validation`` and ``dev`` read as val) is
optional: without that column the images are split at random, seeded, with ``data.val_share`` and
``data.test_share`` of them held out (every caption of an image goes where the image goes).

A bad row (no such image, an image that cannot be read, an empty caption, a malformed line) is reported
with its file and line and skipped, until more than ``data.max_failure_share`` of the rows are bad: then
reading fails with the count. Images are checked from their headers (``images.probe_image``); a file is
read, checked and reported once per process (the train, val and test splits share it) until it changes.
"""

from __future__ import annotations

import csv
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np

from captioner.data.images import ImageLoadError, probe_image
from captioner.data.records import DataError, EmptySplitError, ImageRecord
from captioner.data.vocab import tokenize

log = logging.getLogger(__name__)

IMAGE_COLUMNS = ("image", "file_name")  # file_name: Hugging Face imagefolder's metadata files
CAPTION_COLUMNS = ("caption", "text")
SPLIT_COLUMN = "split"
SPLIT_NAMES = {"train": "train", "val": "val", "test": "test", "validation": "val", "dev": "val"}
SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
DEFAULT_NAMES = ("captions.csv", "captions.jsonl", "metadata.csv", "metadata.jsonl")
REPORTED_ROWS = 20  # bad rows logged one by one; the rest are counted


@dataclass(frozen=True)
class CaptionRow:
    """One good row: where it is, the image (relative POSIX path), the caption and its split (or None)."""

    line: int
    image: str
    caption: str
    split: str | None


@dataclass(frozen=True)
class CaptionTable:
    """A captions file read and checked: its good rows, its bad ones (line, reason), and whether it has splits."""

    path: Path
    rows: tuple[CaptionRow, ...]
    bad: tuple[tuple[int, str], ...]
    has_split: bool

    @property
    def n_rows(self) -> int:
        return len(self.rows) + len(self.bad)


def find_captions_file(root: Path) -> Path:
    """The captions file in ``root`` when ``data.captions`` is not set: the one of DEFAULT_NAMES present."""
    found = [root / name for name in DEFAULT_NAMES if (root / name).is_file()]
    if len(found) != 1:
        raise DataError(f"set data.captions to your CSV or JSON-lines captions file (looked in {root} for one of "
                        f"{', '.join(DEFAULT_NAMES)}; found {', '.join(map(str, found)) or 'none'})")
    return found[0]


def _pick(columns: list[str], names: tuple[str, ...], path: Path, what: str) -> str:
    hits = [c for c in names if c in columns]
    if len(hits) != 1:
        raise DataError(f"{path}: needs exactly one {what} column named {' or '.join(names)} "
                        f"(columns found: {', '.join(columns) or 'none'})")
    return hits[0]


def _csv_fields(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line, {column: value}) per CSV row, or (line, reason) for a row that cannot be read."""
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: spreadsheets write a byte-order mark
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file (expected a header line such as image,caption,split)")
        header = [h.strip() for h in header]
        while True:
            line = reader.line_num + 1  # where the next row starts (a quoted caption may span lines)
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                yield line, f"malformed CSV ({err})"
                continue
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                yield line, f"{len(values)} fields, the header has {len(header)}"
                continue
            yield line, dict(zip(header, values))


def _jsonl_fields(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line, object) per JSON line, or (line, reason) for a line that is not a JSON object."""
    with open(path, encoding="utf-8-sig") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as err:
                yield line, f"not valid JSON ({err.msg})"
                continue
            yield line, item if isinstance(item, dict) else f"expected a JSON object, got {type(item).__name__}"


def _columns(path: Path, kind: str, fields: list[tuple[int, dict | str]]) -> list[str]:
    if kind == "csv":
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [h.strip() for h in next(csv.reader(f), [])]
    return list(OrderedDict.fromkeys(k for _, item in fields if isinstance(item, dict) for k in item))


def _row(line: int, item: dict, image_col: str, caption_col: str, has_split: bool) -> CaptionRow | str:
    """A checked row, or the reason it is bad (the image file itself is checked later, once per image)."""
    image, caption = item.get(image_col), item.get(caption_col)
    if not isinstance(image, str) or not image.strip():
        return f"no image path ({image_col!r} is {image!r})"
    relative = PurePosixPath(image.strip())
    if relative.is_absolute() or ".." in relative.parts:
        return f"image path {image!r} must be relative to the image folder, inside it"
    if not isinstance(caption, str) or not tokenize(caption):
        return f"empty caption for {image!r}"
    split = None
    if has_split:
        value = item.get(SPLIT_COLUMN)
        split = SPLIT_NAMES.get(value.strip().lower()) if isinstance(value, str) else None
        if split is None:
            return f"split {value!r} is not one of {', '.join(SPLIT_NAMES)}"
    return CaptionRow(line, str(relative), caption.strip(), split)


def _check_images(rows: list[CaptionRow], root: Path | None, bad: list[tuple[int, str]]) -> list[CaptionRow]:
    """The rows whose image is readable (each distinct one probed once; all of them when ``root`` is None)
    and whose split agrees with the image's first row; the others go to ``bad``."""
    problems: dict[str, str | None] = {}
    first_split: dict[str, tuple[str | None, int]] = {}
    kept = []
    for row in rows:
        if row.image not in problems:
            try:
                problems[row.image] = None
                if root is not None:
                    probe_image(root / row.image)
            except ImageLoadError as err:
                problems[row.image] = err.reason
        if problems[row.image] is not None:
            bad.append((row.line, f"image {row.image}: {problems[row.image]}"))
            continue
        split, line = first_split.setdefault(row.image, (row.split, row.line))
        if split != row.split:
            bad.append((row.line, f"image {row.image} is in split {row.split!r} here but {split!r} on line {line}"))
            continue
        kept.append(row)
    return kept


@lru_cache(maxsize=8)
def _read_table(path: Path, root: Path | None, stamp: tuple[int, int]) -> CaptionTable:
    """Read and check a captions file, its images too unless ``root`` is None (cached on the file's
    modification time and size: the train, val and test splits read it once)."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{path}: unknown captions file type {path.suffix!r} (valid: {', '.join(SUFFIXES)})")
    try:
        fields = list(_csv_fields(path) if kind == "csv" else _jsonl_fields(path))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err}); save it as UTF-8") from None
    columns = _columns(path, kind, fields)
    image_col = _pick(columns, IMAGE_COLUMNS, path, "image")
    caption_col = _pick(columns, CAPTION_COLUMNS, path, "caption")
    has_split = SPLIT_COLUMN in columns
    rows: list[CaptionRow] = []
    bad: list[tuple[int, str]] = []
    for line, item in fields:
        row = item if isinstance(item, str) else _row(line, item, image_col, caption_col, has_split)
        if isinstance(row, str):
            bad.append((line, row))
        else:
            rows.append(row)
    rows = _check_images(rows, root, bad)
    bad.sort()
    for line, why in bad[:REPORTED_ROWS]:
        log.warning("%s:%d: skipped: %s", path, line, why)
    if len(bad) > REPORTED_ROWS:
        log.warning("%s: %d more bad rows skipped", path, len(bad) - REPORTED_ROWS)
    return CaptionTable(path, tuple(rows), tuple(bad), has_split)


def read_captions_table(path: str | Path, root: str | Path, max_failure_share: float) -> CaptionTable:
    """The checked rows of a captions file whose images live under ``root``; bad rows are logged with file and
    line, and more than ``max_failure_share`` of them is a DataError with the count."""
    path, root = Path(path), Path(root)
    if not path.is_file():
        raise DataError(f"captions file not found: {path}")
    if not root.is_dir():
        raise DataError(f"image folder not found: {root} (data.root; the images listed in {path} live there)")
    stat = path.stat()
    table = _read_table(path.resolve(), root.resolve(), (stat.st_mtime_ns, stat.st_size))  # logs its bad rows
    if len(table.bad) > max_failure_share * table.n_rows:
        examples = "; ".join(f"line {line}: {why}" for line, why in table.bad[:3])
        raise DataError(f"{table.path}: {len(table.bad)} of {table.n_rows} rows are bad (more than "
                        f"data.max_failure_share={max_failure_share}), e.g. {examples}")
    if not table.rows:
        raise DataError(f"{table.path}: no rows")
    return table


def read_caption_references(path: str | Path) -> CaptionTable:
    """The rows of a captions file as references for scoring: the images themselves are not needed, so not
    checked; bad rows are logged and skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"captions file not found: {path}")
    stat = path.stat()
    return _read_table(path.resolve(), None, (stat.st_mtime_ns, stat.st_size))


def random_splits(images: list[str], val_share: float, test_share: float, seed: int) -> dict[str, str]:
    """image -> split: a seeded permutation of the sorted images; the first round(test_share * n) go to
    test, the next round(val_share * n) to val (at least one each when its share is above 0), the rest to
    train. The same images, shares and seed give the same split on every machine."""
    names = sorted(images)
    n = len(names)
    n_test = max(round(test_share * n), int(test_share > 0))
    n_val = max(round(val_share * n), int(val_share > 0))
    if n - n_test - n_val < 1:
        raise DataError(f"{n} images leave none for training with data.val_share={val_share} and "
                        f"data.test_share={test_share}")
    order = np.random.default_rng(seed).permutation(n)
    split_of = {}
    for rank, index in enumerate(order):
        split_of[names[index]] = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
    return split_of


def records_of(table: CaptionTable, root: Path, split: str, split_of: dict[str, str] | None = None
               ) -> list[ImageRecord]:
    """The images of ``split`` (by the file's split column, else ``split_of``) with their captions, in the
    order of their first row; an image's id is its path relative to the folder."""
    captions: dict[str, list[str]] = {}
    for row in table.rows:
        if (row.split if split_of is None else split_of[row.image]) == split:
            captions.setdefault(row.image, []).append(row.caption)
    if not captions:
        raise EmptySplitError(f"{table.path}: split {split!r} has no images")
    return [ImageRecord(image_id=image, path=Path(root) / image, captions=[tokenize(c) for c in raw], raw=raw)
            for image, raw in captions.items()]


def read_captions(path: str | Path, root: str | Path, split: str, val_share: float = 0.1, test_share: float = 0.1,
                  split_seed: int = 0, max_failure_share: float = 0.05, shares_set: bool = False
                  ) -> list[ImageRecord]:
    """One split of a folder of images plus a captions file (the module docstring has the format).

    ``shares_set``: whether the config sets the random split's shares or seed, which a file with a split
    column would ignore (so that is refused).
    """
    table = read_captions_table(path, root, max_failure_share)
    if table.has_split:
        if shares_set:
            raise DataError(f"{table.path} has a {SPLIT_COLUMN!r} column, which decides the splits: remove "
                            f"data.val_share, data.test_share and data.split_seed from the config")
        return records_of(table, Path(root), split)
    split_of = random_splits(list({r.image: None for r in table.rows}), val_share, test_share, split_seed)
    return records_of(table, Path(root), split, split_of)
