"""What `captioner serve` refuses (captioner/serving/limits.py), one test per reproduction of issue 29:

- a 9400x9400 16-bit PNG of 172 kB (2.36 GB and 5.8 s a request to decode) is refused from its header (400);
- a body over the limit is answered 413 while it streams in, long before it has all arrived, and no upload is
  ever written to disk (no multipart body is spooled to a temporary file);
- a file name with a NUL byte is answered 200 (not 500), the name cleaned;
- a Host header that is not this server's (DNS rebinding) is refused, and --token is enforced;
- beyond the uploads in flight and waiting, the answer is 503 at once, with Retry-After.

The server runs in this process (serve_in_background, a real socket) with a small random model, so the
audit hook of tests/file_events.py sees every file it opens."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="captioner serve needs the 'serve' extra")
from corpus import giant_16bit_png  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from file_events import file_events  # noqa: E402
from upload_client import multipart, post  # noqa: E402

import captioner.commands.serve as serve_command  # noqa: E402
import captioner.serving.server as serve  # noqa: E402
from captioner.api import build_model  # noqa: E402
from captioner.config import load_config  # noqa: E402
from captioner.data.vocab import Vocab  # noqa: E402
from captioner.serving.limits import clean_filename, host_name  # noqa: E402

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


@pytest.fixture(scope="module")
def model():
    from captioner.fast import kernels

    kernels.available()  # a first build of the kernels writes files: not while uploads are watched
    torch.manual_seed(0)
    vocab = Vocab.build([["a", "red", "circle"], ["a", "blue", "square", "above"]])
    return build_model(load_config(SMOKE), vocab).eval()


@pytest.fixture(scope="module")
def photo() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def test_a_16_bit_giant_is_refused_from_its_header(model):
    data = giant_16bit_png(9400, 9400)
    assert len(data) < 250_000  # the review's file was 172 kB
    with serve.serve_in_background(serve.create_app(model, serve.page_options(model, beam=1))) as url:
        body, ctype = multipart("giant.png", data)
        answer = post(_port(url), body, ctype)
    assert answer.status == 400, answer
    detail = answer.json()["detail"]
    assert "'giant.png'" in detail and "too many pixels: 9400x9400" in detail and "max_pixels=40000000" in detail
    assert answer.seconds < 10  # no decode: a header read (decoding takes 5.8 s of CPU and 2.36 GB)


def test_an_oversized_body_is_413_while_it_streams_and_nothing_reaches_disk(model, photo):
    limit, size = 1 << 20, 64 << 20
    app = serve.create_app(model, serve.page_options(model, beam=1), max_upload_bytes=limit)
    head, ctype = multipart("big.bin", b"")
    tail = head[head.index(b"\r\n--captionerboundary--"):]
    head = head[: len(head) - len(tail)]

    def pieces():  # a 64 MiB upload, made as it is sent
        yield head
        zeros = bytes(65536)
        for _ in range(size // len(zeros)):
            yield zeros
        yield tail

    with serve.serve_in_background(app) as url, file_events() as events:
        streamed = post(_port(url), pieces(), ctype)  # chunked: no length declared
        declared = post(_port(url), pieces(), ctype, content_length=len(head) + size + len(tail))
        good_body, _ = multipart("small.png", photo)
        good = post(_port(url), good_body, ctype)
    assert streamed.status == 413 and "larger than the 1 MiB" in streamed.json()["detail"]
    # the answer came long before the body was sent (what it had sent fits in the sockets' buffers)
    assert streamed.sent < size // 2, f"the server waited for {streamed.sent} bytes of a 64 MiB body"
    assert declared.status == 413 and "Content-Length" in declared.json()["detail"]
    assert declared.sent < size // 2
    assert good.status == 200, good
    written = [path for kind, path in events if kind == "write"]
    assert written == [], f"the server wrote files while receiving uploads: {written}"


def test_a_nul_byte_in_the_file_name_is_cleaned_not_a_500(model, photo):
    client = TestClient(serve.create_app(model, serve.page_options(model, beam=1)), base_url="http://127.0.0.1")
    for raw, shown in [("x.\x00", "x."), ("../../etc/passwd\x07.png", "passwd.png"), ("\x00", "upload")]:
        body, ctype = multipart(raw, photo)
        response = client.post("/api/caption", content=body, headers={"content-type": ctype})
        assert response.status_code == 200, (raw, response.text)
        assert response.json()["filename"] == shown


def test_clean_filename_and_host_name():
    assert clean_filename("C:\\photos\\cat.JPG") == "cat.JPG"
    long = clean_filename("a" * 500 + ".jpeg")
    assert len(long) <= 100 and long.endswith("....jpeg")
    assert clean_filename(None) == "upload" and clean_filename("\r\n\t") == "upload"
    assert [host_name(h) for h in ("LocalHost:7860", "[::1]:80", "127.0.0.1", "example.com.", None)] == [
        "localhost", "::1", "127.0.0.1", "example.com", ""]


def test_host_header_is_checked_against_dns_rebinding(model):
    app = serve.create_app(model, serve.page_options(model, beam=1))
    for base in ("http://127.0.0.1:7860", "http://localhost"):
        assert TestClient(app, base_url=base).get("/api/info").status_code == 200
    refused = TestClient(app, base_url="http://attacker.example:7860").get("/")
    assert refused.status_code == 400 and "'attacker.example'" in refused.json()["detail"]
    assert "--allow-host" in refused.json()["detail"]
    allowed = serve.create_app(model, serve.page_options(model, beam=1), allowed_hosts=["127.0.0.1", "lab-box"])
    assert TestClient(allowed, base_url="http://lab-box:7860").get("/").status_code == 200


def test_token_is_required_when_set_and_the_page_link_sets_a_cookie(model, photo):
    app = serve.create_app(model, serve.page_options(model, beam=1), token="s3cret")
    client = TestClient(app, base_url="http://127.0.0.1")
    assert client.get("/").status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    body, ctype = multipart("p.png", photo)
    assert client.post("/api/caption", content=body, headers={"content-type": ctype}).status_code == 401
    page = client.get("/?token=s3cret")  # the address `captioner serve --token` prints
    assert page.status_code == 200 and "SameSite=Strict" in page.headers["set-cookie"]
    assert client.post("/api/caption", content=body, headers={"content-type": ctype}).status_code == 200  # cookie
    other = TestClient(app, base_url="http://127.0.0.1")
    assert other.get("/api/info", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_beyond_the_queue_the_answer_is_503_at_once_with_retry_after(model, photo, monkeypatch):
    release, started = threading.Event(), threading.Event()
    real = serve.caption_image

    def slow_caption(*args, **kwargs):
        started.set()
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(serve, "caption_image", slow_caption)
    app = serve.create_app(model, serve.page_options(model, beam=1), max_in_flight=1, max_queue=1)
    body, ctype = multipart("p.png", photo)
    with serve.serve_in_background(app) as url:
        first: list = []
        threading.Thread(target=lambda: first.append(post(_port(url), body, ctype))).start()
        assert started.wait(30)  # in flight
        second: list = []
        queued = threading.Thread(target=lambda: second.append(post(_port(url), body, ctype)))
        queued.start()
        deadline = time.monotonic() + 30
        while app.state.gate.admitted < 2 and time.monotonic() < deadline:  # waiting for the slot
            time.sleep(0.01)
        third = post(_port(url), body, ctype)
        assert third.status == 503 and int(third.headers["retry-after"]) >= 1 and third.seconds < 5
        assert "busy" in third.json()["detail"]
        release.set()
        queued.join(30)
    while not first:
        time.sleep(0.01)
    assert first[0].status == 200 and second[0].status == 200
    assert app.state.gate.peak == 2 and app.state.gate.admitted == 0


def test_serve_command_passes_its_limits_and_prints_the_token_link(smoke_checkpoint, monkeypatch, capsys):
    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.update(app=app, **kwargs))
    monkeypatch.setenv(serve_command.TOKEN_ENV, "from-env")
    assert serve_command.main(["--checkpoint", str(smoke_checkpoint), "--max-in-flight", "3", "--max-queue", "0",
                               "--max-pixels", "1000", "--max-upload-mb", "1", "--allow-host", "lab-box",
                               "--token"]) == 0
    assert "http://127.0.0.1:7860/?token=from-env" in capsys.readouterr().err
    gate = served["app"].state.gate
    assert (gate.max_in_flight, gate.max_queue) == (3, 0)
    client = TestClient(served["app"], base_url="http://lab-box")
    assert client.get("/api/info").status_code == 401
    client.get("/?token=from-env")
    big = io.BytesIO()
    Image.new("RGB", (40, 30)).save(big, "PNG")  # 1200 pixels > --max-pixels 1000
    body, ctype = multipart("big.png", big.getvalue())
    response = client.post("/api/caption", content=body, headers={"content-type": ctype})
    assert response.status_code == 400 and "max_pixels=1000" in response.json()["detail"]
