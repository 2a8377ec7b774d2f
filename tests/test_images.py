"""Tests for captioner/data/images.py: every awkward file is built at test time in tmp_path."""

import re
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from corpus import giant_16bit_png
from PIL import Image

from captioner.data.images import ImageLoadError, load_image


def _png_with_declared_size(path, width, height):
    """A tiny valid 1x1 PNG whose IHDR is patched to declare width x height (CRC fixed), i.e. a bomb header."""
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path


def test_rgb_passes_through_unchanged(tmp_path):
    arr = np.random.default_rng(0).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "a.png")
    im = load_image(tmp_path / "a.png")
    assert im.mode == "RGB" and im.size == (20, 12)
    assert np.array_equal(np.asarray(im), arr)


def test_grayscale_becomes_rgb(tmp_path):
    arr = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    Image.fromarray(arr, mode="L").save(tmp_path / "g.png")
    out = np.asarray(load_image(tmp_path / "g.png"))
    assert out.shape == (8, 8, 3)
    assert all(np.array_equal(out[..., c], arr) for c in range(3))


def test_palette_with_transparency_composites_on_white(tmp_path):
    im = Image.new("P", (4, 4), 0)
    im.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 * 3 - 6))
    im.putpixel((1, 1), 1)
    im.save(tmp_path / "p.png", transparency=0)
    out = np.asarray(load_image(tmp_path / "p.png"))
    assert tuple(out[0, 0]) == (255, 255, 255)  # transparent index -> white, not black
    assert tuple(out[1, 1]) == (255, 0, 0)


def test_palette_without_transparency(tmp_path):
    im = Image.new("P", (2, 2), 1)
    im.putpalette([0, 0, 0, 10, 200, 30] + [0] * (256 * 3 - 6))
    im.save(tmp_path / "p.gif")
    assert tuple(np.asarray(load_image(tmp_path / "p.gif"))[0, 0]) == (10, 200, 30)


def test_rgba_and_la_composite_on_white(tmp_path):
    im = Image.new("RGBA", (3, 1))
    im.putdata([(255, 0, 0, 0), (0, 0, 255, 255), (0, 0, 0, 128)])
    im.save(tmp_path / "a.png")
    out = np.asarray(load_image(tmp_path / "a.png")).astype(int)
    assert tuple(out[0, 0]) == (255, 255, 255)
    assert tuple(out[0, 1]) == (0, 0, 255)
    assert np.all(np.abs(out[0, 2] - 127) <= 1)  # half-transparent black over white is mid grey
    Image.new("LA", (2, 2), (0, 0)).save(tmp_path / "la.png")
    assert tuple(np.asarray(load_image(tmp_path / "la.png"))[0, 0]) == (255, 255, 255)


def test_cmyk_jpeg(tmp_path):
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=95)
    out = np.asarray(load_image(tmp_path / "c.jpg")).astype(int)
    assert out.shape == (16, 16, 3)
    r, g, b = out[8, 8]
    assert r > 220 and g < 40 and b < 40  # cyan=0, magenta=yellow=full is red


def test_16_bit_png_is_scaled_not_clipped(tmp_path):
    arr = np.array([[0, 257 * 100, 65535, 1000]], dtype=np.uint16)
    Image.fromarray(arr).save(tmp_path / "d.png")
    assert Image.open(tmp_path / "d.png").mode.startswith("I")
    out = np.asarray(load_image(tmp_path / "d.png"))
    assert out.dtype == np.uint8
    assert out[0, :, 0].tolist() == [0, 100, 255, 4]  # 1000 / 257 = 3.9 -> 4, not clipped to 255


def test_32_bit_int_image_is_scaled(tmp_path):
    # Beyond 16 bits the range is unknown, so it is min-max scaled rather than clipped.
    Image.fromarray(np.array([[-100000, 0, 100000]], dtype=np.int32), mode="I").save(tmp_path / "i.tif")
    out = np.asarray(load_image(tmp_path / "i.tif"))[0, :, 0]
    assert out[0] == 0 and out[2] == 255 and out[1] in (127, 128)


def test_one_bit_image(tmp_path):
    im = Image.new("1", (4, 2), 0)
    im.putpixel((3, 1), 1)
    im.save(tmp_path / "b.png")
    out = np.asarray(load_image(tmp_path / "b.png"))
    assert tuple(out[0, 0]) == (0, 0, 0) and tuple(out[1, 3]) == (255, 255, 255)


