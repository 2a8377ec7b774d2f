"""Flickr30k Entities (Plummer et al., ICCV 2015): which phrase of a caption names which boxes of the photo.

The published format, per photo ``<id>`` (the Flickr file name up to its first ``_``):

- ``Sentences/<id>.txt``: its captions, one per line, the noun phrases marked ``[/EN#<chain>/<type>[/<type>..]
  words]``; the phrases of one chain name the same thing.
- ``Annotations/<id>.xml``: the photo's ``<size>`` and, per chain (``<object><name>chain</name>``), its boxes
  (``<bndbox>`` xmin ymin xmax ymax, pixels of the original photo, 1-based and inclusive), or ``<nobndbox>`` /
  ``<scene>`` flags. A chain with several boxes (two dogs) is the union of them.

v1.0 numbers the chains per photo, later releases globally; a chain is looked up within its photo, so both read
the same way. Boxes are normalised by the size the XML records, to [0, 1]: the encoder squashes the whole photo to
a square, so the same normalised box fits a 224x224 copy and the full-size photo alike. ``clip_boxes`` clips them
to the photo and drops those left without area, for every reader alike: a phrase whose boxes all clip to nothing
is boxed nowhere.

``read_entities`` reads the photos of a split (those without files are counted, not an error); a malformed file is
a ``DataError`` naming the file and line (evaluation/regions.py rasterises the boxes onto an attention grid). A
phrase's word for grounding is its head noun, taken as its last word ("a set of stairs" -> "stairs"): the
grounding figures and the supervised attention term (training/losses.attention_supervision_loss) both read it.
``lemma`` folds plurals so a generated "dogs" matches a boxed "dog".
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from captioner.data.records import DataError
from captioner.data.vocab import tokenize

# The phrase types of Flickr30k Entities, and the row each is reported in (evaluation/grounding.py).
ENTITY_TYPES = ("people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other",
                "notvisual")
TYPE_ROWS = {"people": "people", "animals": "animals", "clothing": "clothing", "bodyparts": "body parts",
             "scene": "scene", "vehicles": "vehicles", "instruments": "other", "other": "other",
             "notvisual": "other"}
ROWS = ("people", "animals", "clothing", "body parts", "scene", "vehicles", "other")

_PHRASE_RE = re.compile(r"\[/EN#([^/\s\]]+)((?:/[^/\s\]]+)+)\s+([^\[\]]*)\]")

# Plurals no suffix rule folds (the captions' own nouns); everything else: the rules in ``lemma``.
_IRREGULAR = {"men": "man", "women": "woman", "children": "child", "people": "person", "feet": "foot",
              "teeth": "tooth", "mice": "mouse", "geese": "goose", "oxen": "ox", "dice": "die", "knives": "knife",
              "wives": "wife", "leaves": "leaf", "wolves": "wolf", "calves": "calf", "shelves": "shelf",
              "persons": "person", "kids": "kid", "guys": "guy", "boys": "boy", "toys": "toy", "trays": "tray",
              "jeans": "jeans", "pants": "pants", "shorts": "shorts", "glasses": "glasses", "sunglasses": "sunglasses",
              "clothes": "clothes", "goggles": "goggles", "trunks": "trunks", "stairs": "stairs", "dress": "dress",
              "grass": "grass", "bus": "bus", "canvas": "canvas", "gas": "gas", "glass": "glass", "cross": "cross"}


def lemma(word: str) -> str:
    """``word`` lower-cased with its plural folded ("dogs" -> "dog", "men" -> "man", "puppies" -> "puppy",
    "boxes" -> "box"); words that end in -ss, -us, -is or are always plural ("jeans") are kept."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if len(w) <= 3 or not w.endswith("s") or w.endswith(("ss", "us", "is")):
        return w
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("ches", "shes", "xes", "sses", "zes")):
        return w[:-2]
    return w[:-1]


def entity_id(image_id: str) -> str:
    """The Flickr30k photo id of a record's image id: the file's stem up to its first ``_``, without the ``#``
    suffix that follows the file name (a mirrored copy's ``#mirror``, a caption number's ``#2``). Record ids come in
    every shape a data format gives them: a Flickr8k stem (``1000268201_693b08cb0e``), a file name
    (``1000092795.jpg``: Flickr30k's own), or a path under data.root (``images/1000268201_693b08cb0e.jpg``,
    data.format captions), while the Entities files are named by the bare number. Only the last path component is
    read: a ``#`` in a folder's name (``data/set#2/1000268201_693b08cb0e.jpg``) is no suffix."""
    name = re.split(r"[\\/]", image_id)[-1].split("#", 1)[0]
    return name.split("_", 1)[0].split(".", 1)[0]


