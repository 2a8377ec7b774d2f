"""Headless attention-overlay tests."""

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image

from captioner.visualize import attention_heatmap, overlay_attention, overlay_frames, save_attention_gif

GRID = (4, 5)  # H, W: non-square on purpose
WORDS = ["a", "red", "circle"]


def make_inputs():
    image = Image.fromarray((np.random.default_rng(0).random((48, 60, 3)) * 255).astype(np.uint8))
    alphas = torch.softmax(torch.randn(len(WORDS), GRID[0] * GRID[1], generator=torch.Generator().manual_seed(0)), -1)
    return image, alphas


def test_figure_has_one_panel_per_word_plus_image(tmp_path):
    backend = matplotlib.get_backend()
    image, alphas = make_inputs()
    fig = overlay_attention(image, WORDS, alphas, GRID, chosen=[0, None, 19], ncols=2)
    axes = [ax for ax in fig.axes if ax.images]
    assert len(axes) == len(WORDS) + 1
    assert [ax.get_title() for ax in axes] == [""] + WORDS
    assert len(axes[0].images) == 1 and all(len(ax.images) == 2 for ax in axes[1:])
    assert len(axes[1].patches) == 1 and len(axes[2].patches) == 0
    out = tmp_path / "overlay.png"
    fig.savefig(out)
    assert Image.open(out).size[0] > 0
    assert matplotlib.get_backend() == backend  # no pyplot / backend switching


def test_heatmap_peaks_where_alpha_does():
    alpha = torch.zeros(GRID[0] * GRID[1])
    alpha[1 * GRID[1] + 3] = 1.0  # row 1, column 3
    for smooth in (True, False):
        heat = attention_heatmap(alpha, GRID, (60, 48), smooth=smooth)
        assert heat.shape == (48, 60) and heat.max() == pytest.approx(1.0) and heat.min() >= 0
        y, x = np.unravel_index(heat.argmax(), heat.shape)
        assert 12 <= y < 24 and 36 <= x < 48  # inside that cell (each cell is 12 x 12 px)


def test_gif_has_one_frame_per_word(tmp_path):
    image, alphas = make_inputs()
    alphas[1] = alphas[0]  # identical maps: the frames must still not be merged
    path = save_attention_gif(image, WORDS, alphas, GRID, tmp_path / "sub" / "a.gif", duration_ms=300)
    gif = Image.open(path)
    assert gif.n_frames == len(WORDS)
    assert gif.info["duration"] == 300


def test_mismatched_alphas_shape_names_the_sizes():
    image, alphas = make_inputs()
    with pytest.raises(ValueError, match=r"\(3, 20\).*n_words=2.*H\*W=20"):
        overlay_attention(image, WORDS[:2], alphas, GRID)
    with pytest.raises(ValueError, match=r"H\*W=16"):
        save_attention_gif(image, WORDS, alphas, (4, 4), "unused.gif")
    with pytest.raises(ValueError, match="chosen"):
        overlay_attention(image, WORDS, alphas, GRID, chosen=[0])


def test_overlay_is_hottest_where_alpha_is_and_outlines_the_read_cell():
    image = Image.new("RGB", (120, 80), (128, 128, 128))
    H, W = 2, 3
    alphas = np.zeros((2, H * W), dtype=np.float32)
    alphas[0, 5] = 1.0  # bottom right
    alphas[1, 0] = 1.0  # top left
    frames = overlay_frames(image, alphas, (H, W), chosen=[5, 0], opacity=0.5)
    for frame, (row, col) in zip(frames, [(1, 2), (0, 0)]):
        rgb = np.asarray(frame, dtype=np.int16)
        heat = rgb[..., 0] - rgb[..., 2]  # jet: red where alpha is high, blue where it is low
        y, x = np.unravel_index(heat.argmax(), heat.shape)
        assert (y // 40, x // 40) == (row, col)
        x0, y0 = col * 40, row * 40
        assert (rgb[y0 + 20, x0] == 255).all() and (rgb[y0, x0 + 20] == 255).all()  # white outline
        assert not (rgb[y0 + 20, x0 + 20] == 255).all()  # inside the cell: the map, not the outline
