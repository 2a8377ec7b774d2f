"""Where a word's object lies, on the attention grid: the grounding sources, one rasteriser and one "inside" formula.

A *region* is what a data set says an object covers in its photo, in one of two forms:

- boxes: a list of [x0, y0, x1, y1] in the photo's normalised [0, 1] coordinates (Flickr30k Entities,
  data/entities.py; the shapes data's pixel boxes, divided by the photo's size), their union;
- a mask: an ndarray (H_img, W_img) of per-pixel coverage in [0, 1] (COCO instance masks).

``cell_shares`` is the one rasteriser: a region -> (H*W,) the share of each grid cell's area inside it, exactly
(boxes: the plane is cut at every cell and box edge, overlapping boxes count once; a mask: each pixel's overlap
with each cell), row-major as alpha is. ``inside`` is the one formula of the attention weight on a region: the
map normalised to sum 1, times those shares, summed (Liu et al., AAAI 2017, "attention correctness", on a grid);
0 for an all-zero map.

A *grounding source* (``GroundingSource``) says, for one photo's caption, which region each word names:
``word_regions(record, words)`` gives per word a ``WordRegion`` or None (the word names no object of the data
set). The sources are registered by name in ``names.GROUNDING_SOURCES``:

- ``shapes``: the synthetic data's records carry their objects (name, pixel box); a word that names an object kind
  of the data set but none of this photo's is a wrong name, scored 0 (``WordRegion.nowhere``);
- ``coco``: COCO instance masks from ``instances_{train,val}2014.json`` (pycocotools); a word that names a COCO
  category (a one-word name, plural folded) the photo lacks scores 0;
- ``flickr30k_entities``: the boxed phrases of the photo's annotated references; a word counts when its lemma is
  the head noun of one of them (evaluation/grounding.py scores these with the pointing and IoU figures).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

Boxes = Sequence[Sequence[float]]


def _cell_overlap(n_cells: int, n_pixels: int) -> np.ndarray:
    """(n_cells, n_pixels): the share of each cell's extent covered by each pixel along one axis (cell c spans
    [c * n_pixels / n_cells, (c + 1) * n_pixels / n_cells) in pixels, so grids that do not divide the photo evenly
    are mapped exactly); each row sums to 1."""
    edges = np.arange(n_cells + 1) * (n_pixels / n_cells)
    lo, hi = edges[:-1, None], edges[1:, None]  # (n_cells, 1)
    px = np.arange(n_pixels)[None, :]  # (1, n_pixels)
    overlap = np.clip(np.minimum(hi, px + 1) - np.maximum(lo, px), 0.0, None)  # (n_cells, n_pixels)
    return overlap / (n_pixels / n_cells)


def _mask_shares(mask: np.ndarray, grid_hw: tuple[int, int]) -> np.ndarray:
    H, W = grid_hw
    oy = _cell_overlap(H, mask.shape[0])  # (H, H_img)
    ox = _cell_overlap(W, mask.shape[1])  # (W, W_img)
    return (oy @ mask @ ox.T).reshape(H * W)  # (H, W) -> (L,)


def _box_shares(boxes: Boxes, grid_hw: tuple[int, int]) -> np.ndarray:
    H, W = grid_hw
    if len(boxes) == 0:
        return np.zeros(H * W)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)  # (n, 4)
    xs = np.unique(np.clip(np.concatenate([np.arange(W + 1) / W, b[:, 0], b[:, 2]]), 0.0, 1.0))
    ys = np.unique(np.clip(np.concatenate([np.arange(H + 1) / H, b[:, 1], b[:, 3]]), 0.0, 1.0))
    mx, my = (xs[:-1] + xs[1:]) / 2, (ys[:-1] + ys[1:]) / 2  # midpoints of the elementary strips
    inside_x = (b[:, None, 0] <= mx) & (mx < b[:, None, 2])  # (n, nx)
    inside_y = (b[:, None, 1] <= my) & (my < b[:, None, 3])  # (n, ny)
    covered = (inside_y[:, :, None] & inside_x[:, None, :]).any(0)  # (ny, nx)
    area = np.diff(ys)[:, None] * np.diff(xs)[None, :] * covered  # (ny, nx)
    rows = np.minimum((my * H).astype(int), H - 1)  # the cell row of each strip
    cols = np.minimum((mx * W).astype(int), W - 1)
    out = np.zeros((H, W))
    np.add.at(out, (rows[:, None], cols[None, :]), area)
    return (out * H * W).reshape(H * W)  # area share of each cell (a cell's area is 1 / (H W))


def cell_shares(region: Any, grid_hw: tuple[int, int]) -> np.ndarray:
    """(H*W,) the share of each grid cell's area inside ``region``: a pixel mask (an ndarray (H_img, W_img),
    coverage in [0, 1]), or normalised boxes (any other sequence of [x0, y0, x1, y1]: their union; none: zeros)."""
    if isinstance(region, np.ndarray):
        if region.ndim != 2:
            raise ValueError(f"a mask must be (H_img, W_img), got shape {region.shape} (boxes: give a list)")
        return _mask_shares(region.astype(np.float64), grid_hw)
    return _box_shares(region, grid_hw)


def pixel_boxes(boxes: Iterable[Sequence[float]], image_size: tuple[int, int]) -> list[tuple[float, ...]]:
    """[x0, y0, x1, y1] pixel boxes (x1, y1 exclusive) of a photo of ``image_size`` (W, H) as normalised boxes."""
    W, H = image_size
    return [(x0 / W, y0 / H, x1 / W, y1 / H) for x0, y0, x1, y1 in boxes]


def inside(maps: Any, shares: np.ndarray) -> Any:
    """The share of each map's weight inside its region: maps (..., L) normalised to sum 1 (an all-zero map
    stays 0), times ``shares`` (..., L) (cell_shares), summed over L. A float for one map, an array for several."""
    a = np.asarray(maps, dtype=np.float64)
    a = a / np.clip(a.sum(-1, keepdims=True), 1e-12, None)
    out = (a * shares).sum(-1)
    return float(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------- the grounding sources


@dataclass
class WordRegion:
    """The region a word names: ``region`` (normalised boxes or a mask, as cell_shares reads), ``row`` (the
    phrase type it is reported under, or ""), ``key`` (what the word is matched by: its lemma, or the object's
    name); ``nowhere``: the word names an object kind its photo does not show (scored 0)."""

    region: Any
    row: str = ""
    key: str = ""
    nowhere: bool = False


class GroundingSource(Protocol):
    """Per photo and caption, the region each word names (None: a word that names no object of the data set)."""

    def word_regions(self, record: Any, words: Sequence[str]) -> list[WordRegion | None]: ...


def _image_size(record: Any) -> tuple[int, int]:
    from PIL import Image

    with Image.open(record.path) as im:  # lazy: reads the header only
        return im.size


class ShapesObjects:
    """The shapes data's objects ({"name", "box": [x0, y0, x1, y1] in pixels, x1 and y1 exclusive}) on each record:
    a word refers to every object whose name equals it, its region the union of their boxes. ``names``: every
    object kind of the data set (a word among them that names no object of this photo scores 0; None: the
    photo's own names only)."""

    def __init__(self, names: Iterable[str] | None = None) -> None:
        self.names = set(names or ())

    @classmethod
    def for_records(cls, records: Sequence[Any]) -> "ShapesObjects":
        return cls({obj["name"] for r in records for obj in getattr(r, "objects", ()) or ()})

    def regions_of(self, objects: Sequence[dict], words: Sequence[str], image_size: tuple[int, int]
                   ) -> list[WordRegion | None]:
        boxes_by_name: dict[str, list] = {}
        for obj in objects:
            boxes_by_name.setdefault(obj["name"], []).append(obj["box"])
        kinds = set(boxes_by_name) | self.names
        regions: dict[str, WordRegion] = {}
        out: list[WordRegion | None] = []
        for word in words:
            if word not in kinds:
                out.append(None)
            elif word not in boxes_by_name:
                out.append(WordRegion(None, key=word, nowhere=True))
            else:
                if word not in regions:
                    regions[word] = WordRegion(pixel_boxes(boxes_by_name[word], image_size), key=word)
                out.append(regions[word])
        return out

    def word_regions(self, record: Any, words: Sequence[str]) -> list[WordRegion | None]:
        if not getattr(record, "objects", None):
            return [None] * len(words)
        return self.regions_of(record.objects, words, _image_size(record))


def coco_image_id(record: Any) -> int | None:
    """COCO's numeric image id from a file name like COCO_val2014_000000391895.jpg (None otherwise)."""
    tail = Path(record.path).stem.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


class CocoInstances:
    """COCO instance masks: a word that names a COCO category ("dog", "dogs"; "teddy" for "teddy bear" is not
    matched: one-word names only) refers to the union of that category's instance masks in the photo.

    Args:
        instances_file: ``instances_{train,val}2014.json`` (read with pycocotools).
    """

    def __init__(self, instances_file: str | Any) -> None:
        from pycocotools.coco import COCO

        path = Path(instances_file)
        if not path.is_file():
            raise FileNotFoundError(f"COCO instances file not found: {path} (instances_val2014.json from "
                                    "annotations_trainval2014.zip, cocodataset.org)")
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
            self.coco = COCO(str(path))
        self.category_of_word = {c["name"]: c["id"] for c in self.coco.loadCats(self.coco.getCatIds())
                                 if " " not in c["name"]}

    def category(self, word: str) -> int | None:
        word = word.lower()
        if word in self.category_of_word:
            return self.category_of_word[word]
        if word.endswith("s") and word[:-1] in self.category_of_word:
            return self.category_of_word[word[:-1]]
        return None

    def image_regions(self, coco_image_id: int, words: Sequence[str]) -> list[WordRegion | None]:
        """Per word, its category's masks in the photo (None: no category; nowhere: the photo has none). All
        None when the photo is not in the file."""
        if coco_image_id not in self.coco.imgs:
            return [None] * len(words)
        out: list[WordRegion | None] = []
        for word in words:
            cat = self.category(word)
            if cat is None:
                out.append(None)
                continue
            anns = self.coco.loadAnns(self.coco.getAnnIds(imgIds=[coco_image_id], catIds=[cat], iscrowd=None))
            if not anns:
                out.append(WordRegion(None, key=word, nowhere=True))
                continue
            mask = np.zeros_like(self.coco.annToMask(anns[0]), dtype=bool)
            for ann in anns:
                mask |= self.coco.annToMask(ann).astype(bool)
            out.append(WordRegion(mask, key=word))
        return out

    def word_regions(self, record: Any, words: Sequence[str]) -> list[WordRegion | None]:
        image_id = coco_image_id(record)
        return [None] * len(words) if image_id is None else self.image_regions(image_id, words)


class Flickr30kEntities:
    """Flickr30k Entities boxes (data/entities.py): a word names the boxes of every chain whose phrase, in any of
    the photo's annotated references, has the word's lemma as its head noun; ``row`` is the phrase's type row."""

    def __init__(self, entities: Any) -> None:
        self.entities = entities
        self._heads: dict[str, dict] = {}

    def heads(self, image_id: str) -> dict[str, tuple[list, str]]:
        """The photo's boxed head nouns (EntityImage.boxed_heads: lemma -> (boxes, row)), read once per photo; {}
        for a photo without an annotation."""
        photo = self.entities.get(image_id)
        if photo is None:
            return {}
        if photo.image_id not in self._heads:
            self._heads[photo.image_id] = photo.boxed_heads()
        return self._heads[photo.image_id]

    def word_regions(self, record: Any, words: Sequence[str]) -> list[WordRegion | None]:
        return head_regions(self.heads(record if isinstance(record, str) else record.image_id), words)


def head_regions(heads: dict[str, tuple[list, str]], words: Sequence[str]) -> list[WordRegion | None]:
    """Per word, the region of the boxed head noun its lemma names (``heads``: EntityImage.boxed_heads), or None:
    the one matching of words to Flickr30k Entities boxes, for the figures and the overlays alike."""
    from captioner.data.entities import lemma

    out: list[WordRegion | None] = []
    for word in words:
        key = lemma(word)
        hit = heads.get(key)
        out.append(None if hit is None else WordRegion(hit[0], row=hit[1], key=key))
    return out


def open_entities(folder: str | Path, image_ids: Sequence[str], what: str) -> Any:
    """The Flickr30k Entities annotations of ``image_ids`` (data.entities.read_entities), refused (DataError naming
    ``what`` and the folder) when none of the photos has one: the one reading of them for evaluation, validation,
    captioning and supervised attention."""
    from captioner.data.entities import read_entities
    from captioner.data.records import DataError

    entities = read_entities(folder, image_ids)
    if not entities.images and image_ids:
        raise DataError(f"{folder}: no Flickr30k Entities annotation for any of the {len(image_ids)} photos of "
                        f"{what} (is it the Flickr30k Entities folder of this data set?)")
    return entities


def word_shares(regions: Sequence[WordRegion | None], alphas: Any, grid_hw: tuple[int, int]) -> list[float]:
    """Per word with a region (``regions``, a source's word_regions), the share of its attention (a row of
    ``alphas`` (n_words, H*W); in hard attention's one-cell decoding the one-hot of the cell read) inside it, in
    caption order: 0 for a word whose photo lacks what it names; a region that covers no cell (every box outside
    the photo) is no known region, left out."""
    H, W = grid_hw
    a = np.asarray(alphas, dtype=np.float64)
    if a.ndim != 2 or a.shape != (len(regions), H * W):
        raise ValueError(f"alphas must be (n_words={len(regions)}, H*W={H * W}) for grid_hw {grid_hw}, "
                         f"got shape {a.shape}")
    shares, cells = [], {}  # one raster per named region, reused by repeated words
    for i, word in enumerate(regions):
        if word is None:
            continue
        if word.nowhere:
            shares.append(0.0)
            continue
        if id(word) not in cells:
            cells[id(word)] = cell_shares(word.region, grid_hw)
        if cells[id(word)].sum() == 0:
            continue
        shares.append(inside(a[i], cells[id(word)]))
    return shares


def grounding_shares(words: Sequence[str], alphas: Any, grid_hw: tuple[int, int], objects: Sequence[dict],
                     image_size: tuple[int, int], names: Iterable[str] | None = None) -> list[float]:
    """word_shares of one shapes caption: ``objects`` {"name", "box" in pixels (x1, y1 exclusive)} of a photo of
    ``image_size`` (W, H); ``names``: the data set's object kinds (ShapesObjects)."""
    return word_shares(ShapesObjects(names).regions_of(objects, words, image_size), np.asarray(alphas), grid_hw)
