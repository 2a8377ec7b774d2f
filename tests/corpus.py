"""A corpus of awkward image files for reliability tests (reused by the CLI tests).

`make_bad_image_corpus(directory)` writes one file per failure mode that real image
folders contain (empty files, truncated downloads, HTML saved as .jpg, CMYK and 16-bit
scans, palette PNGs with transparency, phone photos stored rotated with an EXIF flag,
decompression bombs) and returns {name: path}. `EXPECTED` says, for every name, whether
`captioner.data.images.load_image` must return an RGB image (and of which size) or raise
`ImageLoadError` (and a regex its message must match).

Everything is generated at test time with PIL, a few hundred bytes each, no network.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

# name -> ("ok", (width, height)) | ("error", regex the ImageLoadError message matches)
EXPECTED: dict[str, tuple[str, object]] = {
    "zero_bytes.jpg": ("error", r"empty|0 bytes"),
    "truncated.jpg": ("error", r"truncat|corrupt"),
    "truncated.png": ("error", r"truncat|corrupt"),
    "text_named.jpg": ("error", r"not a recogni[sz]ed image|unidentified|format"),
    "html_named.png": ("error", r"not a recogni[sz]ed image|unidentified|format"),
    "bomb.png": ("error", r"too many pixels|decompression bomb"),
    "bomb_wide.gif": ("error", r"too many pixels|decompression bomb"),
    "cmyk.jpg": ("ok", (16, 12)),
    "sixteen_bit.png": ("ok", (10, 6)),
    "palette_transparent.png": ("ok", (8, 8)),
    "grayscale.png": ("ok", (9, 7)),
    "grayscale.jpg": ("ok", (9, 7)),
    "rgba.png": ("ok", (5, 5)),
    "one_pixel.png": ("ok", (1, 1)),
    "exif_rotated.jpg": ("ok", (12, 20)),  # stored 20x12 landscape, EXIF orientation 6 -> portrait
    "animated.gif": ("ok", (6, 6)),  # first frame
    "webp.webp": ("ok", (7, 5)),
    "uppercase_ext.JPG": ("ok", (8, 8)),
    "png_named.jpg": ("ok", (8, 8)),  # wrong extension, valid content: content wins
}


def _noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    # Noise compresses badly, so a cut at half the file lands inside the pixel data, not the header.
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _png_declaring(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR claims width x height (CRC fixed): a bomb header, ~70 bytes."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _gif_declaring(width: int, height: int) -> bytes:
    """A 1x1 GIF whose logical screen and image descriptor claim width x height."""
    buf = io.BytesIO()
    Image.new("P", (1, 1)).save(buf, format="GIF")
    data = bytearray(buf.getvalue())
    data[6:10] = struct.pack("<HH", width, height)  # logical screen descriptor
    at = data.index(b",")  # image descriptor: ',' left top width height
    data[at + 5 : at + 9] = struct.pack("<HH", width, height)
    return bytes(data)


def make_bad_image_corpus(directory: str | Path) -> dict[str, Path]:
    """Write every file named in EXPECTED into `directory` (created) and return {name: path}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in EXPECTED}

    paths["zero_bytes.jpg"].write_bytes(b"")

    buf = io.BytesIO()
    Image.fromarray(_noise(64, 64)).save(buf, format="JPEG", quality=95)
    paths["truncated.jpg"].write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    buf = io.BytesIO()
    Image.fromarray(_noise(64, 64, seed=1)).save(buf, format="PNG")
    paths["truncated.png"].write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])

    paths["text_named.jpg"].write_text("this is not an image\n" * 20)
    paths["html_named.png"].write_text("<!DOCTYPE html><html><body>403 Forbidden</body></html>\n")

    paths["bomb.png"].write_bytes(_png_declaring(100_000, 100_000))  # 10^10 pixels declared
    paths["bomb_wide.gif"].write_bytes(_gif_declaring(65_535, 65_535))

    Image.new("CMYK", (16, 12), (0, 255, 255, 0)).save(paths["cmyk.jpg"], quality=95)
    Image.fromarray(np.linspace(0, 65535, 60).astype(np.uint16).reshape(6, 10)).save(paths["sixteen_bit.png"])

    palette = Image.new("P", (8, 8), 0)
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 * 3 - 6))
    palette.putpixel((3, 3), 1)
    palette.save(paths["palette_transparent.png"], transparency=0)

    gray = Image.fromarray(np.arange(63, dtype=np.uint8).reshape(7, 9) * 4, mode="L")
    gray.save(paths["grayscale.png"])
    gray.save(paths["grayscale.jpg"])
    Image.new("RGBA", (5, 5), (0, 128, 255, 100)).save(paths["rgba.png"])
    Image.new("RGB", (1, 1), (1, 2, 3)).save(paths["one_pixel.png"])

    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    Image.fromarray(_noise(12, 20, seed=2)).save(paths["exif_rotated.jpg"], exif=exif, quality=95)

    frames = [Image.new("P", (6, 6), i) for i in range(3)]
    frames[0].save(paths["animated.gif"], save_all=True, append_images=frames[1:], duration=50)
    Image.new("RGB", (7, 5), (10, 20, 30)).save(paths["webp.webp"], format="WEBP")
    Image.new("RGB", (8, 8), (200, 100, 0)).save(paths["uppercase_ext.JPG"], format="JPEG")
    Image.new("RGB", (8, 8), (0, 100, 200)).save(paths["png_named.jpg"], format="PNG")
    return paths


@functools.lru_cache(maxsize=4)
def giant_16bit_png(width: int, height: int) -> bytes:
    """A real, fully decodable 16-bit grayscale PNG of width x height, every row the same left-to-right
    gradient: large in pixels, tiny on disk (PNG's filters make the rows' bytes constant, which zlib shrinks
    ~1000x; the review's 9400x9400 was 172 kB). Built through a streaming compressor, never holding the pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = np.frombuffer(np.linspace(0, 65535, width).astype(">u2").tobytes(), dtype=np.uint8)
    first = b"\x01" + np.concatenate([raw[:2], raw[2:] - raw[:-2]]).tobytes()  # filter "Sub": left differences
    same = b"\x02" + bytes(2 * width)  # filter "Up": equal to the row above
    squeeze = zlib.compressobj(6)
    pieces = [squeeze.compress(first)]
    rows_per_piece = max(1, (1 << 22) // len(same))
    for top in range(1, height, rows_per_piece):
        pieces.append(squeeze.compress(same * min(rows_per_piece, height - top)))
    pieces.append(squeeze.flush())
    header = struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0)  # 16-bit, grayscale, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(pieces)) + chunk(b"IEND", b"")
