"""The parts of `captioner demo` (captioner/commands/demo.py, what `make demo` runs) and of the notebook.

``sample_photo`` gives scikit-image's bundled photographs (``PHOTOS``); ``caption_photos`` captions them with
the shipped Flickr8k model and writes their per-word attention overlays (seconds, no training);
``caption_records`` captions data-set images with overlays; ``ensure_checkpoint`` trains a run unless it
already holds a best.pt. The demo then generates the shapes data, extracts EfficientNet-Lite0 grids into the
feature cache, trains the soft-attention model within a time budget, evaluates it on the test split (caption
metrics and attention grounding), captions a few test images and writes their overlays.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

from captioner.atomic import write_bytes_atomic
from captioner.config import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "shapes.yaml"  # shipped with the package
# Photographs bundled with scikit-image (public-domain or CC0 images), shown by the demo and the notebook.
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle_left")


def sample_photo(name: str):
    """scikit-image's bundled photograph ``name`` as a PIL RGB image."""
    import numpy as np
    from PIL import Image
    from skimage import data

    if name == "motorcycle_left":
        array = data.stereo_motorcycle()[0]
    else:
        array = getattr(data, name)()
    return Image.fromarray(np.asarray(array)[..., :3]).convert("RGB")


def caption_photos(out_dir: Path, names: Sequence[str] = PHOTOS) -> list[dict]:
    """Caption scikit-image's photographs with the shipped model, as `captioner caption` does (its config's
    decoding); write each photo and its overlay."""
    from captioner.api import load_captioner
    from captioner.visualize import save_overlay

    model = load_captioner()  # the shipped Flickr8k model
    out_dir.mkdir(parents=True, exist_ok=True)
    images = [sample_photo(n) for n in names]
    results = []
    for name, image, out in zip(names, images, model.caption(images)):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")  # lossless: `captioner caption` on it gives the same caption
        write_bytes_atomic(out_dir / f"{name}.png", buffer.getvalue())  # a full disk is named
        target = save_overlay(image, out, out_dir / f"{name}_attention.png")
        results.append({"photo": name, "caption": out["caption"], "overlay": str(target)})
    return results


def caption_records(model, records: Sequence, overlay_dir: Path) -> list[dict]:
    """Caption data set images (one batched search, the model's config's decoding), write their overlays, print
    each beside its first reference; returns {image, caption, reference, overlay} per image."""
    from captioner.data.images import load_image
    from captioner.visualize import save_overlay

    overlay_dir.mkdir(parents=True, exist_ok=True)
    captions = []
    images = [load_image(record.path) for record in records]
    for record, image, out in zip(records, images, model.caption(images)):
        target = save_overlay(image, out, overlay_dir / f"{Path(record.path).stem}.png")
        captions.append({"image": str(record.path), "caption": out["caption"], "reference": record.raw[0],
                         "overlay": str(target)})
        print(f"      {Path(record.path).name}: {out['caption']!r}  (reference: {record.raw[0]!r})")
    return captions


def ensure_checkpoint(config: str | Path, run_dir: str | Path, overrides: Sequence[str] = ()) -> Path:
    """Return ``run_dir``, training it from ``config`` first unless it already holds a best.pt.

    The notebook uses this to load the demo checkpoint, or to train one quickly when there is none.
    """
    from captioner.store.rundir import RunDir
    from captioner.training.loop import train

    run_dir = Path(run_dir)
    if not RunDir(run_dir).best.exists():
        train(load_config(config, [f"train.run_dir={run_dir}", *overrides]))
    return run_dir
