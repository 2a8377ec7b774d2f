"""What the demos share: scikit-image's bundled photographs (``PHOTOS``, ``sample_photo``), which `captioner demo`
(captioner/commands/demo.py), the notebook, the README's example and the tests caption; and ``ensure_checkpoint``,
which gives the notebook a trained run, training it first when the folder holds no best.pt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from captioner.config import load_config

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
