"""COCO-format caption results, ``[{"image_id": ..., "caption": ...}]``: what the COCO evaluation server,
pycocoevalcap's ``COCOEvalCap`` and other papers' scripts read. ``captioner evaluate --results-file`` writes
one; ``captioner score`` scores one, from this project or any other system, against references in a
Karpathy split JSON, COCO caption annotations or a captions file (captioner/data/captions_file.py), with the
metrics ``captioner evaluate`` reports (captioner/evaluation/metrics.py: PTB-tokenized, 0-100).

Image ids: COCO's numeric id for COCO images (file names ``COCO_val2014_000000391895.jpg`` and
``000000391895.jpg`` give 391895), so the file is what COCO's own tools take; otherwise the data set's image
id (Karpathy JSON, Flickr8k: the file name without its suffix; the captions format: the image's path in its
folder). Results and references are matched on these ids as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from captioner.atomic import write_text_atomic

COCO_FILE_NAME = r"(?:COCO_[A-Za-z]+\d*_)?(\d{12})"


class ResultsError(ValueError):
    """A results or references file is malformed, or the two do not match; the message names the file."""


def results_image_id(image_id: str, file_name: str | Path) -> int | str:
    """The id a results file gives an image: COCO's number for a COCO file name, else the data set's id."""
    import re

    match = re.fullmatch(COCO_FILE_NAME, Path(file_name).stem)
    return int(match.group(1)) if match else image_id


def write_results(path: str | Path, records: Sequence[Any], predictions: dict[str, str],
                  boxes: dict[str, dict] | None = None) -> int:
    """Write the predicted caption of each record (``predictions``: record image id -> caption) as a COCO
    results file; returns how many were written. ``boxes`` (record image id -> the photo's box figures, summed over
    its boxed words: ``evaluate --entities``) adds a "boxes" object to every entry (zeros for a photo without boxed
    words), which COCO's tools ignore and ``captioner score --compare`` resamples."""
    empty = {"words": 0, "pointing": 0, "centre": 0, "inside": 0.0}
    results = [{"image_id": results_image_id(r.image_id, r.path), "caption": predictions[r.image_id],
                **({"boxes": boxes.get(r.image_id, empty)} if boxes is not None else {})}
               for r in records if r.image_id in predictions]
    write_text_atomic(path, json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    return len(results)


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultsError(f"{path}: not a readable JSON {what} ({err})") from None


def read_results(path: str | Path) -> dict[str, str]:
    """image id (as text) -> caption, from a COCO results file; one caption per image."""
    path = Path(path)
    data = _load_json(path, "results file")
    if not isinstance(data, list):
        raise ResultsError(f"{path}: expected a JSON list of {{\"image_id\", \"caption\"}} objects, "
                           f"got {type(data).__name__}")
    captions: dict[str, str] = {}
    for index, item in enumerate(data):
        if not isinstance(item, dict) or "image_id" not in item or not isinstance(item.get("caption"), str):
            raise ResultsError(f"{path}: entry [{index}] is not an object with an image_id and a caption string: "
                               f"{str(item)[:80]}")
        key = str(item["image_id"])
        if key in captions:
            raise ResultsError(f"{path}: image_id {item['image_id']!r} has a second caption at entry [{index}] "
                               f"(COCO results hold one per image)")
        captions[key] = item["caption"]
    if not captions:
        raise ResultsError(f"{path}: no results")
    return captions


BOX_KEYS = ("words", "pointing", "centre", "inside")


def _count(value: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


INSIDE_ROUNDING = 1e-6  # how far a sum of attention masses may pass its word count by rounding alone


def read_photo_boxes(path: str | Path) -> dict[str, dict] | None:
    """image id (as text) -> the photo's box figures ({"words", "pointing", "centre", "inside"} sums), from a results
    file written by ``captioner evaluate --entities --results-file``; None when its entries carry none."""
    path = Path(path)
    data = _load_json(path, "results file")
    if not isinstance(data, list) or not any(isinstance(item, dict) and "boxes" in item for item in data):
        return None
    out: dict[str, dict] = {}
    for index, item in enumerate(data):
        boxes = item.get("boxes") if isinstance(item, dict) else None
        if not isinstance(boxes, dict) or not all(_count(boxes.get(k)) for k in BOX_KEYS):
            raise ResultsError(f"{path}: entry [{index}] has no valid \"boxes\" object ({', '.join(BOX_KEYS)}: "
                               f"numbers >= 0), while other entries have one")
        # pointing and centre count words; inside sums each word's attention mass inside its boxes, at most 1 a
        # word up to float32 rounding (a lone word's mass can sum to 1.0000000000000002)
        if max(boxes["pointing"], boxes["centre"]) > boxes["words"] or \
                boxes["inside"] > boxes["words"] * (1 + INSIDE_ROUNDING):
            raise ResultsError(f"{path}: entry [{index}]'s boxes count more hits than words: {boxes}")
        out[str(item["image_id"])] = {k: boxes[k] for k in BOX_KEYS}
    return out


# --------------------------------------------------------------------------- references


def _karpathy_references(data: dict, path: Path, split: str | None) -> dict[str, list[str]]:
    references: dict[str, list[str]] = {}
    for index, image in enumerate(data["images"]):
        try:
            if split is not None and image["split"] != split:
                continue
            filename = image["filename"]
            raw = [s.get("raw") or " ".join(s["tokens"]) for s in image["sentences"]]
        except (KeyError, TypeError) as err:
            raise ResultsError(f"{path}: images[{index}] lacks field {err} (Karpathy split format)") from None
        references[str(results_image_id(Path(filename).stem, filename))] = raw
    return references


def _coco_references(data: dict, path: Path, split: str | None) -> dict[str, list[str]]:
    if split is not None:
        raise ResultsError(f"{path}: a COCO annotation file is one split already; leave out --split")
    references: dict[str, list[str]] = {str(image["id"]): [] for image in data.get("images", [])}
    for index, ann in enumerate(data["annotations"]):
        try:
            references.setdefault(str(ann["image_id"]), []).append(ann["caption"].strip())
        except (KeyError, TypeError, AttributeError) as err:
            raise ResultsError(f"{path}: annotations[{index}] lacks a caption or image_id ({err})") from None
    return references


def _captions_references(path: Path, split: str | None) -> dict[str, list[str]]:
    from captioner.data.captions_file import read_caption_references

    table = read_caption_references(path)
    if split is not None and not table.has_split:
        raise ResultsError(f"{path} has no split column (its images were split at random by a training config): "
                           f"leave out --split, and the images of the results file are scored")
    references: dict[str, list[str]] = {}
    for row in table.rows:
        if split is None or row.split == split:
            references.setdefault(str(results_image_id(row.image, row.image)), []).append(row.caption)
    return references


def read_references(path: str | Path, split: str | None = None) -> dict[str, list[str]]:
    """image id (as text) -> its reference captions (raw text), from a Karpathy split JSON, COCO caption
    annotations or a captions file (.csv, .jsonl), optionally of one split."""
    from captioner.data.captions_file import SUFFIXES

    path = Path(path)
    if path.suffix.lower() in SUFFIXES:
        return _captions_references(path, split)
    data = _load_json(path, "references file")
    if isinstance(data, dict) and isinstance(data.get("images"), list) and "annotations" not in data:
        references = _karpathy_references(data, path, split)
    elif isinstance(data, dict) and isinstance(data.get("annotations"), list):
        references = _coco_references(data, path, split)
    else:
        raise ResultsError(f"{path}: neither a Karpathy split JSON ({{\"images\": [...]}}) nor COCO caption "
                           f"annotations ({{\"annotations\": [...]}}) nor a captions file "
                           f"({', '.join(SUFFIXES)})")
    if not references:
        raise ResultsError(f"{path}: no images" + (f" in split {split!r}" if split else ""))
    return references


def match_references(results: dict[str, str], references: dict[str, list[str]], whole_split: bool,
                     source: Path) -> dict[str, list[str]]:
    """The references of the results' images. ``whole_split``: the results must cover every image of the
    references (a split was named), else only the results' images are scored. Mismatches name ids."""
    unknown = sorted(k for k in results if not references.get(k))
    if unknown:
        raise ResultsError(f"{len(unknown)} result image ids have no references in {source}, e.g. {unknown[:5]}")
    if whole_split:
        uncovered = sorted(set(references) - set(results))
        if uncovered:
            raise ResultsError(f"the results have no caption for {len(uncovered)} images of the split in {source}, "
                               f"e.g. {uncovered[:5]} (leave out --split to score only the images of the results)")
    return {k: references[k] for k in results}
