"""The grounding figures the literature reports on Flickr30k Entities: a box per word, and its IoU with the named
object's boxes (GVD: Zhou et al., CVPR 2019, "Grounded Video Description", section 5 and its Flickr30k Entities
evaluation, which POS-SCAN, Zhou et al., CVPR 2020, and later work reuse). The figures on generated captions are
those of GVD's own script, ``eval_grd_flickr30k_entities.py`` of github.com/facebookresearch/grounded-video-description
(its flickr_branch, read at commit 037b7b19f96171ef79be974f3cf84cfecab6eb78), restated here in this project's terms;
docs/grounding.md explains them to readers. Here they are computed on the attention grid of a captioner.

A word's box (``map_box``): its map (H, W) upsampled bilinearly to the photo (UPSAMPLE pixels per cell, in the
photo's normalised [0, 1] coordinates, so the photo's own size does not matter), thresholded at THRESHOLD of its
maximum, and the bounding box of the largest 4-connected region above it. A word *localises* an object when that
box has an IoU above IOU_HIT with one of the object's boxes. The thresholds are this project's choice (GVD's model
attends over region proposals and takes the attended region's box); both are module constants, printed beside the
figures.

Object classes (the *vocabulary*, ``VOCABULARY`` by default): GVD's 480 names, ``data/gvd_flickr30k_classes.txt``
(Neural Baby Talk's ``flickr30k_class_name.txt``, from which GVD's Flickr30k branch builds its word-to-class table;
the file's header names its source). A word is of a class when its lemma (``entities.lemma``) is the class name's.
The names are lemmas as Stanford CoreNLP writes them; the few that ``entities.lemma`` spells otherwise are respelled
(``_SPELLINGS``: "stair" is "stairs" here, "sunglass" "sunglasses", "graffitus" "graffiti", and "glasses" and
"trunks" fold into "glass" and "trunk" as CoreNLP folds them). Three names fold into another here ("people" into
"person", as ``entities.lemma`` folds them for every figure of the project, "outfits" into "outfit", "papers" into
"paper"), so 477 classes remain. ``"frequent"`` is the project's earlier rule (the head nouns boxed in at least
CLASS_PHOTOS of the evaluated photos; without that cut, hundreds of nouns boxed once or twice would each count as a
class), and a path names a file of class names of one's own, one a line, ``#`` lines skipped.

A caption's *object words* are its words of a class. A reference's *objects* are its boxed phrases whose head noun
(the last word) is of a class, each with its chain's boxes (``EntityImage.phrase_boxes``). GVD's annotation file
(``flickr30k_cleaned_class.json``, which its download script fetches and no repository holds) marks one word of such a
phrase and gives it one box; here it is the head noun, and a box localises it when it fits any box of the chain.

Teacher-forced, on the annotated references: ``accuracy``, GVD's grounding accuracy on the references (its
``gt_grd_eval``): per class, the share of the references' object words whose box localises their object, averaged
over the classes with such words; and ``accuracy_words``, over words.

Generated, GVD's protocol (its ``grd_eval``): each generated caption is compared with each reference caption of its
photo in turn.

- Precision, per class: each object word of the caption (every occurrence, each with its own box) against one
  reference. When the reference has an object of the word's class, a hit if the word's box localises the
  reference's first object of that class, a miss otherwise. When the reference names the class only in words that
  are no object (a scene chain's "grass", a phrase without boxes, a word in no phrase), nothing is counted. When it
  does not name the class at all, a hallucination: a miss.
- Recall, per class: each object of the reference against the caption: a hit if the caption's first word of its
  class localises it, a miss if that box does not or the caption has no word of its class.
- ``precision_all`` and ``recall_all`` are the sums over classes of those shares divided by the number of classes
  with an object in the references of the photos evaluated (GVD's ``num_vocab``; a class of theirs that was never
  counted adds 0), and ``f1_all`` = 2 P R / (P + R) of the two (0 when both are 0).
- ``precision_loc``, ``recall_loc``, ``f1_loc``: the same with only the comparisons in which the caption names the
  class and the reference has an object of it (no hallucination, no object left unnamed), over the same classes.

Beside GVD's, the project's earlier variant, in ``generated["per_photo"]`` (its keys named apart), which says what
GVD's does not: how a caption does against its photo rather than against each reference sentence (GVD counts a
rightly named and placed object as hallucinated against every reference that does not mention it). Per photo and
class: *annotated* when a reference of the photo has an object of the class, *named* when a word of the caption is of
it, *localised* when both and the first such word's box localises one of the boxes of every chain whose phrase has
that head noun. Per class c over the photos, with L_c localised, N_c named and A_c annotated: ``precision_all``
L_c / N_c and ``recall_all`` L_c / A_c, averaged over the classes named or annotated; ``f1_all_per_class_mean``, the
mean over those classes of each one's F1 (a macro F1, no stand-in for F1_all: two classes of precision 1 and 0.1 and
recall 0.1 and 1 average to precision and recall 0.55, an F1 of 0.55, and to a per-class mean F1 of 0.18);
``f1_loc_per_class_mean``, the mean over the classes named and annotated of L_c / (named and annotated)_c. A class
named but boxed in no reference of the photo counts against precision, even where a reference names it without a
box.

GVD's generated figures need the photo's reference captions: ``LocalizationFigures.add`` reads them from the
caption's ``photo`` (an ``EntityImage``); a caption read without one counts in the per-photo variant only, and with
no such caption GVD's generated figures are None.

Where this still differs from GVD's script, for want of its inputs: words are lemmatised by ``entities.lemma``, not
CoreNLP (above); a reference's object is its phrase's head noun with every box of its chain, not the one word and
one box of GVD's annotation file; the IoU is taken on the photo's normalised box edges (the Entities' inclusive pixel
boxes read as edges, as GVD's +1 areas read them); the reference words past data.max_length are not read
teacher-forced and so not scored, where GVD counts an object it was given no box for as a miss; and GVD's script
refuses a photo with more than one generated caption, which is the caller's to ensure here.

Beside each figure, on the same words, two boxes that need no model: the whole photo (what a uniform map gives)
and the grid's centre cell. Decoding is the caller's: GVD decodes with beam 1, and the figures take any caption with
its maps.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from captioner.data.entities import lemma

Box = tuple[float, float, float, float]  # normalised [x0, y0, x1, y1]

UPSAMPLE = 16  # pixels per grid cell of the upsampled map
THRESHOLD = 0.5  # the share of the map's maximum that its region must reach
IOU_HIT = 0.5  # a box localises an object when its IoU with one of the object's boxes is above this
CLASS_PHOTOS = 10  # vocabulary "frequent": a head noun is a class when boxed in at least this many evaluated photos
GVD_CLASSES = Path(__file__).parent / "data" / "gvd_flickr30k_classes.txt"  # GVD's 480 class names
VOCABULARY = "gvd"  # the object classes: "gvd" (GVD_CLASSES), "frequent" (CLASS_PHOTOS) or a path to a names file

# GVD's names that CoreNLP's lemmatiser writes and entities.lemma does not: the lemmas their words have here
_SPELLINGS = {"stair": ("stairs",), "sunglass": ("sunglasses",), "graffitus": ("graffiti",),
              "glass": ("glass", "glasses"), "trunk": ("trunk", "trunks")}


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


def read_classes(path: str | Path = GVD_CLASSES) -> dict[str, str]:
    """word lemma -> class name, from a file of class names (one a line; blank and ``#`` lines skipped): each name
    by its own lemma, respelled where CoreNLP and ``entities.lemma`` differ (``_SPELLINGS``); where several names
    share a lemma, the name that is its own lemma names the class ("people" and "person": "person")."""
    names = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    classes: dict[str, str] = {}
    for own in (True, False):
        for name in names:
            for key in _SPELLINGS.get(name, (lemma(name),)):
                if (key == name) == own:
                    classes.setdefault(key, name)
    return classes


def object_classes(vocabulary: str | Path, photos: Iterable[Any], class_photos: int = CLASS_PHOTOS) -> dict[str, str]:
    """word lemma -> class name of a vocabulary: "gvd" (GVD's 480 names), "frequent" (``frequent_classes`` of
    ``photos``, each its own class) or the path of a names file (``read_classes``)."""
    if str(vocabulary) == "gvd":
        return read_classes(GVD_CLASSES)
    if str(vocabulary) == "frequent":
        return {key: key for key in frequent_classes(photos, class_photos)}
    return read_classes(vocabulary)


@dataclass(frozen=True)
class Reference:
    """One reference caption as GVD's script compares a generated one with it: its objects in the caption's order,
    each (class, its chain's boxes), and the classes it names in words that are no object."""

    objects: tuple[tuple[str, tuple[Box, ...]], ...]
    unboxed: frozenset[str]

    def first(self) -> dict[str, tuple[Box, ...]]:
        """class -> the boxes of the reference's first object of that class."""
        out: dict[str, tuple[Box, ...]] = {}
        for cls, boxes in self.objects:
            out.setdefault(cls, boxes)
        return out


def references(photo: Any, classes: Mapping[str, str]) -> list[Reference]:
    """The reference captions of ``photo`` (an ``EntityImage``), with ``classes`` (word lemma -> class): a boxed
    phrase whose head noun is of a class is an object; every other word of a class names it without a box."""
    out = []
    for sentence in photo.sentences:
        objects, at = [], set()
        for phrase in sentence.phrases:
            boxes = photo.phrase_boxes(phrase)
            cls = classes.get(lemma(sentence.tokens[phrase.head]))
            if boxes and cls is not None:
                objects.append((cls, tuple(boxes)))
                at.add(phrase.head)
        unboxed = {classes[key] for i, token in enumerate(sentence.tokens)
                   if i not in at and (key := lemma(token)) in classes}
        out.append(Reference(tuple(objects), frozenset(unboxed)))
    return out


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


METHODS = ("model", "whole_photo", "centre_cell")  # the model's boxes, then two boxes that need no model
SETTINGS = ("all", "loc")  # GVD's two counts on generated captions: every comparison, or those of named objects


def baseline_boxes(grid_hw: tuple[int, int]) -> dict[str, Box]:
    """The boxes of the two baselines: the whole photo (what a uniform map gives) and the grid's centre cell
    (photographers centre their subjects)."""
    H, W = grid_hw
    r, c = H // 2, W // 2
    return {"whole_photo": (0.0, 0.0, 1.0, 1.0), "centre_cell": (c / W, r / H, (c + 1) / W, (r + 1) / H)}


def _hits(box: Sequence[float], boxes: Sequence[Sequence[float]]) -> bool:
    return any(iou(box, b) > IOU_HIT for b in boxes)


def _tally() -> dict[str, dict[str, dict[str, list[bool]]]]:
    """method -> setting -> class -> hits: one of GVD's two counts (precision or recall)."""
    return {m: {s: defaultdict(list) for s in SETTINGS} for m in METHODS}


@dataclass
class Localization:
    """The IoU figures of one evaluation, filled word by word (teacher-forced) and caption by caption (generated),
    for the model's maps and, on the same words, the two baselines' boxes (``baseline_boxes``).

    Args:
        grid_hw: (H, W) of the attention grid.
        classes: word lemma -> object class (``object_classes``); a set of lemmas is each its own class.
    """

    grid_hw: tuple[int, int]
    classes: Mapping[str, str]
    # teacher-forced: method -> class -> hits
    teacher: dict[str, dict[str, list[bool]]] = field(
        default_factory=lambda: {m: defaultdict(list) for m in METHODS})
    # generated, GVD's protocol: the classes with an object in the references compared (num_vocab), the hits
    vocab: set[str] = field(default_factory=set)
    precision: dict = field(default_factory=_tally)
    recall: dict = field(default_factory=_tally)
    compared: int = 0  # (caption, reference) pairs
    # generated, per photo: method -> class -> localised photos; class -> photos named / annotated / both
    localised: dict[str, dict[str, int]] = field(default_factory=lambda: {m: defaultdict(int) for m in METHODS})
    named: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    annotated: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    both: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        if not isinstance(self.classes, Mapping):
            self.classes = {key: key for key in self.classes}

    def _boxes(self, a: np.ndarray) -> dict[str, Box]:
        return {"model": map_box(a, self.grid_hw), **baseline_boxes(self.grid_hw)}

    def add_teacher_forced(self, a: np.ndarray, boxes: Sequence[Box], key: str) -> None:
        """One boxed head noun of a reference, read teacher-forced: its map (L,), its phrase's boxes and its lemma
        (a noun of no object class is not scored)."""
        cls = self.classes.get(key)
        if cls is not None:
            for method, box in self._boxes(a).items():
                self.teacher[method][cls].append(_hits(box, boxes))

    def add_generated(self, lemmas: Sequence[str], maps: np.ndarray, annotated: Mapping[str, Sequence[Box]],
                      refs: Sequence[Reference] | None = None) -> None:
        """One generated caption: its words' lemmas and maps (n, L); the photo's annotated head nouns -> their boxes
        (every chain whose phrase has that head noun: the per-photo variant) and its reference captions
        (``references``: GVD's protocol; None leaves the caption out of GVD's figures)."""
        words = [(i, self.classes[w]) for i, w in enumerate(lemmas) if w in self.classes]  # its object words
        boxes = {i: self._boxes(maps[i]) for i, _ in words}  # method -> box, per object word
        first: dict[str, int] = {}
        for i, cls in words:
            first.setdefault(cls, i)
        self._add_per_photo(first, boxes, annotated)
        for ref in refs if refs is not None else ():
            self._compare(words, first, boxes, ref)

    def _add_per_photo(self, first: dict[str, int], boxes: dict[int, dict[str, Box]],
                       annotated: Mapping[str, Sequence[Box]]) -> None:
        objects: dict[str, list[Box]] = defaultdict(list)  # class -> boxes (two lemmas of one class: both's)
        for key, key_boxes in annotated.items():
            if key in self.classes:
                objects[self.classes[key]].extend(key_boxes)
        for cls in objects:
            self.annotated[cls] += 1
        for cls, i in first.items():
            self.named[cls] += 1
            if cls in objects:
                self.both[cls] += 1
                for method, box in boxes[i].items():
                    self.localised[method][cls] += _hits(box, objects[cls])

    def _compare(self, words: list[tuple[int, str]], first: dict[str, int], boxes: dict[int, dict[str, Box]],
                 ref: Reference) -> None:
        """GVD's comparison of one caption with one reference (module docstring)."""
        self.compared += 1
        self.vocab.update(cls for cls, _ in ref.objects)
        ref_first = ref.first()
        for method in METHODS:
            precision, recall = self.precision[method], self.recall[method]
            for i, cls in words:
                if cls in ref_first:
                    hit = _hits(boxes[i][method], ref_first[cls])
                    precision["all"][cls].append(hit)
                    precision["loc"][cls].append(hit)
                elif cls not in ref.unboxed:
                    precision["all"][cls].append(False)  # hallucinated
            for cls, ref_boxes in ref.objects:
                if cls in first:
                    hit = _hits(boxes[first[cls]][method], ref_boxes)
                    recall["all"][cls].append(hit)
                    recall["loc"][cls].append(hit)
                else:
                    recall["all"][cls].append(False)  # left unnamed

    def _gvd_figures(self, method: str) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for setting in SETTINGS:
            if not self.vocab:
                out.update({f"precision_{setting}": None, f"recall_{setting}": None, f"f1_{setting}": None})
                continue
            p, r = (sum(float(np.mean(v)) for v in counts[method][setting].values() if v) / len(self.vocab)
                    for counts in (self.precision, self.recall))
            out.update({f"precision_{setting}": p, f"recall_{setting}": r, f"f1_{setting}": _f1(p, r)})
        return out

    def _per_photo_figures(self, method: str) -> dict[str, Any]:
        localised = self.localised[method]
        occurring = sorted(set(self.named) | set(self.annotated))
        precision = [localised[c] / self.named[c] if self.named[c] else 0.0 for c in occurring]
        recall = [localised[c] / self.annotated[c] if self.annotated[c] else 0.0 for c in occurring]
        located = [localised[c] / self.both[c] for c in sorted(self.both) if self.both[c]]
        return {"precision_all": _mean(precision), "recall_all": _mean(recall),
                "f1_all_per_class_mean": _mean([_f1(p, r) for p, r in zip(precision, recall)]),
                "f1_loc_per_class_mean": _mean(located),
                "classes_all": len(occurring), "classes_loc": len(located)}

    def _method_figures(self, method: str) -> dict[str, Any]:
        teacher = self.teacher[method]
        return {"accuracy": _mean([float(np.mean(v)) for v in teacher.values() if v]),
                "accuracy_words": _mean([h for v in teacher.values() for h in v]),
                **self._gvd_figures(method), "per_photo": self._per_photo_figures(method)}

    def figures(self) -> dict[str, Any]:
        """{"teacher_forced": {accuracy, accuracy_words, words, classes}, "generated": {GVD's precision_all,
        recall_all, f1_all, precision_loc, recall_loc, f1_loc; classes (num_vocab), references (caption-reference
        pairs compared); "per_photo": the project's variant}, "baselines": {whole_photo, centre_cell: the same
        figures of their boxes on the same words}, the thresholds}; a figure None where nothing counts."""
        model = self._method_figures("model")
        teacher = {k: model[k] for k in ("accuracy", "accuracy_words")}
        teacher.update(words=sum(len(v) for v in self.teacher["model"].values()),
                       classes=sum(1 for v in self.teacher["model"].values() if v))
        generated = {k: v for k, v in model.items() if k not in teacher}
        generated.update(classes=len(self.vocab), references=self.compared)
        return {"teacher_forced": teacher, "generated": generated,
                "baselines": {m: self._method_figures(m) for m in METHODS[1:]},
                "threshold": THRESHOLD, "iou": IOU_HIT, "upsample": UPSAMPLE,
                "object_classes": len(set(self.classes.values()))}


class LocalizationFigures:
    """The IoU figures as a grounding metric (evaluation/grounding.BoxGrounding hands it each caption read): its
    object classes are those of ``vocabulary`` (``object_classes``; "frequent": the head nouns boxed in at least
    ``class_photos`` of the evaluated photos)."""

    def __init__(self, grid_hw: tuple[int, int], classes: Mapping[str, str] | frozenset[str], class_photos: int,
                 vocabulary: str | Path = VOCABULARY) -> None:
        self.localization = Localization(grid_hw, classes)
        self.class_photos = class_photos
        self.vocabulary = str(vocabulary)
        self._references: dict[str, list[Reference]] = {}

    @classmethod
    def build(cls, grid_hw: tuple[int, int], entities: Any, class_photos: int,
              vocabulary: str | Path = VOCABULARY) -> "LocalizationFigures":
        return cls(grid_hw, object_classes(vocabulary, entities.images.values(), class_photos), class_photos,
                   vocabulary)

    def _photo_references(self, photo: Any) -> list[Reference] | None:
        if photo is None:
            return None
        if photo.image_id not in self._references:
            self._references[photo.image_id] = references(photo, self.localization.classes)
        return self._references[photo.image_id]

    def add(self, caption: Any) -> None:
        """One caption (grounding.CaptionRead): a generated one by photo and class, and against each reference of
        its ``photo`` where it carries one; a reference by scored word."""
        if caption.setting == "generated":
            refs = self._photo_references(getattr(caption, "photo", None))
            self.localization.add_generated(caption.lemmas, caption.maps, caption.annotated, refs)
        else:
            for word in caption.scored:
                self.localization.add_teacher_forced(caption.maps[word.index], word.boxes, word.key)

    def figures(self) -> dict[str, Any]:
        return {"localization": {**self.localization.figures(), "vocabulary": self.vocabulary,
                                 "class_photos": self.class_photos}}

    @staticmethod
    def lines(figures: dict[str, Any]) -> list[str]:
        """Its lines of the evaluation table: a box per word, a hit at IoU above loc["iou"] (none when it was not
        computed)."""
        loc = figures.get("localization")
        if not loc:
            return []
        t, g = loc["teacher_forced"], loc["generated"]
        p = g["per_photo"]

        def pct(value: float | None) -> str:
            return "n/a" if value is None else f"{100 * value:.1f}%"

        vocabulary = loc.get("vocabulary", "frequent")
        classes = {"gvd": "GVD's 480 names", "frequent": f"boxed in {loc['class_photos']}+ photos"}.get(
            vocabulary, Path(vocabulary).name)
        b = loc["baselines"]
        return [f"IoU > {loc['iou']:g} (map at {loc['threshold']:g} of its max, largest region's box; "
                f"{loc['object_classes']} object classes, {classes}): "
                f"teacher-forced accuracy {pct(t['accuracy'])} over {t['classes']} classes "
                f"({pct(t['accuracy_words'])} of {t['words']} words)",
                f"  generated, GVD's protocol ({g['references']} caption-reference pairs, {g['classes']} classes): "
                f"F1_all {pct(g['f1_all'])} (precision {pct(g['precision_all'])}, recall {pct(g['recall_all'])}), "
                f"F1_loc {pct(g['f1_loc'])} (precision {pct(g['precision_loc'])}, recall {pct(g['recall_loc'])})",
                f"  generated, per photo: precision {pct(p['precision_all'])}, recall {pct(p['recall_all'])}, "
                f"per-class mean F1_all {pct(p['f1_all_per_class_mean'])} ({p['classes_all']} classes), "
                f"F1_loc {pct(p['f1_loc_per_class_mean'])} ({p['classes_loc']} classes)",
                "  the same words' whole photo / centre cell: " + ", ".join(
                    f"{name} {pct(b['whole_photo'][key])} / {pct(b['centre_cell'][key])}"
                    for name, key in (("accuracy", "accuracy"), ("F1_all", "f1_all"), ("F1_loc", "f1_loc")))]
