"""The demo page of `captioner serve` (captioner/commands/serve.py): it captions an uploaded photo and shows
where each word looked.

A person drops a photo on the page; the server decodes it with beam search (Xu et al. 2015, Sec. 4.3 and 5.2)
and answers with the caption, the beam's n-best list with its scores, and one overlay per word: the word's
attention alpha_t (Eq. (4)-(5)) over the image, as in the paper's Fig. 2-3. For hard attention decoded in
the "argmax" or "sample" mode, the cell the decoder read (s_t, Sec. 4.1) is outlined in white.

The page is one static HTML document with inline style and JavaScript, ``serve_page.html`` beside this
module (no CDN, no external asset: it works offline). The server is FastAPI + uvicorn, an optional extra
(``pip install 'captioner[serve]'``); ``create_app`` builds it around an already loaded captioner, so tests
drive it with FastAPI's TestClient and any model. Decoding is CPU-bound, so captions take turns on one lock.

Strangers' bytes reach this server, so it bounds every request before it costs memory, disk or CPU
(captioner/serving/limits.py; the list with each limit and its flag is docs/robustness.md): a Host check
against DNS rebinding and an optional token, a small number of uploads in flight and waiting (503 with
Retry-After beyond), the upload size enforced as the body streams in (413; uploads never touch the disk),
and the pixel count checked from the image header before decoding (400).
"""

import base64
import contextlib
import html
import io
import threading
import time
from typing import Any, Iterator, Sequence

from captioner.decoding.options import DecodeOptions
from captioner.serving.limits import (
    LOOPBACK_HOSTS,
    MAX_IN_FLIGHT,
    MAX_PIXELS,
    MAX_QUEUE,
    MAX_UPLOAD_BYTES,
    AdmissionGate,
    Refusal,
    RequestGuard,
    read_multipart_upload,
)

SERVE_PACKAGES = ("fastapi", "uvicorn", "multipart")  # python-multipart imports as `multipart`
INSTALL_HINT = "pip install 'captioner[serve]'"
OVERLAY_OPACITY = 0.5
OVERLAY_MAX_SIDE = 384  # pixels: the page shows overlays at this size, and smaller PNGs travel faster
PAGE_FILE = "serve_page.html"  # beside this module: the page, its style and its script in one file


class MissingServePackages(RuntimeError):
    """FastAPI, uvicorn or python-multipart is not installed; ``str(err)`` says what to install."""


class UploadError(ValueError):
    """An upload that cannot be captioned (empty, too many pixels, not an image); answered with HTTP 400."""


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


def read_upload(data: bytes, filename: str, max_pixels: int = MAX_PIXELS) -> Any:
    """Uploaded bytes -> RGB PIL image through the project's one safe loader, decoded in memory, or an
    UploadError naming ``filename`` and the reason. The header's pixel count is checked against ``max_pixels``
    before a pixel is decoded; a truncated or non-image file fails with its reason."""
    from captioner.data.images import ImageLoadError, load_image_bytes

    try:
        return load_image_bytes(data, filename, max_pixels=max_pixels)
    except ImageLoadError as err:
        if not data:
            raise UploadError(f"{filename!r} is empty (0 bytes)") from None
        raise UploadError(f"cannot read {filename!r} as an image: {err.reason}") from None


def caption_image(model: Any, image: Any, options: DecodeOptions | None = None) -> dict:
    """Caption one PIL image for the page, decoded with ``options`` (default: ``page_options(model)``): the
    caption, the n-best list and one overlay data URL per word.

    Each n-best entry has ``score`` (sum of log-probabilities, <end> included when the caption ended) and
    ``norm_score`` (score / length ** length_penalty, the number beam search ranks by; length counts <end>).
    ``cells`` is the (row, column) read per word by hard attention in "argmax"/"sample" mode, else None.
    """
    from captioner.decoding.search import normalise_score
    from captioner.visualize import overlay_frames

    options = page_options(model) if options is None else options  # generate checks them against the model
    start = time.perf_counter()
    (out,) = model.caption([image], options)
    decode_s = time.perf_counter() - start
    max_length, penalty = options.max_length, options.length_penalty

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
        "beam": options.beam,
        "length_penalty": penalty,
        "decode_s": round(decode_s, 3),
        "total_s": round(time.perf_counter() - start, 3),
    }