Box = tuple[float, float, float, float]  # normalised [x0, y0, x1, y1]


def clip_boxes(boxes: Iterable[Sequence[float]]) -> list[Box]:
    """``boxes`` clipped to the photo ([0, 1]), less those left without area: the one rule every reader of boxes
    goes by (teacher-forced and generated grounding, supervised attention, the overlays, through
    ``EntityImage.phrase_boxes``). An XML box can lie past the recorded size; were a phrase with nothing left
    scored in one setting (all of its attention outside) and dropped in another, the settings would count
    different words."""
    out = []
    for box in boxes:
        x0, y0, x1, y1 = (min(max(float(v), 0.0), 1.0) for v in box)
        if x1 > x0 and y1 > y0:
            out.append((x0, y0, x1, y1))
    return out


@dataclass(frozen=True)
class Phrase:
    """One marked phrase: tokens [start, end) of its sentence, its chain and types."""

    start: int
    end: int
    chain: str
    types: tuple[str, ...]

    @property
    def head(self) -> int:
        """The token index of the phrase's head noun (its last word)."""
        return self.end - 1

    @property
    def row(self) -> str:
        """The report row of its first type (``TYPE_ROWS``)."""
        return TYPE_ROWS.get(self.types[0], "other")


@dataclass
class EntitySentence:
    """A caption as tokens (lower-cased words, punctuation dropped: as the Karpathy files hold them) and its
    marked phrases."""

    tokens: list[str]
    phrases: list[Phrase]


@dataclass
class EntityImage:
    """One photo's annotation: its captions with phrases, and per chain its normalised boxes."""

    image_id: str
    size: tuple[int, int]  # (width, height) as the XML records it
    sentences: list[EntitySentence]
    # chain -> its boxes normalised by ``size``, as the XML gives them (possibly past the photo's edge): read them
    # through phrase_boxes, which clips
    boxes: dict[str, list[Box]] = field(default_factory=dict)
    no_box: set[str] = field(default_factory=set)  # chains marked <nobndbox>
    scene: set[str] = field(default_factory=set)  # chains marked <scene>

    def phrase_boxes(self, phrase: Phrase) -> list[Box]:
        """The normalised boxes of the phrase's chain, clipped to the photo (``clip_boxes``): [] for a scene,
        nobndbox or unannotated chain, and for one whose boxes all lie outside the photo."""
        return clip_boxes(self.boxes.get(phrase.chain, []))

    def boxed_heads(self) -> dict[str, tuple[list[Box], str]]:
        """lemma of a boxed phrase's head noun -> (the union of the boxes of every chain such a phrase names, the
        row of the first such phrase): what a generated word is matched against."""
        heads: dict[str, tuple[list, str]] = {}
        chains: dict[str, set[str]] = {}
        for sentence in self.sentences:
            for phrase in sentence.phrases:
                if not self.phrase_boxes(phrase):
                    continue
                key = lemma(sentence.tokens[phrase.head])
                if key not in heads:
                    heads[key] = ([], phrase.row)
                    chains[key] = set()
                if phrase.chain not in chains[key]:
                    chains[key].add(phrase.chain)
                    heads[key][0].extend(self.phrase_boxes(phrase))
        return heads


def _words(text: str) -> list[str]:
    """Tokens as the Karpathy files hold them: lower-cased words, punctuation dropped."""
    return [t for t in tokenize(text) if any(ch.isalnum() for ch in t)]


def parse_sentence(line: str, where: str = "<sentence>") -> EntitySentence:
    """One line of a Sentences file. ``where`` ("file:line") names it in the error a malformed line raises."""
    tokens: list[str] = []
    phrases: list[Phrase] = []
    position = 0
    for m in _PHRASE_RE.finditer(line):
        outside = line[position : m.start()]
        if "[" in outside or "]" in outside:
            raise DataError(f"{where}: unbalanced or malformed phrase mark near {outside.strip()[:40]!r} "
                            "(expected '[/EN#<chain>/<type> words]')")
        tokens += _words(outside)
        words = _words(m.group(3))
        types = tuple(t for t in m.group(2).split("/") if t)
        if words:  # a phrase of punctuation alone names nothing
            phrases.append(Phrase(len(tokens), len(tokens) + len(words), m.group(1), types))
            tokens += words
        position = m.end()
    rest = line[position:]
    if "[" in rest or "]" in rest:
        raise DataError(f"{where}: unbalanced or malformed phrase mark near {rest.strip()[:40]!r} "
                        "(expected '[/EN#<chain>/<type> words]')")
    tokens += _words(rest)
    return EntitySentence(tokens, phrases)


