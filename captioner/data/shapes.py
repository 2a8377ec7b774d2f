"""The built-in synthetic data set: scenes of coloured shapes, with reference captions and object boxes.

It is the embedded default for the demo, the tests and the notebook: it needs no download, a model learns it in
minutes on a CPU, and because every object's box is known it can check what attention is for. Xu et al. 2015
(Sec. 5.4 and its figures) judge attention by eye, by whether alpha_ti lands on the object word t names; here the
"refs" of every sentence say which object each size/colour/shape word names, so that check becomes a number.

Layout (Karpathy-split JSON, as the data-set readers expect):
    out_dir/images/000000.png ...
    out_dir/dataset_shapes.json
        {"dataset": "shapes", "params": {...}, "shapes": [...], "colours": [...], "sizes": [...],
         "images": [{"filename", "filepath", "imgid", "split", "sentids",
                     "sentences": [{"tokens", "raw", "imgid", "sentid", "refs": [[token_index, object_index]]}],
                     "objects": [{"shape", "colour", "size", "box": [x0, y0, x1, y1]}]}]}   (x1/y1 exclusive)

Objects are listed left to right (by box centre), and most captions name them in that order, so the wording
a model must learn is nearly deterministic given the picture. Image i is drawn from its own random stream
(seed, i), so the same seed gives byte-identical files and a training image does not change with n_val/n_test.
``generate_shapes`` writes it; ``captioner shapes`` (captioner/commands/shapes.py) is the command.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from PIL import Image, ImageDraw

from captioner.atomic import raise_if_disk_full, write_text_atomic

log = logging.getLogger(__name__)

SHAPES = ["circle", "square", "triangle", "star"]
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange"]
SIZES = ["small", "large"]

JSON_NAME = "dataset_shapes.json"
IMAGE_DIR = "images"
GENERATOR_VERSION = 1  # bump when drawing or captions change, so old directories are regenerated
REFERENCE_SIZE = 224  # pixel sizes below are for a 224 image and scale with image_size
SENTENCES_PER_IMAGE = 5

# Saturated hues, far from the muted grey/beige backgrounds, so colour stays readable after a CNN.
_RGB = {
    "red": (205, 35, 35),
    "green": (40, 160, 60),
    "blue": (40, 80, 215),
    "yellow": (240, 210, 40),
    "purple": (135, 55, 175),
    "orange": (245, 135, 25),
}
# Side length range in pixels at 224: a large object spans ~3 cells of a 7x7 grid, a small one ~1.5.
_SIDE_PX = {"small": (40, 55), "large": (80, 100)}
_SYNONYM = {"small": "little", "large": "big"}
# Relation of object a to object b, from box centres along the axis where they differ most.
_RELATION_WORDS = {"left": "to the left of", "right": "to the right of", "above": "above", "below": "below"}
_INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}
_COUNT_WORDS = {2: "two", 3: "three"}
_OBJECT_COUNT_P = {1: 0.3, 2: 0.4, 3: 0.3}


def relation(box_a: list[int], box_b: list[int]) -> str:
    """Where box a lies relative to box b: "left", "right", "above" or "below" (dominant axis of the centres)."""
    dx = (box_a[0] + box_a[2]) - (box_b[0] + box_b[2])  # twice the centre difference; only signs/ratios matter
    dy = (box_a[1] + box_a[3]) - (box_b[1] + box_b[3])
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


def generate_shapes(
    out_dir: str | Path,
    n_train: int = 3000,
    n_val: int = 200,
    n_test: int = 200,
    image_size: int = REFERENCE_SIZE,
    seed: int = 0,
) -> Path:
    """Write the shapes data set to ``out_dir`` (or reuse it if already complete) and return the JSON's path.

    Args:
        out_dir: directory to hold ``images/`` and ``dataset_shapes.json``.
        n_train, n_val, n_test: images per split.
        image_size: side of the square images in pixels (objects scale with it).
        seed: the same seed gives byte-identical files.
    """
    for name, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32 pixels, got {image_size}")
    out_dir = Path(out_dir)
    json_path = out_dir / JSON_NAME
    params = {
        "generator_version": GENERATOR_VERSION,
        "n_train": int(n_train),
        "n_val": int(n_val),
        "n_test": int(n_test),
        "image_size": int(image_size),
        "seed": int(seed),
    }
    if _is_complete(out_dir, params):
        return json_path
    out_dir.mkdir(parents=True, exist_ok=True)
    with _preparing(out_dir):  # one process draws; another one that started together waits, then finds it done
        if _is_complete(out_dir, params):
            return json_path
        return _draw_data_set(out_dir, params, json_path)


def lock_path(out_dir: Path) -> Path:
    """The lock file of a shapes root: beside it, not in it (the root holds the data set and nothing else)."""
    return out_dir.parent / f".{out_dir.name}.generating.lock"


@contextlib.contextmanager
def _preparing(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir``'s lock while the data set is drawn there: two processes that need the same (re)generated
    root (two `captioner extract` runs started together) used to both delete the other's stale images and crash.
    The second waits, saying for what. Where file locks do not exist (Windows), nothing is held."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path(out_dir), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process that is generating the shapes data in %s", out_dir)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _draw_data_set(out_dir: Path, params: dict[str, Any], json_path: Path) -> Path:
    n_train, n_val, n_test = params["n_train"], params["n_val"], params["n_test"]
    image_size, seed = params["image_size"], params["seed"]
    # The JSON is the "complete" marker: remove a stale one first so a run killed while drawing images
    # can never be mistaken for a finished data set.
    json_path.unlink(missing_ok=True)
    image_dir = out_dir / IMAGE_DIR
    image_dir.mkdir(parents=True, exist_ok=True)

    splits = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    entries = []
    for imgid, split in enumerate(splits):
        rng = np.random.default_rng([seed, imgid])
        image, objects = _draw_scene(rng, image_size)
        filename = f"{imgid:06d}.png"
        # 3: half the time of the default 6 for 30% larger files
        try:
            image.save(image_dir / filename, format="PNG", compress_level=3)
        except OSError as err:  # a full disk is named (atomic.DiskFullError); the data set is rebuilt on next use
            raise_if_disk_full(err, image_dir / filename, action="write the shapes image")
            raise
        sentences = []
        for k, (tokens, refs) in enumerate(_captions(objects)):
            sentences.append(
                {"tokens": tokens, "raw": _detokenize(tokens), "imgid": imgid,
                 "sentid": imgid * SENTENCES_PER_IMAGE + k, "refs": refs}
            )
        entries.append(
            {"filename": filename, "filepath": IMAGE_DIR, "imgid": imgid, "split": split,
             "sentids": [s["sentid"] for s in sentences], "sentences": sentences, "objects": objects}
        )

    # Files left by an earlier, larger data set in the same directory would otherwise linger.
    keep = {e["filename"] for e in entries}
    for stale in image_dir.glob("*.png"):
        if re.fullmatch(r"\d{6}\.png", stale.name) and stale.name not in keep:
            stale.unlink(missing_ok=True)

    dataset = {"dataset": "shapes", "params": params, "shapes": SHAPES, "colours": COLOURS, "sizes": SIZES,
               "images": entries}
    write_text_atomic(json_path, json.dumps(dataset, separators=(",", ":")))  # dumps: the C encoder; dump is not
    return json_path


def _is_complete(out_dir: Path, params: dict[str, Any]) -> bool:
    try:
        dataset = json.loads((out_dir / JSON_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(dataset, dict) or dataset.get("params") != params:
        return False
    images = dataset.get("images")
    total = params["n_train"] + params["n_val"] + params["n_test"]
    if not isinstance(images, list) or len(images) != total:
        return False
    return all((out_dir / e["filepath"] / e["filename"]).is_file() for e in images)


# ----------------------------------------------------------------------------------------------- drawing


def _draw_scene(rng: np.random.Generator, image_size: int) -> tuple[Image.Image, list[dict[str, Any]]]:
    """One image and its objects (sorted left to right by box centre)."""
    scale = image_size / REFERENCE_SIZE
    while True:  # a scene that cannot be placed (e.g. three large objects) is redrawn from scratch
        n = int(rng.choice(list(_OBJECT_COUNT_P), p=list(_OBJECT_COUNT_P.values())))
        kinds: list[tuple[str, str]] = []
        while len(kinds) < n:  # distinct (shape, colour) pairs, so "a red circle" names one object
            kind = (SHAPES[rng.integers(len(SHAPES))], COLOURS[rng.integers(len(COLOURS))])
            if kind not in kinds:
                kinds.append(kind)
        sizes = [SIZES[rng.integers(len(SIZES))] for _ in range(n)]
        sides = [int(round(rng.integers(lo, hi + 1) * scale)) for lo, hi in (_SIDE_PX[s] for s in sizes)]
        boxes = _place(rng, sides, image_size, scale)
        if boxes is not None:
            break
    objects = [
        {"shape": shape, "colour": colour, "size": size, "box": box}
        for (shape, colour), size, box in zip(kinds, sizes, boxes)
    ]
    objects.sort(key=lambda o: (o["box"][0] + o["box"][2], o["box"][1] + o["box"][3]))

    image = Image.fromarray(_background(rng, image_size), mode="RGB")
    draw = ImageDraw.Draw(image)
    for obj in objects:
        base = np.array(_RGB[obj["colour"]], dtype=np.int64)
        fill = tuple(int(v) for v in np.clip(base + rng.integers(-15, 16, size=3), 0, 255))
        outline = tuple(int(v * 0.65) for v in fill)  # a darker rim, as lit objects have
        _draw_shape(draw, obj["shape"], obj["box"], fill, outline, width=max(1, round(2 * scale)))
    return image, objects


def _place(rng: np.random.Generator, sides: list[int], image_size: int, scale: float) -> list[list[int]] | None:
    """Non-overlapping square boxes for the given sides, or None if no good layout was found."""
    margin = max(1, round(4 * scale))
    gap = max(1, round(8 * scale))
    min_dx = 14 * scale  # centres this far apart in x keep "left to right" order readable from a 7x7 grid
    for _ in range(60):
        boxes: list[list[int]] = []
        for side in sides:
            for _ in range(40):
                x0 = int(rng.integers(margin, image_size - margin - side + 1))
                y0 = int(rng.integers(margin, image_size - margin - side + 1))
                box = [x0, y0, x0 + side, y0 + side]
                if all(_apart(box, other, gap) for other in boxes):
                    boxes.append(box)
                    break
            else:
                break
        if len(boxes) < len(sides):
            continue
        cx = sorted(b[0] + b[2] for b in boxes)  # doubled centres
        if any(b - a < 2 * min_dx for a, b in zip(cx, cx[1:])):
            continue
        # The first two objects (left to right) get a relation word; keep it clear which axis dominates.
        if len(boxes) > 1:
            first, second = sorted(boxes, key=lambda b: b[0] + b[2])[:2]
            dx = abs((first[0] + first[2]) - (second[0] + second[2]))
            dy = abs((first[1] + first[3]) - (second[1] + second[3]))
            if max(dx, dy) < 1.4 * min(dx, dy):
                continue
        return boxes
    return None


def _apart(a: list[int], b: list[int], gap: int) -> bool:
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A muted grey/beige textured background, (size, size, 3) uint8: smooth noise, stripes or a gradient."""
    grey = rng.uniform(110, 200)
    tint = rng.uniform(0.0, 1.0) * np.array([12.0, 4.0, -14.0])  # 0 = neutral grey, 1 = beige
    base = grey + tint  # (3,)
    x = (np.arange(size, dtype=np.float32) / size)[None, :]  # (1, S), broadcast against the column below
    y = (np.arange(size, dtype=np.float32) / size)[:, None]  # (S, 1)
    kind = int(rng.integers(3))
    if kind == 0:  # smooth blotches: coarse random field, bicubic-upsampled
        cells = int(rng.integers(3, 9))
        coarse = rng.uniform(0, 255, (cells, cells)).astype(np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((size, size), Image.BICUBIC), np.float32) / 127.5 - 1
        texture = field * np.float32(rng.uniform(10, 22))
    elif kind == 1:  # stripes at a random angle and period
        theta = rng.uniform(0, math.pi)
        k = np.float32(2 * math.pi / rng.uniform(0.05, 0.2))
        phase = np.float32(rng.uniform(0, 2 * math.pi))
        texture = np.sin(x * (k * math.cos(theta)) + y * (k * math.sin(theta)) + phase) * np.float32(rng.uniform(6, 14))
    else:  # linear gradient
        theta = rng.uniform(0, 2 * math.pi)
        amplitude = rng.uniform(30, 60)
        texture = ((x - 0.5) * np.float32(math.cos(theta) * amplitude)
                   + (y - 0.5) * np.float32(math.sin(theta) * amplitude))
    # Round once on (S, S) and add the colour in int16: three times less float work than on (S, S, 3).
    pixels = np.rint(texture).astype(np.int16)[:, :, None] + np.rint(base).astype(np.int16)  # (S, S, 3)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: list[int], fill, outline, width: int) -> None:
    x0, y0, x1, y1 = box
    inclusive = [x0, y0, x1 - 1, y1 - 1]  # PIL's shape coordinates include the last pixel; our boxes do not
    if shape == "circle":
        draw.ellipse(inclusive, fill=fill, outline=outline, width=width)
    elif shape == "square":
        draw.rectangle(inclusive, fill=fill, outline=outline, width=width)
    elif shape == "triangle":
        points = [(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1 - 1) / 2, y0)]
        draw.polygon(points, fill=fill, outline=outline, width=width)
    elif shape == "star":
        # Five-pointed star, stretched so its outer points touch all four sides of the box.
        angles = [-math.pi / 2 + i * math.pi / 5 for i in range(10)]
        radii = [1.0 if i % 2 == 0 else 0.45 for i in range(10)]
        px = [r * math.cos(a) for r, a in zip(radii, angles)]
        py = [r * math.sin(a) for r, a in zip(radii, angles)]
        sx = (x1 - 1 - x0) / (max(px) - min(px))
        sy = (y1 - 1 - y0) / (max(py) - min(py))
        points = [(x0 + (u - min(px)) * sx, y0 + (v - min(py)) * sy) for u, v in zip(px, py)]
        draw.polygon(points, fill=fill, outline=outline, width=width)
    else:
        raise ValueError(f"unknown shape {shape!r}; valid shapes: {SHAPES}")