def page_options(model: Any, **settings: Any) -> DecodeOptions:
    """The page's decoding: ``model.caption_options`` (the model's config's, ``for_people``: <unk> forbidden, as in
    every caption for people), then ``settings`` (DecodeOptions fields by name: `captioner serve`'s flags, merged
    here once); every hypothesis of the beam is listed unless ``n_best`` is given."""
    options = model.caption_options.replace_given(**settings)
    return options if "n_best" in settings else options.replace_given(n_best=options.beam)


def create_app(
    model: Any,
    options: DecodeOptions | None = None,
    model_label: str = "",
    max_upload_bytes: int = MAX_UPLOAD_BYTES,
    max_pixels: int = MAX_PIXELS,
    max_in_flight: int = MAX_IN_FLIGHT,
    max_queue: int = MAX_QUEUE,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    token: str | None = None,
) -> Any:
    """The FastAPI app of the demo page around a loaded captioner.

    Args:
        model: what ``load_captioner(...)`` returns (its ``caption`` and ``caption_options``), in eval mode.
        options: how every upload is decoded (``page_options``: default the model's config, <unk> forbidden,
            every beam hypothesis listed).
        model_label: what the page says it is running (a checkpoint path, a shipped model's name).
        max_upload_bytes: larger uploads are refused with HTTP 413 while they stream in.
        max_pixels: images whose header declares more pixels are refused with HTTP 400, undecoded.
        max_in_flight: uploads decoded and captioned at once.
        max_queue: uploads waiting for a slot; beyond them the answer is 503 with Retry-After.
        allowed_hosts: Host header names answered (others: HTTP 400, against DNS rebinding).
        token: when given, every request must carry it (HTTP 401 otherwise); see serve_limits.RequestGuard.
    Routes: ``GET /`` the page, ``POST /api/caption`` (multipart field ``image``) the JSON of
    ``caption_image``, ``GET /api/info`` the settings. ``app.state.gate`` is the AdmissionGate.
    """
    require_serve_packages()
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    options = model.check_decode_options(page_options(model) if options is None else options)
    from captioner import visualize  # noqa: F401  (matplotlib's import, seconds, is paid here, not by the first photo)

    model.eval()
    lock = threading.Lock()  # one caption at a time: each already uses every core
    gate = AdmissionGate(max_in_flight, max_queue)
    info = {
        "model": model_label or type(model).__name__,
        "attention": model.attention_kind,
        "attention_mode": options.attention_mode,
        "grid_hw": list(model.grid_hw),
        "beam": options.beam,
        "n_best": options.n_best,
        "length_penalty": options.length_penalty,
        "forbid_unk": options.forbid_unk,
    }
    page = render_page(info)
    app = FastAPI(title="captioner demo", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gate = gate

    def caption_upload(data: bytes, filename: str) -> dict:  # in a worker thread, inside a gate slot
        pil = read_upload(data, filename, max_pixels)
        with lock:
            return caption_image(model, pil, options)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/info")
    def get_info() -> dict:
        return info

    app.post("/api/caption")(_caption_route(gate, caption_upload, max_upload_bytes))
    app.add_middleware(RequestGuard, allowed_hosts=allowed_hosts, token=token)  # every route, the page included
    return app


def _caption_route(gate: AdmissionGate, caption_upload: Any, max_upload_bytes: int) -> Any:
    """``POST /api/caption``: admission (503 before the body is read), the body under its limit (413), then
    decode and caption in a worker thread inside a gate slot (the event loop never blocks)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    def refuse(status: int, detail: str, headers: dict[str, str] | None = None) -> Any:
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    async def post_caption(request: Request) -> Any:
        try:
            gate.admit()
        except Refusal as err:
            return refuse(err.status, err.detail, err.headers)
        try:
            filename, data = await read_multipart_upload(dict(request.headers), request.stream(), max_upload_bytes)
            async with gate.slot():
                result = await run_in_threadpool(caption_upload, data, filename)
        except Refusal as err:
            return refuse(err.status, err.detail, err.headers)
        except UploadError as err:
            return refuse(400, str(err))
        finally:
            gate.leave()
        return {"filename": filename, **result}

    return post_caption


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
    page = files("captioner.serving").joinpath(PAGE_FILE).read_text(encoding="utf-8")
    return page.replace("{{MODEL}}", html.escape(str(info["model"]))).replace("{{SETTINGS}}", html.escape(settings))
