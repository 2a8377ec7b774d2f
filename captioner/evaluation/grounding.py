"""Grounding on real boxes (Flickr30k Entities, captioner/data/entities.py): does a word's attention land on what
the word names?

Per scored word the data give ``f`` (L,), the share of each grid cell's area inside the boxes the word's phrase
names (regions.cell_shares), and the model gives its map ``a`` (L,) (alpha; in hard attention's one-cell modes
the one-hot of the cell read, since the word saw that cell only). The figures, each a mean over words:

- ``inside``: Σ_l a_l f_l, the attention weight inside the boxes: Liu et al. (AAAI 2017)'s "attention
  correctness", on a grid;
- ``pointing``: the share of words whose peak cell (arg-max of ``a``: for hard attention the cell read) lies
  mostly inside the boxes (f >= 0.5);

and beside them, on the same words, three baselines that need no model to look at the photo:

- ``uniform``: the inside figure of the uniform map, mean(f): the boxes' area share;
- ``mean_map`` / ``mean_map_pointing``: the inside and pointing figures of the model's own mean map over every word
  it attended for (of every caption, scored or not): what a map that ignores the word gets;
- ``centre_pointing``: the share of words whose box holds the centre cell (row H // 2, column W // 2):
  photographers centre their subjects, so this is the baseline that pointing has to beat.

Two settings choose the words:

- ``teacher_forced`` (Liu et al.'s): the model reads each annotated reference caption, cut at data.max_length as
  training reads it; every boxed phrase whose head noun (its last word) is among the words read counts once, at
  that word, with its own chain's boxes;
- ``generated``: the model's own caption; a word counts when its lemma equals the head noun of a boxed phrase of
  any of the photo's references, and its boxes are those of every chain such a phrase names.

In both, a phrase's boxes are clipped to the photo and those left without area dropped (entities.clip_boxes, the
rule supervised attention reads too): a phrase whose boxes all clip to nothing is scored in neither.

Each figure is also given per phrase type (people, animals, clothing, body parts, scene, vehicles, other), the
first type a phrase lists. On the same words, the figures the literature reports, a box per word and its IoU with
the object's boxes (GVD's grounding accuracy, F1_all and F1_loc), come from evaluation/localization.py.

These are grounding metrics, registered in ``names.GROUNDING_METRICS``: ``BoxGrounding`` reads each caption once
(its words, maps, the words scored with their boxes' cell shares) into a ``CaptionRead`` and hands it to every
metric; each gives its figures and its lines of the table. Adding one is its class (``build``, ``add``,
``figures``, ``lines``) and one line in that registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from captioner.data.entities import ROWS, Entities, EntityImage, lemma
from captioner.evaluation.localization import CLASS_PHOTOS
from captioner.evaluation.metrics import cells_read
from captioner.evaluation.regions import Flickr30kEntities, cell_shares, head_regions, inside

FIGURES = ("inside", "uniform", "mean_map", "pointing", "mean_map_pointing", "centre_pointing")
MOSTLY_INSIDE = 0.5  # a cell "lies in the boxes" when at least half its area does


def centre_cell(grid_hw: tuple[int, int]) -> int:
    """The flat index of the grid's centre cell (row H // 2, column W // 2)."""
    H, W = grid_hw
    return (H // 2) * W + W // 2


@dataclass
class GroundingTally:
    """Scored words (their map, their boxes' cell fractions and row) and the sum of every attended word's map."""

    grid_hw: tuple[int, int]
    maps: list[np.ndarray] = field(default_factory=list)
    fractions: list[np.ndarray] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    map_sum: np.ndarray | None = None  # (L,) over every attended word, scored or not
    photos: int = 0  # photos with at least one scored word

    def attended(self, maps: np.ndarray) -> None:
        """Every word's map (n, L) of one caption: what the mean-map baseline averages."""
        maps = np.asarray(maps, dtype=np.float64).reshape(-1, self.grid_hw[0] * self.grid_hw[1])
        total = maps.sum(0)
        self.map_sum = total if self.map_sum is None else self.map_sum + total

    def add(self, a: np.ndarray, fraction: np.ndarray, row: str) -> None:
        self.maps.append(np.asarray(a, dtype=np.float64))
        self.fractions.append(fraction)
        self.rows.append(row)

    def figures(self) -> dict[str, Any]:
        """{"words", every FIGURES value, "by_type": {row: {"words", FIGURES...}}}; figures None without words."""
        if not self.maps:
            return {"words": 0, "photos": 0, **{k: None for k in FIGURES}, "by_type": {}}
        maps = np.stack(self.maps)  # (N, L)
        a = maps / np.clip(maps.sum(1, keepdims=True), 1e-12, None)
        f = np.stack(self.fractions)  # (N, L)
        mean_map = self.map_sum / max(self.map_sum.sum(), 1e-12)  # (L,)
        rows = np.asarray(self.rows)
        per_word = {
            "inside": inside(maps, f),
            "uniform": f.mean(1),
            "mean_map": f @ mean_map,
            "pointing": f[np.arange(len(f)), a.argmax(1)] >= MOSTLY_INSIDE,
            "mean_map_pointing": f[:, int(mean_map.argmax())] >= MOSTLY_INSIDE,
            "centre_pointing": f[:, centre_cell(self.grid_hw)] >= MOSTLY_INSIDE,
        }

        def summary(keep: np.ndarray) -> dict[str, Any]:
            return {"words": int(keep.sum()), **{k: float(np.mean(v[keep])) for k, v in per_word.items()}}

        out = {**summary(np.ones(len(f), dtype=bool)), "photos": self.photos}
        out["by_type"] = {row: summary(rows == row) for row in ROWS if (rows == row).any()}
        return out


def _one_cell(alphas: np.ndarray, locations: Sequence[int] | None) -> np.ndarray:
    """(n, L): one-hot rows of the cells read (``locations``) or, where none are given, of alpha's arg-max."""
    cells = locations if locations is not None else alphas.argmax(1)
    return cells_read(cells[: len(alphas)], alphas.shape[1]).astype(np.float64)


@dataclass
class ScoredWord:
    """A word of a caption that names boxed objects: its position, the cell shares of its boxes
    (regions.cell_shares), its phrase-type row, the boxes and its class (the head noun's lemma)."""

    index: int
    cells: np.ndarray
    row: str
    boxes: list
    key: str


@dataclass
class CaptionRead:
    """One caption as every grounding metric reads it: ``setting`` ("generated": the model's own caption;
    "teacher_forced": an annotated reference read by the model), the words' lemmas, their maps (n, L), the words
    scored, and the photo's boxed head nouns -> boxes (what a generated caption could have named)."""

    setting: str
    lemmas: list[str]
    maps: np.ndarray
    scored: list[ScoredWord]
    annotated: dict[str, list]
    photo: EntityImage | None = None  # the photo's annotations (generated captions: GVD's figures read its references)


class PointingFigures:
    """The figures of the module docstring (pointing, inside and their baselines), per setting."""

    def __init__(self, grid_hw: tuple[int, int]) -> None:
        self.tallies = {"generated": GroundingTally(grid_hw), "teacher_forced": GroundingTally(grid_hw)}

    @classmethod
    def build(cls, grid_hw: tuple[int, int], entities: Entities, class_photos: int) -> "PointingFigures":
        return cls(grid_hw)

    def add(self, caption: CaptionRead) -> None:
        tally = self.tallies[caption.setting]
        tally.attended(caption.maps)
        for word in caption.scored:
            tally.add(caption.maps[word.index], word.cells, word.row)
        tally.photos += bool(caption.scored)

    def figures(self) -> dict[str, Any]:
        return {setting: tally.figures() for setting, tally in self.tallies.items()}

    @staticmethod
    def lines(figures: dict[str, Any]) -> list[str]:
        """Its lines of the evaluation table (none when it was not computed)."""
        if figures.get("generated") is None and figures.get("teacher_forced") is None:
            return []
        rows = [f"{'':<16}{'words':>7} {'inside':>7} {'unif.':>6} {'mean':>6} | {'point':>6} {'mean':>6} "
                f"{'centre':>7}"]
        for setting in ("generated", "teacher_forced"):
            g = figures.get(setting)
            if not g or not g["words"]:
                rows.append(f"{setting.replace('_', '-'):<16} no word matched a boxed phrase")
                continue
            for label, f in [(setting.replace("_", "-"), g)] + [(f"  {row}", v) for row, v in g["by_type"].items()]:
                rows.append(f"{label:<16}{f['words']:>7} {f['inside']:7.3f} {f['uniform']:6.3f} "
                            f"{f['mean_map']:6.3f} | {100 * f['pointing']:5.1f}% {100 * f['mean_map_pointing']:5.1f}% "
                            f"{100 * f['centre_pointing']:6.1f}%")
        return rows


class BoxGrounding:
    """The box figures of one evaluation, generated and teacher-forced, filled caption by caption: each caption
    goes to every grounding metric named (``names.GROUNDING_METRICS``: the pointing figures here, GVD's IoU figures
    in evaluation/localization.py), and their figures are merged.

    Args:
        entities: the annotations of the photos evaluated (regions.open_entities).
        grid_hw: (H, W) of the attention grid.
        one_cell: the maps scored are the cells read (hard attention's one-cell decoding), not alpha.
        metrics: the grounding metrics computed (validation, which reports pointing only, names that one); a
            metric left out reports None.
        class_photos: the IoU figures' object classes are the head nouns boxed in at least this many of the
            photos (localization.CLASS_PHOTOS).
    """

    def __init__(self, entities: Entities, grid_hw: tuple[int, int], one_cell: bool = False,
                 metrics: Sequence[str] | None = None, class_photos: int = CLASS_PHOTOS) -> None:
        from captioner.names import GROUNDING_METRICS

        self.entities = entities
        self.source = Flickr30kEntities(entities)
        self.grid_hw = grid_hw
        self.one_cell = one_cell
        self.class_photos = class_photos
        names = list(GROUNDING_METRICS) if metrics is None else list(metrics)
        self.metrics = {name: GROUNDING_METRICS.get(name).build(grid_hw, entities, class_photos) for name in names}
        self._cells: dict[tuple[str, str], np.ndarray] = {}
        self.without_annotation = 0
        # photo id -> its generated caption's boxed words, pointing hits, centre hits and inside sum: what a paired
        # bootstrap (evaluation/paired.py) resamples
        self.per_photo: dict[str, dict[str, float]] = {}

    def _scored(self, image_id: str, index: int, key: str, boxes: list, row: str) -> ScoredWord:
        """A scored word, its boxes' cell shares rasterised once per photo and class."""
        if (image_id, key) not in self._cells:
            self._cells[image_id, key] = cell_shares(boxes, self.grid_hw)
        return ScoredWord(index, self._cells[image_id, key], row, boxes, key)

    def _add(self, caption: CaptionRead) -> None:
        for metric in self.metrics.values():
            metric.add(caption)

    def add_generated(self, image_id: str, words: Sequence[str], alphas: np.ndarray,
                      locations: Sequence[int] | None = None) -> None:
        """One generated caption: ``alphas`` (n_words, L) of the steps that produced ``words``; ``locations``:
        the cells read (hard attention's one-cell decoding)."""
        photo = self.entities.get(image_id)
        if photo is None:
            self.without_annotation += 1
            return
        alphas = np.asarray(alphas, dtype=np.float64)[: len(words)]
        maps = _one_cell(alphas, locations) if self.one_cell or locations is not None else alphas
        regions = self.source.word_regions(image_id, words)
        scored = [self._scored(photo.image_id, i, r.key, r.region, r.row) for i, r in enumerate(regions) if r]
        annotated = {key: boxes for key, (boxes, _) in self.source.heads(image_id).items()}
        self.per_photo[image_id] = photo_sums(maps, scored, self.grid_hw)
        self._add(CaptionRead("generated", [lemma(word) for word in words], maps, scored, annotated, photo))

    def add_teacher_forced(self, photo: EntityImage, sentence_index: int, alphas: np.ndarray,
                           max_length: int | None = None) -> None:
        """One annotated reference read by the model: ``alphas`` (T, L), row t the map of the step that predicts
        token t; ``max_length``: the cut the reference was encoded with (vocab.encode's; None: uncut). Every boxed
        phrase whose head noun was read is scored there with its own chain's boxes."""
        sentence = photo.sentences[sentence_index]
        # The rows past the words read are the <end> step's and padding's maps: a head noun cut off the encoded
        # caption would be scored with another step's map, so only the words read are scored (and averaged).
        read = len(sentence.tokens) if max_length is None else min(len(sentence.tokens), max_length)
        alphas = np.asarray(alphas, dtype=np.float64)[:read]
        maps = _one_cell(alphas, None) if self.one_cell else alphas
        scored = []
        for phrase in sentence.phrases:
            boxes = photo.phrase_boxes(phrase)
            if boxes and phrase.head < len(maps):
                scored.append(ScoredWord(phrase.head, cell_shares(boxes, self.grid_hw), phrase.row, boxes,
                                         lemma(sentence.tokens[phrase.head])))
        self._add(CaptionRead("teacher_forced", [lemma(t) for t in sentence.tokens[:read]], maps, scored, {}))

    def figures(self) -> dict[str, Any]:
        from captioner.names import GROUNDING_METRICS

        out: dict[str, Any] = {name: None for name in GROUNDING_METRICS if name not in self.metrics}
        for metric in self.metrics.values():
            out.update(metric.figures())
        return {**out, "photos": len(self.entities.images), "photos_without_annotation": len(self.entities.missing),
                "source": str(self.entities.folder)}


def photo_sums(maps: np.ndarray, scored: Sequence[ScoredWord], grid_hw: tuple[int, int]) -> dict[str, float]:
    """One caption's box figures as sums over its scored words (GroundingTally's per-word figures, summed):
    {"words", "pointing" (peak cell mostly inside), "centre" (the centre cell is), "inside" (Σ α inside)}."""
    out = {"words": len(scored), "pointing": 0, "centre": 0, "inside": 0.0}
    centre = centre_cell(grid_hw)
    for word in scored:
        a = maps[word.index]
        out["pointing"] += int(word.cells[int(a.argmax())] >= MOSTLY_INSIDE)
        out["centre"] += int(word.cells[centre] >= MOSTLY_INSIDE)
        out["inside"] += float(inside(a, word.cells))
    return out


def word_boxes(photo: EntityImage | None, words: Sequence[str]) -> list[list[tuple[float, float, float, float]] | None]:
    """Per word, the normalised boxes of the boxed phrases whose head noun it names (by lemma, as the generated
    figures match), or None: what the overlays draw on each word's panel."""
    regions = head_regions(photo.boxed_heads() if photo is not None else {}, words)
    return [None if r is None else r.region for r in regions]


def word_grounding(photo: EntityImage | None, words: Sequence[str], alphas: Any, grid_hw: tuple[int, int],
                   locations: Sequence[int] | None = None) -> list[dict[str, Any] | None]:
    """Per word of one caption, its box figures as the generated setting scores them, or None for a word that
    names no boxed phrase: ``inside`` (its attention's share inside the boxes; the cell read when ``locations``),
    ``pointing`` (its peak cell lies mostly inside), ``centre`` (the centre cell does), ``uniform`` (the boxes'
    area share). What the notebook prints beside each word's overlay."""
    a = np.asarray(alphas, dtype=np.float64)[: len(words)]
    if locations is not None:
        a = _one_cell(a, locations)
    out: list[dict[str, Any] | None] = []
    for i, boxes in enumerate(word_boxes(photo, words)):
        if not boxes:
            out.append(None)
            continue
        f = cell_shares(boxes, grid_hw)
        out.append({"word": words[i], "inside": inside(a[i], f),
                    "pointing": bool(f[int(a[i].argmax())] >= MOSTLY_INSIDE),
                    "centre": bool(f[centre_cell(grid_hw)] >= MOSTLY_INSIDE), "uniform": float(f.mean())})
    return out


def format_grounding(figures: dict[str, Any]) -> list[str]:
    """The box-grounding lines of an evaluation table: a heading, then each grounding metric's lines (its
    ``lines``), for the metrics computed."""
    from captioner.names import GROUNDING_METRICS

    rows = [f"boxes      Flickr30k Entities, {figures['photos']} photos"
            + (f" ({figures['photos_without_annotation']} without annotation, skipped)"
               if figures["photos_without_annotation"] else "")
            + "; % of words, mean over words; baselines on the same words"]
    for name in GROUNDING_METRICS:
        rows += GROUNDING_METRICS.get(name).lines(figures)
    return rows