def test_one_by_one(tmp_path):
    Image.new("RGB", (1, 1), (1, 2, 3)).save(tmp_path / "one.png")
    im = load_image(tmp_path / "one.png")
    assert im.size == (1, 1) and im.getpixel((0, 0)) == (1, 2, 3)


def test_exif_orientation_is_applied(tmp_path):
    im = Image.new("RGB", (40, 20), (255, 0, 0))
    im.paste((0, 0, 255), (20, 0, 40, 20))  # left red, right blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    im.save(tmp_path / "r.jpg", exif=exif.tobytes(), quality=95)
    out = load_image(tmp_path / "r.jpg")
    assert out.size == (20, 40)  # width and height swapped
    top, bottom = np.asarray(out)[5, 10].astype(int), np.asarray(out)[35, 10].astype(int)
    assert top[0] > 200 and top[2] < 60  # the left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 60


def test_result_is_detached_from_the_file(tmp_path):
    path = tmp_path / "x.png"
    Image.new("RGB", (5, 5), (9, 9, 9)).save(path)
    im = load_image(path)
    path.unlink()
    assert im.getpixel((4, 4)) == (9, 9, 9)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: None, "file not found"),
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.write_text("this is not an image, just text\n" * 10), "not a recognised image format"),
        (lambda p: p.mkdir(), "not a regular file"),
    ],
    ids=["missing", "zero-byte", "text-named-jpg", "directory"],
)
def test_bad_files_raise_image_load_error_naming_the_file(tmp_path, make, reason):
    path = tmp_path / "bad.jpg"
    make(path)
    with pytest.raises(ImageLoadError) as info:
        load_image(path)
    assert str(path) in str(info.value) and reason in str(info.value)
    assert isinstance(info.value, ValueError)


def test_truncated_jpeg(tmp_path):
    arr = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    full = tmp_path / "full.jpg"
    Image.fromarray(arr).save(full, quality=90)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(ImageLoadError, match="cut.jpg.*(truncated|corrupt)"):
        load_image(cut)


def test_decompression_bomb_header_errors_fast(tmp_path):
    path = _png_with_declared_size(tmp_path / "bomb.png", 100_000, 100_000)
    assert path.stat().st_size < 200
    start = time.perf_counter()
    with pytest.raises(ImageLoadError, match="bomb.png.*(too many pixels|decompression bomb)"):
        load_image(path)
    assert time.perf_counter() - start < 1.0


def test_max_pixels_is_checked_before_decoding(tmp_path):
    # 3000x3000 is under PIL's own limit, so only our header check can refuse it; the file holds one pixel's
    # data, so reaching the decoder would raise "truncated" instead.
    path = _png_with_declared_size(tmp_path / "big.png", 3000, 3000)
    with pytest.raises(ImageLoadError, match="too many pixels"):
        load_image(path, max_pixels=1_000_000)
    Image.new("RGB", (100, 100)).save(tmp_path / "ok.png")
    assert load_image(tmp_path / "ok.png").size == (100, 100)
    with pytest.raises(ImageLoadError, match="too many pixels"):
        load_image(tmp_path / "ok.png", max_pixels=5000)


def test_pil_bomb_warning_is_an_error(tmp_path):
    # 1e8 pixels: above PIL's 89M warning limit, below its 2x error limit and below our max_pixels.
    path = _png_with_declared_size(tmp_path / "warn.png", 10_000, 10_000)
    with pytest.raises(ImageLoadError, match="decompression bomb"):
        load_image(path, max_pixels=200_000_000)


def _fine_detail(size=64):
    """One-pixel stripes of saturated colours over noise: the detail JPEG's 8x8 DCT blurs and its chroma
    subsampling smears."""
    rng = np.random.default_rng(3)
    arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    arr[::2, :, 0], arr[1::2, :, 1] = 255, 0
    return Image.fromarray(arr)


