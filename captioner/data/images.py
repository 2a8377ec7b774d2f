"""The one safe image loader: any file a user points at -> an RGB PIL image, or a clear ImageLoadError.

Every image that reaches the encoder (Xu et al. 2015, Sec. 3.1.1: the CNN sees an RGB image and yields the
annotation vectors a_i) passes through ``load_image``. It
- refuses decompression bombs from the header, before a single pixel is decoded (PIL's ``open`` is lazy);
- decodes fully inside the ``try`` so a truncated file fails here, not later inside a DataLoader worker;
- applies the EXIF orientation, since phones store portraits as rotated landscapes;
- maps every mode to 8-bit RGB: transparency is composited over white, 16-bit data is rescaled (PIL's own
  ``convert`` clips 16-bit values to 255, which turns most of such an image white).

``load_image_bytes`` does the same for bytes held in memory (``captioner serve``'s uploads never touch the disk).
``reencode_jpeg`` is the in-memory JPEG round trip of an image it loaded (``captioner evaluate --jpeg-quality``:
are the captions steady when the same photograph arrives recompressed?).
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own default limit (~ 0.25 GB at 3 bytes per pixel)
# Pillow's useful JPEG qualities: above 95 its encoder mostly grows the file (its documentation says to avoid it).
JPEG_QUALITIES = range(1, 96)
T = TypeVar("T")  # what a caller reads from an opened image

# Modes with an alpha channel (or a palette that may carry one) are composited over white: a transparent
# background most often means "no background", and black (what a plain drop of alpha gives) is rarely meant.
_ALPHA_MODES = {"RGBA", "LA", "La", "RGBa", "PA"}
_WIDE_INT_MODES = {"I", "I;16", "I;16L", "I;16B", "I;16N"}
_STRIP_PIXELS = 1 << 20  # wide samples are converted this many pixels at a time (8 MB as float64)


class ImageLoadError(ValueError):
    """An image file could not be loaded; ``str(err)`` names the file and the reason."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load image {self.path}: {reason}")


