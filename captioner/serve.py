"""`captioner serve`: a local demo page that captions an uploaded photo and shows where each word looked.

A person drops a photo on the page; the server decodes it with beam search (Xu et al. 2015, Sec. 4.3 and 5.2)
and answers with the caption, the beam's n-best list with its scores, and one overlay per word: the word's
attention alpha_t (Eq. (4)-(5)) over the image, as in the paper's Fig. 2-3. For hard attention decoded in
the "argmax" or "sample" mode, the cell the decoder read (s_t, Sec. 4.1) is outlined in white.

The page is one static HTML document with inline style and JavaScript, ``serve_page.html`` beside this
module (no CDN, no external asset: it works offline). The server is FastAPI + uvicorn, an optional extra
(``pip install 'captioner[serve]'``); ``create_app`` builds it around an already loaded captioner, so tests
drive it with FastAPI's TestClient and any model. Decoding is CPU-bound, so requests take turns on one lock.
"""

import argparse
import base64
import contextlib
import html
import io
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

SERVE_PACKAGES = ("fastapi", "uvicorn", "multipart")  # python-multipart imports as `multipart`
INSTALL_HINT = "pip install 'captioner[serve]'"
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
OVERLAY_OPACITY = 0.5
OVERLAY_MAX_SIDE = 384  # pixels: the page shows overlays at this size, and smaller PNGs travel faster
PAGE_FILE = "serve_page.html"  # beside this module: the page, its style and its script in one file


class MissingServePackages(RuntimeError):
    """FastAPI, uvicorn or python-multipart is not installed; ``str(err)`` says what to install."""


class UploadError(ValueError):
    """An upload that cannot be captioned (empty, too large, not an image); answered with HTTP 400."""


def require_serve_packages() -> None:
    """Raise MissingServePackages naming the missing packages and the extra that installs them."""
    import importlib.util

    missing = [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        names = ", ".join("python-multipart" if m == "multipart" else m for m in missing)
        raise MissingServePackages(f"captioner serve needs {names}: {INSTALL_HINT}")


def display_image(image: Any, transform: Any, max_side: int = OVERLAY_MAX_SIDE) -> Any:
    """The part of ``image`` the encoder saw (its centre square when the transform crops), at most
    ``max_side`` pixels on its longer side."""
    from PIL import Image

    img = image.convert("RGB")
    if getattr(transform, "crop", False):
        side = min(img.size)
        left, top = (img.width - side) // 2, (img.height - side) // 2
        img = img.crop((left, top, left + side, top + side))
    scale = min(1.0, max_side / max(img.size))
    if scale < 1.0:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                         Image.Resampling.BICUBIC)
    return img


def png_data_url(image: Any) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URL, for an <img> src."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # 4x faster than the default level, 15 % larger
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def read_upload(data: bytes, filename: str, max_bytes: int = MAX_UPLOAD_BYTES) -> Any:
    """Uploaded bytes -> RGB PIL image through the project's one safe loader, or an UploadError naming
    ``filename`` and the reason."""
    from captioner.data.images import ImageLoadError, load_image

    if not data:
        raise UploadError(f"{filename!r} is empty (0 bytes)")
    if len(data) > max_bytes:
        raise UploadError(f"{filename!r} is larger than the {max_bytes // (1024 * 1024)} MiB this page accepts")
    # load_image reads paths: it checks the header before decoding and decodes fully, so a bomb, a truncated
    # or a non-image file fails here with its reason
    with tempfile.TemporaryDirectory(prefix="captioner-serve-") as tmp:
        path = Path(tmp) / ("upload" + Path(filename).suffix.lower()[:10])
        path.write_bytes(data)
        try:
            return load_image(path)
        except ImageLoadError as err:
            raise UploadError(f"cannot read {filename!r} as an image: {err.reason}") from None


def caption_image(
    model: Any,
    image: Any,
    beam: int = 3,
    n_best: int | None = None,
    attention_mode: str | None = None,
    forbid_unk: bool = True,
) -> dict:
    """Caption one PIL image for the page: the caption, the n-best list and one overlay data URL per word.

    Each n-best entry has ``score`` (sum of log-probabilities, <end> included when the caption ended) and
    ``norm_score`` (score / length ** length_penalty, the number beam search ranks by; length counts <end>).
    ``cells`` is the (row, column) read per word by hard attention in "argmax"/"sample" mode, else None.
    """
    from captioner.search import normalise_score
    from captioner.visualize import overlay_frames

    n_best = beam if n_best is None else n_best
    start = time.perf_counter()
    (out,) = model.caption([image], beam=beam, n_best=n_best, attention_mode=attention_mode, forbid_unk=forbid_unk)
    decode_s = time.perf_counter() - start
    max_length, penalty = model.max_length, model.length_penalty

    def ranked(hyp: dict) -> dict:
        # a caption with fewer than max_length words ended with <end>, which counts as a predicted token
        length = len(hyp["words"]) + (len(hyp["words"]) < max_length)
        return {**hyp, "norm_score": normalise_score(hyp["score"], length, penalty)}

    H, W = out["grid_hw"]
    locations = out["locations"]
    shown = display_image(image, model.transform)
    overlays = overlay_frames(shown, out["alphas"], (H, W), chosen=locations, opacity=OVERLAY_OPACITY)
    return {
        "caption": out["caption"],
        "words": out["words"],
        "score": out["score"],
        "n_best": [ranked(h) for h in out["n_best"]],
        "overlays": [png_data_url(frame) for frame in overlays],
        "image": png_data_url(shown),
        "grid_hw": [H, W],
        "attention_mode": out["attention_mode"],
        "cells": None if locations is None else [list(divmod(int(i), W)) for i in locations],
        "beam": beam,
        "length_penalty": penalty,
        "decode_s": round(decode_s, 3),
        "total_s": round(time.perf_counter() - start, 3),
    }