def test_reencode_jpeg_loses_fine_detail_more_at_low_quality():
    from captioner.data.images import reencode_jpeg

    original = _fine_detail()
    pixels = np.asarray(original, dtype=np.float64)
    errors = {}
    for quality in (10, 75, 95):
        out = reencode_jpeg(original, quality)
        assert out.mode == "RGB" and out.size == original.size
        errors[quality] = np.abs(np.asarray(out, dtype=np.float64) - pixels).mean()
    assert errors[95] > 1.0  # even the best quality does not give the pixels back
    assert errors[10] > errors[75] > errors[95]
    assert np.array_equal(np.asarray(reencode_jpeg(original, 75)), np.asarray(reencode_jpeg(original, 75)))
    assert np.array_equal(np.asarray(original), np.asarray(_fine_detail()))  # the input is left alone


@pytest.mark.parametrize("quality", [0, 96, 101, -5, 7.5, "75", True])
def test_jpeg_quality_outside_1_to_95_is_refused_by_name(quality):
    from captioner.data.images import check_jpeg_quality, reencode_jpeg

    with pytest.raises(ValueError, match=rf"1\.\.95, got {re.escape(repr(quality))}"):
        check_jpeg_quality(quality)
    with pytest.raises(ValueError, match="JPEG quality"):
        reencode_jpeg(_fine_detail(8), quality)
    assert check_jpeg_quality(1) == 1 and check_jpeg_quality(95) == 95


def _whole_image_reference(im: Image.Image) -> np.ndarray:
    """The conversion as it was written before strips (whole-image int64 / float64 arrays): the expected
    result of the strip-by-strip one."""
    if im.mode == "F":
        a = np.nan_to_num(np.asarray(im, dtype=np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        if a.min() >= 0.0 and a.max() <= 1.0:
            a = a * 255.0
    else:
        a = np.asarray(im, dtype=np.int64)
        if a.min() < 0 or a.max() > 65535:
            lo, hi = int(a.min()), int(a.max())
            a = (a - lo) * 255.0 / max(hi - lo, 1)
        else:
            a = a / 257.0
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("kind", ["uint16", "int32-wide", "float-unit", "float-wide"])
def test_wide_samples_convert_strip_by_strip_as_the_whole_image_would(kind, monkeypatch):
    from captioner.data import images

    rng = np.random.default_rng(len(kind))
    if kind == "uint16":
        im = Image.fromarray(rng.integers(0, 65536, (37, 23), dtype=np.uint16))  # I;16
    elif kind == "int32-wide":
        im = Image.fromarray(rng.integers(-70000, 300000, (37, 23)).astype(np.int32), mode="I")
    else:
        a = rng.random((37, 23), dtype=np.float32) * (1.0 if kind == "float-unit" else 900.0)
        a[3, 4], a[5, 6] = np.nan, np.inf
        im = Image.fromarray(a, mode="F")
    monkeypatch.setattr(images, "_STRIP_PIXELS", 23 * 5)  # 5 rows a strip: 8 strips, the last one short
    out = np.asarray(images._to_rgb(im))
    assert out.shape == (37, 23, 3) and (out[..., 0] == out[..., 2]).all()
    np.testing.assert_array_equal(out[..., 0], _whole_image_reference(im))


def _peak_rss_growth_mb(path: Path) -> float:
    """Peak resident memory (MB) that loading ``path`` adds, measured in a fresh process (Linux's VmHWM, the
    high-water mark, against VmRSS before)."""
    code = ("import re, sys\n"
            "from captioner.data.images import load_image\n"
            "def status(key):\n"
            "    return int(re.search(key + r':\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)) / 1024\n"
            "before = status('VmRSS')\n"
            "load_image(sys.argv[1])\n"
            "print(status('VmHWM') - before)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc/self/status")
def test_a_16_bit_image_costs_no_whole_image_wide_copies(tmp_path):
    """int64 and float64 copies of a whole 16-bit image would cost about 30 bytes per pixel of peak memory
    (the issue's 9400x9400 PNG of 172 kB: 2.36 GB). Decoded (2 bytes a pixel), converted to 8 bits (1) and to
    RGB (3), the image needs well under 12."""
    side = 3000
    path = tmp_path / "wide.png"
    path.write_bytes(giant_16bit_png(side, side))
    assert path.stat().st_size < 200_000
    growth = _peak_rss_growth_mb(path)
    assert growth < 12 * side * side / 2**20, f"{growth:.0f} MB for {side}x{side} 16-bit pixels"
