"""Per-word attention overlays: the figures of Xu et al. 2015 (Fig. 2, 3 and 5).

Each generated word's attention alpha_t (Eq. (4)-(5)), a distribution over the H x W
annotation grid, is upsampled to the image size and laid over the image. As in the
paper's figures, the map may be smoothed with a Gaussian (their code upsampled with
`skimage.transform.pyramid_expand`); hard attention's chosen location s_t (Sec. 4.1) can
be marked with a rectangle. Rendering is headless: a `matplotlib.figure.Figure` on an Agg
canvas, never pyplot's global state, so it runs in workers and tests without a display.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image, ImageDraw, ImageFont

from captioner.atomic import write_bytes_atomic
from captioner.evaluation.metrics import as_numpy

UPSAMPLING = {"nearest": "nearest", "bilinear": "bilinear", "bicubic": "bicubic"}  # torch interpolate modes
# a word's map summing to less than this looked partly elsewhere (the visual sentinel's slot): its panel says how much
LOOKED = 0.995


def _check_inputs(words: Sequence[str], alphas: Any, grid_hw: tuple[int, int], chosen) -> np.ndarray:
    H, W = grid_hw
    a = as_numpy(alphas, np.float32)
    if a.ndim != 2 or a.shape != (len(words), H * W):
        raise ValueError(
            f"alphas has shape {tuple(a.shape)} but {len(words)} words on a grid_hw={tuple(grid_hw)} grid "
            f"need (n_words={len(words)}, H*W={H * W})"
        )
    if chosen is not None:
        if len(chosen) != len(words):
            raise ValueError(f"chosen has {len(chosen)} locations but there are {len(words)} words")
        bad = [c for c in chosen if c is not None and not 0 <= int(c) < H * W]
        if bad:
            raise ValueError(f"chosen locations {bad[:5]} are outside the grid's {H * W} cells")
    return a


def _rgb(image: Image.Image | np.ndarray) -> Image.Image:
    return (image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))).convert("RGB")


def _gaussian_kernel(sigma: float) -> torch.Tensor:
    radius = max(1, int(math.ceil(3 * sigma)))
    x = torch.arange(-radius, radius + 1, dtype=torch.float32)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def attention_heatmap(
    alpha: Any,
    grid_hw: tuple[int, int],
    size: tuple[int, int],
    smooth: bool = True,
    upsample: str = "bicubic",
) -> np.ndarray:
    """One word's alpha (H*W,) as an (H_img, W_img) map in [0, 1] for an image of `size` (W, H).

    Upsampled with `upsample` (one of UPSAMPLING), then, if `smooth`, blurred with a Gaussian
    of sigma = half a grid cell. Scaled by its maximum, so a peaked and a diffuse alpha are
    both visible (the overlay shows where, not how much).
    """
    if upsample not in UPSAMPLING:
        raise ValueError(f"unknown upsample {upsample!r}; valid: {sorted(UPSAMPLING)}")
    H, W = grid_hw
    W_img, H_img = size
    a = torch.from_numpy(as_numpy(alpha, np.float32).reshape(1, 1, H, W))  # (L,) -> (1, 1, H, W)
    mode = UPSAMPLING[upsample]
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    heat = F.interpolate(a, size=(H_img, W_img), mode=mode, **kwargs)  # (1, 1, H_img, W_img)
    if smooth:
        sigma = 0.25 * (H_img / H + W_img / W)  # half the mean cell side, in pixels
        k = _gaussian_kernel(sigma)
        r = k.numel() // 2
        # separable blur; replicate padding keeps the borders from darkening
        heat = F.conv2d(F.pad(heat, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1))
        heat = F.conv2d(F.pad(heat, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1))
    heat = heat.clamp_min(0)[0, 0]  # bicubic overshoots below 0
    peak = float(heat.max())
    return (heat / peak if peak > 0 else heat).numpy()


def _cell_rectangle(index: int, grid_hw: tuple[int, int], size: tuple[int, int]) -> tuple[float, float, float, float]:
    """(x0, y0, width, height) in image pixels of grid cell `index` (row-major)."""
    H, W = grid_hw
    cw, ch = size[0] / W, size[1] / H
    r, c = divmod(int(index), W)
    return c * cw, r * ch, cw, ch


def overlay_attention(
    image: Image.Image,
    words: Sequence[str],
    alphas: Any,
    grid_hw: tuple[int, int],
    chosen: Sequence[int | None] | None = None,
    smooth: bool = True,
    ncols: int = 5,
    *,
    cmap: str = "jet",
    opacity: float = 0.6,
    upsample: str = "bicubic",
    panel_inches: float = 2.4,
    note: str | None = None,
    boxes: Sequence[Sequence[Sequence[float]] | None] | None = None,
) -> Figure:
    """A figure with the plain image, then one panel per word with its attention overlaid.

    Args:
        image: the captioned image (PIL, any mode; numpy arrays are accepted too).
        words: the generated words, used as panel titles (the whole caption is the figure title).
        alphas: (len(words), H*W) attention of the step that produced each word.
        grid_hw: (H, W) of the attention grid.
        chosen: for hard attention, the location index s_t (argmax or sample) per word, or
            None per word; each is marked with a rectangle.
        smooth: Gaussian-smooth the upsampled map (the paper's look); False shows it unblurred.
        ncols: panels per row.
        note: a second title line (an ensemble's says whose attention the maps are).
        boxes: per word, the normalised [x0, y0, x1, y1] boxes of what it names (Flickr30k Entities:
            evaluation.grounding.word_boxes), or None; drawn dashed, with the share of the word's attention inside
            them under its title.
    Save with `fig.savefig(path)`; nothing touches pyplot.
    """
    a = _check_inputs(words, alphas, grid_hw, chosen)
    if boxes is not None and len(boxes) != len(words):
        raise ValueError(f"boxes has {len(boxes)} entries but there are {len(words)} words")
    img = _rgb(image)
    n = len(words) + 1
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(ncols * panel_inches, nrows * panel_inches + 0.4))
    FigureCanvasAgg(fig)
    fig.suptitle(" ".join(words) if note is None else f"{' '.join(words)}\n{note}")
    ax = fig.add_subplot(nrows, ncols, 1)
    ax.imshow(img)
    ax.set_title("")
    ax.axis("off")
    for i, word in enumerate(words):
        ax = fig.add_subplot(nrows, ncols, i + 2)
        ax.imshow(img)
        heat = attention_heatmap(a[i], grid_hw, img.size, smooth=smooth, upsample=upsample)
        ax.imshow(heat, cmap=cmap, alpha=opacity, vmin=0.0, vmax=1.0)
        if chosen is not None and chosen[i] is not None:
            x, y, w, h = _cell_rectangle(chosen[i], grid_hw, img.size)
            # patch corners are pixel edges: imshow puts pixel centres on integers
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), w, h, fill=False, edgecolor="white", linewidth=2))
        title = word
        if boxes is not None and boxes[i]:
            from captioner.evaluation.regions import cell_shares, inside

            for x0, y0, x1, y1 in boxes[i]:
                ax.add_patch(Rectangle((x0 * img.size[0] - 0.5, y0 * img.size[1] - 0.5), (x1 - x0) * img.size[0],
                                       (y1 - y0) * img.size[1], fill=False, edgecolor="lime", linewidth=1.5,
                                       linestyle="--"))
            share = inside(a[i], cell_shares(boxes[i], grid_hw))
            title = f"{word}\n{share:.2f} in box"
        looked = float(a[i].sum())
        if looked < LOOKED:  # a model with the visual sentinel: the rest of the word's weight went to it
            title = f"{title}\n{looked:.2f} on the photo"
        ax.set_title(title)
        ax.axis("off")
    fig.tight_layout()
    return fig


def overlay_frames(
    image: Image.Image,
    alphas: Any,
    grid_hw: tuple[int, int],
    *,
    chosen: Sequence[int | None] | None = None,
    smooth: bool = True,
    cmap: str = "jet",
    opacity: float = 0.6,
    upsample: str = "bicubic",
) -> list[Image.Image]:
    """One RGB image per word: ``image`` with the word's alpha (n_words, H*W) laid over it (smoothed,
    scaled to its own maximum); the cell hard attention read (``chosen``) outlined in white."""
    a = as_numpy(alphas, np.float32)
    img = _rgb(image)
    base = np.asarray(img, dtype=np.float32)  # (H_img, W_img, 3)
    colour_map = colormaps[cmap]
    frames = []
    for i, alpha in enumerate(a):
        heat = attention_heatmap(alpha, grid_hw, img.size, smooth=smooth, upsample=upsample)
        colour = colour_map(heat)[..., :3] * 255.0  # (H_img, W_img, 4) -> RGB
        frame = Image.fromarray(((1 - opacity) * base + opacity * colour).clip(0, 255).astype(np.uint8))
        if chosen is not None and chosen[i] is not None:
            x, y, w, h = _cell_rectangle(int(chosen[i]), grid_hw, img.size)
            ImageDraw.Draw(frame).rectangle([x, y, x + w - 1, y + h - 1], outline="white", width=2)
        frames.append(frame)
    return frames


def save_attention_gif(
    image: Image.Image,
    words: Sequence[str],
    alphas: Any,
    grid_hw: tuple[int, int],
    path: str | Path,
    duration_ms: int = 800,
    *,
    chosen: Sequence[int | None] | None = None,
    smooth: bool = True,
    cmap: str = "jet",
    opacity: float = 0.6,
    upsample: str = "bicubic",
) -> Path:
    """An animated GIF, one frame per word: the overlay with "i/n word" written under it."""
    a = _check_inputs(words, alphas, grid_hw, chosen)
    if not words:
        raise ValueError("save_attention_gif needs at least one word (an empty caption has no attention to show)")
    overlays = overlay_frames(image, a, grid_hw, chosen=chosen, smooth=smooth, cmap=cmap, opacity=opacity,
                              upsample=upsample)
    font = ImageFont.load_default()
    banner = 20
    frames = []
    for i, (word, overlay) in enumerate(zip(words, overlays)):
        frame = Image.new("RGB", (overlay.width, overlay.height + banner), "black")
        frame.paste(overlay, (0, 0))
        # the counter also keeps consecutive frames distinct, which PIL would otherwise merge
        ImageDraw.Draw(frame).text((4, overlay.height + 4), f"{i + 1}/{len(words)} {word}", fill="white", font=font)
        frames.append(frame)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=duration_ms, loop=0)
    write_bytes_atomic(path, buffer.getvalue())  # whole or not at all; a full disk is named (atomic.DiskFullError)
    return path


def save_overlay(image: Image.Image | np.ndarray, result: dict, target: Path, note: str | None = None,
                 boxes: Sequence[Sequence[Sequence[float]] | None] | None = None) -> Path:
    """Write one caption's overlay as a PNG at ``target``: ``result`` is a dict of ``ImageCaptioner.caption``
    (words, alphas, grid_hw, and the cell read per word, ``locations``, outlined when present); ``note`` is a
    line under the panels; ``boxes``: per word, the boxes of what it names (overlay_attention). What `captioner
    caption --attention-out` and the demo write."""
    fig = overlay_attention(image, result["words"], result["alphas"], result["grid_hw"],
                            chosen=result.get("locations"), note=note, boxes=boxes)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    write_bytes_atomic(target, buffer.getvalue())  # whole or not at all; a full disk is named (atomic.DiskFullError)
    return Path(target)