def read_sentences(path: str | Path) -> list[EntitySentence]:
    """Every caption of a ``Sentences/<id>.txt`` (blank lines skipped)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    return [parse_sentence(line, f"{path}:{n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _number(element: ET.Element | None, tag: str, path: Path) -> float:
    node = None if element is None else element.find(tag)
    try:
        return float(node.text)  # type: ignore[union-attr, arg-type]
    except (AttributeError, TypeError, ValueError):
        raise DataError(f"{path}: <{tag}> missing or not a number"
                        + ("" if node is None else f" ({node.text!r})")) from None


def read_annotation(path: str | Path) -> tuple[tuple[int, int], dict[str, list], set[str], set[str]]:
    """An ``Annotations/<id>.xml``: ((width, height), chain -> normalised boxes (not yet clipped), nobndbox chains,
    scene chains)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        line, column = err.position
        raise DataError(f"{path}:{line}: not well-formed XML (column {column})") from None
    size = root.find("size")
    width, height = _number(size, "width", path), _number(size, "height", path)
    if width <= 0 or height <= 0:
        raise DataError(f"{path}: <size> must be positive, got {width:g}x{height:g}")
    boxes: dict[str, list] = {}
    no_box: set[str] = set()
    scene: set[str] = set()
    for obj in root.iter("object"):
        names = [n.text.strip() for n in obj.findall("name") if n.text and n.text.strip()]
        if not names:
            raise DataError(f"{path}: an <object> has no <name> (its chain number)")
        box = obj.find("bndbox")
        for chain in names:
            if box is not None:
                x0, y0 = _number(box, "xmin", path), _number(box, "ymin", path)
                x1, y1 = _number(box, "xmax", path), _number(box, "ymax", path)
                if x1 < x0 or y1 < y0:
                    raise DataError(f"{path}: chain {chain}: box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) has xmax < xmin "
                                    "or ymax < ymin")
                # 1-based inclusive pixels -> [0, 1] edges; clipped where read (clip_boxes), in one place
                boxes.setdefault(chain, []).append(((x0 - 1) / width, (y0 - 1) / height, x1 / width, y1 / height))
            if (flag := obj.find("nobndbox")) is not None and (flag.text or "").strip() == "1":
                no_box.add(chain)
            if (flag := obj.find("scene")) is not None and (flag.text or "").strip() == "1":
                scene.add(chain)
    return (int(width), int(height)), boxes, no_box, scene


def read_entity_image(folder: str | Path, photo_id: str) -> EntityImage | None:
    """The annotation of one photo, or None when the folder has neither of its files (a photo without one). One
    file without the other is an error: the set is incomplete."""
    folder = Path(folder)
    sentences, annotation = folder / "Sentences" / f"{photo_id}.txt", folder / "Annotations" / f"{photo_id}.xml"
    if not sentences.is_file() and not annotation.is_file():
        return None
    for have, lack in ((sentences, annotation), (annotation, sentences)):
        if not lack.is_file():
            raise DataError(f"{lack}: missing, though {have} exists (an incomplete Flickr30k Entities copy)")
    size, boxes, no_box, scene = read_annotation(annotation)
    return EntityImage(photo_id, size, read_sentences(sentences), boxes, no_box, scene)


@dataclass
class Entities:
    """The annotations of a set of photos, by record image id; ``missing`` lists the records without one."""

    folder: Path
    images: dict[str, EntityImage]
    missing: list[str]

    def get(self, image_id: str) -> EntityImage | None:
        return self.images.get(entity_id(image_id))

    def summary(self) -> str:
        n = len(self.images)
        return (f"{n} photos with Flickr30k Entities boxes in {self.folder}"
                + (f"; {len(self.missing)} without an annotation (e.g. {', '.join(self.missing[:3])}), skipped"
                   if self.missing else ""))


def read_entities(folder: str | Path, image_ids: Iterable[str]) -> Entities:
    """The annotations of the photos of ``image_ids`` (record image ids) from a Flickr30k Entities folder
    (``Sentences/`` and ``Annotations/``). Photos without files are listed in ``missing``, not refused."""
    folder = Path(folder)
    for sub in ("Sentences", "Annotations"):
        if not (folder / sub).is_dir():
            raise DataError(f"{folder}: not a Flickr30k Entities folder (no {sub}/); "
                            "../shared/data/flickr8k/build_entities.sh writes one for Flickr8k, or unpack "
                            "annotations.zip of github.com/BryanPlummer/flickr30k_entities")
    images: dict[str, EntityImage] = {}
    missing: list[str] = []
    for image_id in image_ids:
        key = entity_id(image_id)
        if key in images:
            continue
        entry = read_entity_image(folder, key)
        if entry is None:
            missing.append(image_id)
        else:
            images[key] = entry
    return Entities(folder, images, missing)
