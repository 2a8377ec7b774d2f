"""The grounding figures the literature reports on Flickr30k Entities: a box per word, and its IoU with the named
object's boxes (GVD: Zhou et al., CVPR 2019, "Grounded Video Description", section 5 and its Flickr30k Entities
evaluation, which POS-SCAN, Zhou et al., CVPR 2020, and later work reuse). docs/grounding.md defines them; here
they are computed on the attention grid of a captioner.

A word's box (``map_box``): its map (H, W) upsampled bilinearly to the photo (UPSAMPLE pixels per cell, in the
photo's normalised [0, 1] coordinates, so the photo's own size does not matter), thresholded at THRESHOLD of its
maximum, and the bounding box of the largest 4-connected region above it. A word *localises* its object when that
box has an IoU above IOU_HIT with one of the boxes of the phrase it names. The thresholds are this project's
choice (GVD's paper names neither); both are module constants, printed beside the figures.

Two settings, as the pointing figures (evaluation/grounding.py), with an object's *class* the lemma of the head
noun of its phrase:

- teacher-forced, on the annotated references: ``accuracy``, the share of boxed head nouns that localise, per class
  then averaged over the classes (GVD's grounding accuracy), and ``accuracy_words`` over words;
- generated, on the model's own captions, per photo and class: the class is *named* when a word of the caption has
  its lemma and *annotated* when a boxed phrase of the photo's references has that head noun; a named and annotated
  class is *localised* when the first word naming it localises. Per class c over the photos, with L_c localised,
  N_c named and A_c annotated: F1_all from precision L_c / N_c and recall L_c / A_c (a class named but not in the
  photo, a hallucination, counts against precision, one annotated but never named against recall, as does a named
  one put in the wrong place); F1_loc from localisation alone on the classes both named and annotated, L_c /
  (named and annotated)_c (its precision and recall are that one share). Both are averaged over the classes that
  occur (N_c + A_c > 0 for F1_all, named and annotated for F1_loc).

Beside each figure, on the same words, two boxes that need no model: the whole photo (what a uniform map gives)
and the grid's centre cell.

The object classes are the frequent ones, as GVD's are (its Flickr30k Entities evaluation keeps a fixed list of
frequent object classes): here the head nouns boxed in at least CLASS_PHOTOS of the evaluated photos. A word of
another class is no object (neither scored nor a hallucination); without the cut, the hundreds of nouns boxed once
or twice, which no captioner of a small vocabulary names, would each add a zero to F1_all's mean.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

Box = tuple[float, float, float, float]  # normalised [x0, y0, x1, y1]

UPSAMPLE = 16  # pixels per grid cell of the upsampled map
THRESHOLD = 0.5  # the share of the map's maximum that its region must reach
IOU_HIT = 0.5  # a box localises an object when its IoU with one of the object's boxes is above this
CLASS_PHOTOS = 10  # a head noun is an object class when boxed in at least this many of the evaluated photos


def upsample(a: np.ndarray, grid_hw: tuple[int, int], per_cell: int = UPSAMPLE) -> np.ndarray:
    """(H * per_cell, W * per_cell): the map ``a`` (H*W,) bilinearly interpolated between the cell centres (the
    edges held at the outer cells' values), as an image resize with half-pixel centres does."""
    H, W = grid_hw
    grid = np.asarray(a, dtype=np.float64).reshape(H, W)

    def axis(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # the centre of output pixel i in cell units, minus the half cell to the first cell's centre
        x = np.clip((np.arange(n * per_cell) + 0.5) / per_cell - 0.5, 0, n - 1)
        lo = np.floor(x).astype(int)
        hi = np.minimum(lo + 1, n - 1)
        return lo, hi, x - lo

    r0, r1, fr = axis(H)
    c0, c1, fc = axis(W)
    top = grid[r0][:, c0] * (1 - fc) + grid[r0][:, c1] * fc  # (H', W')
    bottom = grid[r1][:, c0] * (1 - fc) + grid[r1][:, c1] * fc
    return top * (1 - fr)[:, None] + bottom * fr[:, None]


def map_box(a: np.ndarray, grid_hw: tuple[int, int], threshold: float = THRESHOLD,
            per_cell: int = UPSAMPLE) -> Box:
    """The normalised bounding box of the largest 4-connected region of the upsampled map at or above ``threshold``
    of its maximum (the first such region in row-major order on a tie)."""
    from scipy import ndimage

    image = upsample(a, grid_hw, per_cell)  # (H', W')
    labels, count = ndimage.label(image >= threshold * image.max())
    if count == 0:  # a map of NaNs: no region, the whole photo
        return (0.0, 0.0, 1.0, 1.0)
    largest = 1 + int(np.argmax(np.bincount(labels.ravel())[1:]))  # regions are labelled 1..count
    rows, cols = np.nonzero(labels == largest)
    h, w = image.shape
    return (cols.min() / w, rows.min() / h, (cols.max() + 1) / w, (rows.max() + 1) / h)


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two normalised boxes [x0, y0, x1, y1]."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def localises(a: np.ndarray, boxes: Sequence[Sequence[float]], grid_hw: tuple[int, int]) -> bool:
    """Whether the map's box has an IoU above IOU_HIT with one of ``boxes``."""
    return _hits(map_box(a, grid_hw), boxes)


def frequent_classes(photos: Iterable[Any], min_photos: int = CLASS_PHOTOS) -> frozenset[str]:
    """The head-noun lemmas boxed (``EntityImage.boxed_heads``) in at least ``min_photos`` of ``photos``."""
    counts: Counter[str] = Counter()
    for photo in photos:
        counts.update(photo.boxed_heads().keys())
    return frozenset(key for key, n in counts.items() if n >= min_photos)


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


METHODS = ("model", "whole_photo", "centre_cell")  # the model's boxes, then two boxes that need no model


def baseline_boxes(grid_hw: tuple[int, int]) -> dict[str, Box]:
    """The boxes of the two baselines: the whole photo (what a uniform map gives) and the grid's centre cell
    (photographers centre their subjects)."""
    H, W = grid_hw
    r, c = H // 2, W // 2
    return {"whole_photo": (0.0, 0.0, 1.0, 1.0), "centre_cell": (c / W, r / H, (c + 1) / W, (r + 1) / H)}


def _hits(box: Sequence[float], boxes: Sequence[Sequence[float]]) -> bool:
    return any(iou(box, b) > IOU_HIT for b in boxes)


@dataclass
class Localization:
    """The IoU figures of one evaluation, filled word by word (teacher-forced) and photo by photo (generated), for
    the model's maps and, on the same words, the two baselines' boxes (``baseline_boxes``).

    Args:
        grid_hw: (H, W) of the attention grid.
        classes: the object classes (``frequent_classes``).
    """

    grid_hw: tuple[int, int]
    classes: frozenset[str]
    # method -> class -> hits (teacher-forced) / localised photos (generated)
    teacher: dict[str, dict[str, list[bool]]] = field(
        default_factory=lambda: {m: defaultdict(list) for m in METHODS})
    localised: dict[str, dict[str, int]] = field(default_factory=lambda: {m: defaultdict(int) for m in METHODS})
    named: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    annotated: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    both: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def _boxes(self, a: np.ndarray) -> dict[str, Box]:
        return {"model": map_box(a, self.grid_hw), **baseline_boxes(self.grid_hw)}

    def add_teacher_forced(self, a: np.ndarray, boxes: Sequence[Box], cls: str) -> None:
        """One boxed head noun of a reference, read teacher-forced: its map (L,) and its phrase's boxes (a noun of
        no object class is not scored)."""
        if cls in self.classes:
            for method, box in self._boxes(a).items():
                self.teacher[method][cls].append(_hits(box, boxes))

    def add_generated(self, lemmas: Sequence[str], maps: np.ndarray, annotated: dict[str, Sequence[Box]]) -> None:
        """One generated caption: its words' lemmas and maps (n, L), and the photo's annotated classes -> their
        boxes (every chain whose phrase has that head noun)."""
        first: dict[str, int] = {}
        for i, word in enumerate(lemmas):
            if word in self.classes:
                first.setdefault(word, i)
        annotated = {cls: boxes for cls, boxes in annotated.items() if cls in self.classes}
        for cls in annotated:
            self.annotated[cls] += 1
        for cls, i in first.items():
            self.named[cls] += 1
            if cls in annotated:
                self.both[cls] += 1
                for method, box in self._boxes(maps[i]).items():
                    self.localised[method][cls] += _hits(box, annotated[cls])

    def _method_figures(self, method: str) -> dict[str, Any]:
        teacher = self.teacher[method]
        per_class = [float(np.mean(v)) for v in teacher.values() if v]
        words = [h for v in teacher.values() for h in v]
        localised = self.localised[method]
        occurring = sorted(set(self.named) | set(self.annotated))
        precision = [localised[c] / self.named[c] if self.named[c] else 0.0 for c in occurring]
        recall = [localised[c] / self.annotated[c] if self.annotated[c] else 0.0 for c in occurring]
        located = [localised[c] / self.both[c] for c in sorted(self.both) if self.both[c]]
        return {"accuracy": float(np.mean(per_class)) if per_class else None,
                "accuracy_words": float(np.mean(words)) if words else None,
                "f1_all": float(np.mean([_f1(p, r) for p, r in zip(precision, recall)])) if occurring else None,
                "precision_all": float(np.mean(precision)) if occurring else None,
                "recall_all": float(np.mean(recall)) if occurring else None,
                "f1_loc": float(np.mean(located)) if located else None}

    def figures(self) -> dict[str, Any]:
        """{"teacher_forced": {accuracy, accuracy_words, words, classes}, "generated": {f1_all, f1_loc,
        precision_all, recall_all, classes_all, classes_loc}, "baselines": {whole_photo, centre_cell: the same
        figures of their boxes on the same words}, the thresholds}; a figure None where nothing counts."""
        model = self._method_figures("model")
        teacher = {k: model[k] for k in ("accuracy", "accuracy_words")}
        teacher.update(words=sum(len(v) for v in self.teacher["model"].values()),
                       classes=sum(1 for v in self.teacher["model"].values() if v))
        generated = {k: model[k] for k in ("f1_all", "precision_all", "recall_all", "f1_loc")}
        generated.update(classes_all=len(set(self.named) | set(self.annotated)),
                         classes_loc=sum(1 for c in self.both if self.both[c]))
        return {"teacher_forced": teacher, "generated": generated,
                "baselines": {m: self._method_figures(m) for m in METHODS[1:]},
                "threshold": THRESHOLD, "iou": IOU_HIT, "upsample": UPSAMPLE, "object_classes": len(self.classes)}


class LocalizationFigures:
    """The IoU figures as a grounding metric (evaluation/grounding.BoxGrounding hands it each caption read): its
    object classes are the head nouns boxed in at least ``class_photos`` of the evaluated photos."""

    def __init__(self, grid_hw: tuple[int, int], classes: frozenset[str], class_photos: int) -> None:
        self.localization = Localization(grid_hw, classes)
        self.class_photos = class_photos

    @classmethod
    def build(cls, grid_hw: tuple[int, int], entities: Any, class_photos: int) -> "LocalizationFigures":
        return cls(grid_hw, frequent_classes(entities.images.values(), class_photos), class_photos)

    def add(self, caption: Any) -> None:
        """One caption (grounding.CaptionRead): a generated one by photo and class, a reference by scored word."""
        if caption.setting == "generated":
            self.localization.add_generated(caption.lemmas, caption.maps, caption.annotated)
        else:
            for word in caption.scored:
                self.localization.add_teacher_forced(caption.maps[word.index], word.boxes, word.key)

    def figures(self) -> dict[str, Any]:
        return {"localization": {**self.localization.figures(), "class_photos": self.class_photos}}

    @staticmethod
    def lines(figures: dict[str, Any]) -> list[str]:
        """Its lines of the evaluation table: a box per word, a hit at IoU above loc["iou"] (none when it was not
        computed)."""
        loc = figures.get("localization")
        if not loc:
            return []
        t, g = loc["teacher_forced"], loc["generated"]

        def pct(value: float | None) -> str:
            return "n/a" if value is None else f"{100 * value:.1f}%"

        b = loc["baselines"]
        return [f"IoU > {loc['iou']:g} (map at {loc['threshold']:g} of its max, largest region's box; "
                f"{loc['object_classes']} object classes, boxed in {loc['class_photos']}+ photos): "
                f"teacher-forced accuracy {pct(t['accuracy'])} over {t['classes']} classes "
                f"({pct(t['accuracy_words'])} of {t['words']} words); generated F1_all {pct(g['f1_all'])} "
                f"({g['classes_all']} classes), F1_loc {pct(g['f1_loc'])} ({g['classes_loc']} classes)",
                "  the same words' whole photo / centre cell: " + ", ".join(
                    f"{name} {pct(b['whole_photo'][key])} / {pct(b['centre_cell'][key])}"
                    for name, key in (("accuracy", "accuracy"), ("F1_all", "f1_all"), ("F1_loc", "f1_loc")))]