def create_app(
    model: Any,
    beam: int = 3,
    n_best: int | None = None,
    attention_mode: str | None = None,
    forbid_unk: bool = True,
    model_label: str = "",
    max_upload_bytes: int = MAX_UPLOAD_BYTES,
) -> Any:
    """The FastAPI app of the demo page around a loaded captioner.

    Args:
        model: a ``Captioner`` (``load_captioner(...)``), in eval mode.
        beam: beam width (1 = greedy).
        n_best: hypotheses listed per image (default: all ``beam``).
        attention_mode: hard attention's decoding mode (default: the model's); soft models ignore it.
        forbid_unk: never put <unk> in a caption.
        model_label: what the page says it is running (a checkpoint path, a shipped model's name).
        max_upload_bytes: larger uploads are refused with HTTP 400.
    Routes: ``GET /`` the page, ``POST /api/caption`` (multipart field ``image``) the JSON of
    ``caption_image``, ``GET /api/info`` the settings.
    """
    require_serve_packages()
    from fastapi import FastAPI, File, HTTPException, UploadFile
    from fastapi.responses import HTMLResponse

    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    n_best = beam if n_best is None else n_best
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be between 1 and beam={beam}, got {n_best}")
    from captioner import visualize  # noqa: F401  (matplotlib's import, seconds, is paid here, not by the first photo)

    model.eval()
    lock = threading.Lock()  # one decode at a time: each already uses every core
    info = {
        "model": model_label or type(model).__name__,
        "attention": model.attention_kind,
        "attention_mode": model.decode_mode(attention_mode),
        "grid_hw": list(model.grid_hw),
        "beam": beam,
        "n_best": n_best,
        "length_penalty": model.length_penalty,
        "forbid_unk": forbid_unk,
    }
    page = render_page(info)
    app = FastAPI(title="captioner demo", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/info")
    def get_info() -> dict:
        return info

    # a plain `def`: FastAPI runs it in a worker thread, so decoding never blocks the event loop
    @app.post("/api/caption")
    def post_caption(image: UploadFile | None = File(None)) -> dict:
        if image is None:
            raise HTTPException(status_code=400, detail="no image uploaded (send it as the multipart field 'image')")
        filename = image.filename or "upload"
        try:
            pil = read_upload(image.file.read(max_upload_bytes + 1), filename, max_upload_bytes)
        except UploadError as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        with lock:
            result = caption_image(model, pil, beam=beam, n_best=n_best, attention_mode=attention_mode,
                                   forbid_unk=forbid_unk)
        return {"filename": filename, **result}

    return app


@contextlib.contextmanager
def serve_in_background(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run ``app`` with uvicorn in a daemon thread for the duration of a ``with`` block; yields its URL.

    ``port=0`` takes a free port: the socket is bound here, before the thread starts, so the URL is
    right and nothing can take the port in between. For tests and scripts (a browser driving the page).
    """
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the demo server did not start on {host}:{sock.getsockname()[1]}")
            time.sleep(0.05)
        yield f"http://{host}:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def render_page(info: dict) -> str:
    """The page's HTML (``serve_page.html``) with the server's settings written into its header."""
    from importlib.resources import files

    mode = "" if info["attention"] != "hard" else f" ({info['attention_mode']} decoding)"
    settings = (f"{info['attention']} attention{mode}, {info['grid_hw'][0]}x{info['grid_hw'][1]} grid, "
                f"beam {info['beam']}, length penalty {info['length_penalty']:g}")
    page = files("captioner").joinpath(PAGE_FILE).read_text(encoding="utf-8")
    return page.replace("{{MODEL}}", html.escape(str(info["model"]))).replace("{{SETTINGS}}", html.escape(settings))




def main(argv: Sequence[str] | None = None) -> int:
    """`captioner serve`: the demo page on http://HOST:PORT/ (Ctrl-C stops it)."""
    from captioner.models.attention import HARD_DECODING_MODES

    parser = argparse.ArgumentParser(prog="captioner serve", description=main.__doc__)
    parser.add_argument("--checkpoint", "--model", dest="checkpoint", default=None,
                        help="checkpoint file, run directory, model folder, hub model id (owner/name) or shipped "
                             "model name (default: the shipped Flickr8k model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--beam", type=int, default=3, help="beam width (1 = greedy); the page lists every beam")
    parser.add_argument("--allow-unk", action="store_true",
                        help="let captions contain <unk> (by default the search never chooses it)")
    parser.add_argument("--attention-mode", choices=HARD_DECODING_MODES, default=None,
                        help="hard-attention decoding mode (default: the checkpoint's eval setting); "
                             "argmax and sample show the cell read per word")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error("--beam must be >= 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    try:
        require_serve_packages()
    except MissingServePackages as err:
        print(f"captioner serve: {err}", file=sys.stderr)
        return 2

    import uvicorn

    from captioner.api import load_captioner
    from captioner.checkpoint import CheckpointError

    try:
        model = load_captioner(args.checkpoint, device=args.device)  # None: the shipped model
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"captioner serve: {err}", file=sys.stderr)
        return 2
    shipped = getattr(model, "shipped_name", None)
    label = f"{shipped} (shipped)" if shipped else str(args.checkpoint)
    app = create_app(model, beam=args.beam, attention_mode=args.attention_mode, forbid_unk=not args.allow_unk,
                     model_label=label)
    print(f"captioner serve: http://{args.host}:{args.port}/ ({label}, beam {args.beam}); Ctrl-C stops it",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