def load_image(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Load ``path`` as an 8-bit RGB image with its EXIF orientation applied.

    Args:
        path: the image file.
        max_pixels: refuse images whose header declares more than this many pixels (width * height). PIL's
            global ``Image.MAX_IMAGE_PIXELS`` guard also applies and is reported the same way.

    Raises:
        ImageLoadError: missing, empty, unreadable, not an image, truncated, corrupt or too large.
    """
    return _open_checked(Path(path), max_pixels, _full_decode)


def probe_image(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """The (width, height) of ``path`` from its header, after the checks ``load_image`` makes before decoding
    (a regular, non-empty file in a recognised image format, within ``max_pixels``); nothing is decoded, so a
    file truncated after its header passes here and fails in ``load_image``. Raises ImageLoadError."""
    return _open_checked(Path(path), max_pixels, lambda lazy: lazy.size)


def _open_checked(path: Path, max_pixels: int, read: Callable[[Image.Image], T]) -> T:
    """``read(image)`` on the lazily opened ``path`` once its header passed the checks; every failure is an
    ImageLoadError naming the file and the reason."""
    if not path.exists():
        raise ImageLoadError(path, "file not found")
    if not path.is_file():  # a directory or a FIFO would fail obscurely or block forever
        raise ImageLoadError(path, "not a regular file")
    if path.stat().st_size == 0:
        raise ImageLoadError(path, "empty file (0 bytes)")
    return _decode(path, path, max_pixels, read)


def _full_decode(lazy: Image.Image) -> Image.Image:
    lazy.load()  # full decode now, so truncation and corruption surface here
    return _to_rgb(_apply_exif_orientation(lazy))


def load_image_bytes(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """``load_image`` for bytes held in memory (an upload): nothing is written to disk; errors name ``name``."""
    if not data:
        raise ImageLoadError(name, "empty file (0 bytes)")
    return _decode(io.BytesIO(data), name, max_pixels, _full_decode)


def _decode(source: Path | io.BytesIO, name: str | Path, max_pixels: int, read: Callable[[Image.Image], T]) -> T:
    """Header checks, then ``read(image)`` on the lazily opened image (a full decode to RGB, or only its size),
    with every failure an ImageLoadError naming ``name``."""
    try:
        with warnings.catch_warnings():
            # PIL only *warns* between 1x and 2x its limit; a warning would let the bomb through.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as lazy:
                width, height = lazy.size  # from the header; nothing decoded yet
                if width <= 0 or height <= 0:
                    raise ImageLoadError(name, f"invalid size {width}x{height}")
                if width * height > max_pixels:
                    raise ImageLoadError(
                        name, f"too many pixels: {width}x{height} = {width * height} > max_pixels={max_pixels}"
                    )
                return read(lazy)
    except ImageLoadError:
        raise
    except FileNotFoundError as err:
        raise ImageLoadError(name, "file not found") from err
    except PermissionError as err:
        raise ImageLoadError(name, "permission denied") from err
    except UnidentifiedImageError as err:
        raise ImageLoadError(name, "not a recognised image format") from err
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageLoadError(name, f"decompression bomb refused ({err})") from err
    except MemoryError as err:
        raise ImageLoadError(name, "out of memory while decoding") from err
    except (OSError, SyntaxError, ValueError, TypeError, IndexError, EOFError, KeyError, struct.error) as err:
        # PIL reports truncated and corrupt data through any of these, depending on the plugin.
        raise ImageLoadError(name, f"corrupt or truncated image data ({type(err).__name__}: {err})") from err


def check_jpeg_quality(quality: int) -> int:
    """``quality`` when it is an int in JPEG_QUALITIES (1..95), else a ValueError naming it."""
    if isinstance(quality, bool) or not isinstance(quality, int) or quality not in JPEG_QUALITIES:
        raise ValueError(f"JPEG quality must be an int in {JPEG_QUALITIES.start}..{JPEG_QUALITIES.stop - 1}, "
                         f"got {quality!r}")
    return quality


def reencode_jpeg(image: Image.Image, quality: int) -> Image.Image:
    """``image`` (RGB) saved as a JPEG of ``quality`` (1..95) in memory and decoded again: an RGB image of the
    same size carrying the codec's losses (blocking, blurred fine detail, shifted colours)."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=check_jpeg_quality(quality))
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return decoded.convert("RGB")  # decodes now: the buffer goes with this function


def _apply_exif_orientation(im: Image.Image) -> Image.Image:
    try:
        rotated = ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001 - a broken EXIF block must not make good pixels unreadable
        return im
    return im if rotated is None else rotated


def _wide_strips(im: Image.Image) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, samples) of ``im`` a few rows at a time (about _STRIP_PIXELS each), as numpy arrays."""
    width, height = im.size
    rows = max(1, _STRIP_PIXELS // max(width, 1))
    for top in range(0, height, rows):
        yield top, np.asarray(im.crop((0, top, width, min(height, top + rows))))


def _wide_to_l(im: Image.Image) -> Image.Image:
    """16/32-bit integer or float samples -> 8-bit L, strip by strip: the int64 / float64 arithmetic never holds
    more than a strip (a 9400x9400 16-bit PNG of 172 kB would cost 2.4 GB as whole-image copies).

    Integers: 16-bit samples map onto 0..255 as v / 257 (65535 / 257 = 255, no clipping); values outside
    16 bits (rare 32-bit TIFFs) are min-max scaled. Floats: NaN -> 0, +-inf -> 255 / 0, and [0, 1] images
    are scaled by 255 (the usual convention). Both rounded half to even, as np.rint."""
    is_float = im.mode == "F"
    lo, hi = math.inf, -math.inf
    for _, strip in _wide_strips(im):  # the range decides the mapping: a first pass over the strips
        if strip.size:
            strip = np.nan_to_num(strip.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0) if is_float else strip
            lo, hi = min(lo, strip.min().item()), max(hi, strip.max().item())
    out = np.empty((im.height, im.width), dtype=np.uint8)  # (H, W)
    for top, strip in _wide_strips(im):
        if is_float:
            a = np.nan_to_num(strip.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
            if 0.0 <= lo and hi <= 1.0:
                a = a * 255.0
        elif lo < 0 or hi > 65535:
            a = (strip.astype(np.int64) - lo) * 255.0 / max(hi - lo, 1)
        else:
            a = strip / 257.0
        out[top : top + strip.shape[0]] = np.clip(np.rint(a), 0, 255).astype(np.uint8)
    return Image.fromarray(out, mode="L")


def _to_rgb(im: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB (a new image, detached from the file)."""
    mode = im.mode
    if mode == "RGB":
        return im.copy()
    if mode in _WIDE_INT_MODES or mode == "F":
        return _wide_to_l(im).convert("RGB")
    if mode == "P" and "transparency" in im.info:
        mode = "PA"
    if mode in _ALPHA_MODES:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    # L, 1, P, CMYK, YCbCr, LAB, HSV, I;16 variants PIL converts itself...
    return im.convert("RGB")
