"""Flickr30k Entities files in their published format, written for tests: ``write_photo`` lays one photo's
``Sentences/<id>.txt`` and ``Annotations/<id>.xml``; ``write_flickr_like`` a tiny Karpathy-format data set of
real JPEG files whose photos all carry such annotations (a red square where its box says)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from PIL import Image, ImageDraw


def write_photo(folder: Path, photo_id: str, sentences: Sequence[str], size: tuple[int, int],
                chains: dict[str, Sequence[tuple[int, int, int, int]] | str]) -> None:
    """``chains``: chain -> its boxes (xmin, ymin, xmax, ymax; 1-based inclusive pixels), or "nobndbox" /
    "scene" (a chain with no box, marked the way the published files mark it)."""
    (folder / "Sentences").mkdir(parents=True, exist_ok=True)
    (folder / "Annotations").mkdir(parents=True, exist_ok=True)
    (folder / "Sentences" / f"{photo_id}.txt").write_text("\n".join(sentences) + "\n")
    objects = []
    for chain, boxes in chains.items():
        if isinstance(boxes, str):
            scene = "1" if boxes == "scene" else "0"
            objects.append(f"\t<object>\n\t\t<name>{chain}</name>\n\t\t<scene>{scene}</scene>\n"
                           f"\t\t<nobndbox>1</nobndbox>\n\t</object>")
            continue
        for x0, y0, x1, y1 in boxes:
            objects.append(f"\t<object>\n\t\t<name>{chain}</name>\n\t\t<bndbox>\n\t\t\t<xmin>{x0}</xmin>\n"
                           f"\t\t\t<ymin>{y0}</ymin>\n\t\t\t<xmax>{x1}</xmax>\n\t\t\t<ymax>{y1}</ymax>\n"
                           f"\t\t</bndbox>\n\t</object>")
    width, height = size
    (folder / "Annotations" / f"{photo_id}.xml").write_text(
        f"<annotation>\n\t<filename>{photo_id}.jpg</filename>\n\t<size>\n\t\t<width>{width}</width>\n"
        f"\t\t<height>{height}</height>\n\t\t<depth>3</depth>\n\t</size>\n" + "\n".join(objects)
        + "\n</annotation>")


def write_flickr_like(root: Path, n_train: int = 12, n_val: int = 4) -> tuple[Path, Path, Path]:
    """(image folder, Karpathy JSON, entities folder) of a tiny data set: photo i is 64x64 with a red square in
    its left or right half, captioned "a red square on the left/right" with the phrase boxed. Returns paths."""
    images, entities = root / "images", root / "entities"
    images.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(n_train + n_val):
        photo_id = str(1000 + i)
        left = i % 2 == 0
        x0 = 4 if left else 36
        im = Image.new("RGB", (64, 64), (40, 90, 40))
        ImageDraw.Draw(im).rectangle([x0, 20, x0 + 23, 43], fill=(220, 30, 30))
        name = f"{photo_id}_abc.jpg"
        im.save(images / name, quality=95)
        side = "left" if left else "right"
        raw = [f"a red square on the {side}", f"the red square sits {side}", "a square on green grass"]
        entries.append({"filename": name, "split": "train" if i < n_train else "val",
                        "sentences": [{"raw": r, "tokens": r.split()} for r in raw]})
        write_photo(entities, photo_id, [f"[/EN#1/other a red square] on [/EN#2/scene the {side}] .",
                                         f"[/EN#1/other the red square] sits {side} .",
                                         "[/EN#1/other a square] on [/EN#3/other green grass] ."],
                    (64, 64), {"1": [(x0 + 1, 21, x0 + 24, 44)], "2": "scene", "3": [(1, 1, 64, 64)]})
    captions = root / "dataset.json"
    captions.write_text(json.dumps({"images": entries}))
    return images, captions, entities