# ----------------------------------------------------------------------------------------------- captions


def _captions(objects: list[dict[str, Any]]) -> list[tuple[list[str], list[list[int]]]]:
    """Five references: (tokens, refs) pairs. refs = [[token_index, object_index], ...] for size/colour/shape.

    Templates differ in wording (a count phrase, big/little for large/small, sizes left out, the reverse
    order with the inverse relation) but never in facts; the first and most frequent form names objects
    left to right with their sizes.
    """
    n = len(objects)
    order = list(range(n))  # objects are stored left to right already

    def phrase(i: int, size: bool = True, synonym: bool = False) -> list[tuple[str, int | None]]:
        obj = objects[i]
        words: list[tuple[str, int | None]] = []
        if size:
            words.append((_SYNONYM[obj["size"]] if synonym else obj["size"], i))
        words += [(obj["colour"], i), (obj["shape"], i)]
        article = "an" if words[0][0][0] in "aeiou" else "a"
        return [(article, None)] + words

    def listing(indices: list[int], **kw) -> list[tuple[str, int | None]]:
        out: list[tuple[str, int | None]] = []
        for k, i in enumerate(indices):
            if k > 0:
                out.append(("and", None) if k == len(indices) - 1 else (",", None))
            out += phrase(i, **kw)
        return out

    def words_of(text: str) -> list[tuple[str, int | None]]:
        return [(w, None) for w in text.split()]

    if n == 1:
        templates = [
            phrase(0),
            words_of("there is") + phrase(0),
            phrase(0, size=False),
            words_of("one") + phrase(0)[1:],  # drops the article
            words_of("there is") + phrase(0, synonym=True),
        ]
    else:
        rel = relation(objects[0]["box"], objects[1]["box"])
        head = phrase(0) + words_of(_RELATION_WORDS[rel]) + phrase(1)
        head_short = phrase(0, size=False) + words_of(_RELATION_WORDS[rel]) + phrase(1, size=False)
        if n == 2:
            templates = [
                head,
                words_of("there is") + listing(order),
                words_of(f"{_COUNT_WORDS[n]} shapes :") + listing(order, synonym=True),
                phrase(1) + words_of(_RELATION_WORDS[_INVERSE[rel]]) + phrase(0),
                listing(order, size=False),
            ]
        else:  # three objects: at most 16 tokens, so the count phrase goes with the size-less listing
            templates = [
                listing(order),
                words_of("there is") + listing(order, synonym=True),
                words_of(f"{_COUNT_WORDS[n]} shapes :") + listing(order, size=False),
                head_short + [("and", None)] + phrase(2, size=False),
                listing(order, size=False),
            ]
    return [([w for w, _ in t], [[k, i] for k, (_, i) in enumerate(t) if i is not None]) for t in templates]


def _detokenize(tokens: list[str]) -> str:
    """Readable text that ``tokenize`` maps back to exactly ``tokens``."""
    text = " ".join(tokens).replace(" ,", ",").replace(" :", ":")
    return text[0].upper() + text[1:]
