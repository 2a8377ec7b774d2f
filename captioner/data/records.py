"""What every data-set reader returns: ``ImageRecord`` (one image and all its captions), and the data errors.

Its own module, below the readers: data/datasets.py (the formats, registered in names.DATA_FORMATS) and
data/captions_file.py (your own CSV or JSON-lines file, one of those formats) both build records, and
datasets.py dispatches to captions_file.py, so the types they share cannot live in either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file and the entry."""


class EmptySplitError(DataError):
    """The data set has no images in the split asked for (e.g. Flickr8k built without its test split)."""


@dataclass
class ImageRecord:
    """One image and all its captions."""

    image_id: str  # unique within the data set; the feature-cache key
    path: Path
    captions: list[list[str]]  # tokens
    raw: list[str]  # the original caption strings (references for the metrics)
    objects: list[dict] = field(default_factory=list)  # shapes: {"name": shape word, "box": [x0, y0, x1, y1]}
    mirrored: bool = False  # the image is read flipped left-right (data.mirror's training copies)
