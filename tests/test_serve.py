"""`captioner serve`, the demo page: its JSON through FastAPI's TestClient (the shipped model on the astronaut,
a random hard-attention model for the read cells), bad uploads, and the real page in headless Chromium."""

import base64
import importlib.util
import io
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="captioner serve needs the 'serve' extra")
from fastapi.testclient import TestClient  # noqa: E402

from captioner.api import build_model, load_captioner  # noqa: E402
from captioner.commands.serve import main  # noqa: E402
from captioner.config import load_config  # noqa: E402
from captioner.data.vocab import Vocab  # noqa: E402
from captioner.decoding.options import DecodeOptions  # noqa: E402
from captioner.decoding.search import normalise_score  # noqa: E402
from captioner.demo import sample_photo  # noqa: E402
from captioner.serving.server import create_app, page_options  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def _client(app) -> TestClient:
    """FastAPI's test client addressed as 127.0.0.1 (its default Host, "testserver", is refused)."""
    return TestClient(app, base_url="http://127.0.0.1")


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _decode_data_url(url: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return Image.open(io.BytesIO(base64.b64decode(url[len(prefix):]))).convert("RGB")


@pytest.fixture(scope="module")
def shipped():
    return load_captioner()


@pytest.fixture(scope="module")
def astronaut():
    return sample_photo("astronaut")


@pytest.fixture(scope="module")
def astronaut_result(shipped, astronaut):
    client = _client(create_app(shipped, page_options(shipped, beam=3)))
    response = client.post("/api/caption", files={"image": ("astronaut.png", _png_bytes(astronaut), "image/png")})
    assert response.status_code == 200, response.text
    return response.json()


def test_page_is_one_self_contained_document(shipped):
    client = _client(create_app(shipped, page_options(shipped, beam=3), model_label="flickr8k_soft (shipped)"))
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    for element in ('id="file"', 'id="word-slider"', 'id="overlay"', 'id="nbest"', 'id="error"'):
        assert element in page
    assert "flickr8k_soft (shipped)" in page and "beam 3" in page
    # offline: no script, style sheet, font or image from anywhere else
    for external in ("<script src", "<link", "http://", "https://", "@import", "url("):
        assert external not in page, external
    assert client.get("/api/info").json()["beam"] == 3


def test_caption_json_matches_the_model(shipped, astronaut, astronaut_result):
    out = astronaut_result
    (direct,) = shipped.caption([astronaut], beam=3, n_best=3)
    assert out["caption"] and out["caption"] == " ".join(out["words"]) == direct["caption"]
    assert out["filename"] == "astronaut.png"
    assert out["attention_mode"] == "expectation" and out["cells"] is None
    assert out["grid_hw"] == list(shipped.grid_hw)


def test_n_best_is_the_beam_ranked_best_first(shipped, astronaut_result):
    n_best = astronaut_result["n_best"]
    assert len(n_best) == 3 and n_best[0]["words"] == astronaut_result["words"]
    assert n_best[0]["score"] == pytest.approx(astronaut_result["score"])
    ranks = [h["norm_score"] for h in n_best]
    assert ranks == sorted(ranks, reverse=True)
    for h in n_best:
        assert h["score"] < 0 and h["caption"] == " ".join(h["words"])
        # every caption here ended with <end>, which counts in the length
        assert h["norm_score"] == pytest.approx(normalise_score(h["score"], len(h["words"]) + 1,
                                                                shipped.decode_options.length_penalty))


def test_one_overlay_per_word_and_they_differ(astronaut, astronaut_result):
    overlays = [_decode_data_url(url) for url in astronaut_result["overlays"]]
    assert len(overlays) == len(astronaut_result["words"]) > 1
    plain = _decode_data_url(astronaut_result["image"])
    assert max(plain.size) == 384 and plain.size[0] / plain.size[1] == pytest.approx(astronaut.width / astronaut.height)
    assert all(o.size == plain.size for o in overlays)
    arrays = [np.asarray(o, dtype=np.int16) for o in overlays]
    assert all(np.abs(a - np.asarray(plain, dtype=np.int16)).mean() > 10 for a in arrays)  # a map is drawn
    assert sum(np.abs(a - b).mean() > 1 for a, b in zip(arrays, arrays[1:])) >= len(arrays) // 2  # attention moves


def _hard_model():
    torch.manual_seed(0)
    vocab = Vocab.build([["a", "red", "circle"], ["a", "blue", "square", "above"]])
    hard = ["model.attention.attention=hard", "train.objective.kind=reinforce"]
    model = build_model(load_config(SMOKE, hard), vocab).eval()
    with torch.no_grad():  # an untrained model may end at once; make <end> unlikely so there are words
        model.decoder.out.bias[vocab.end_id] = -30.0
    return model


def test_hard_attention_reports_the_cell_read_per_word():
    model = _hard_model()
    image = Image.new("RGB", (64, 48), (200, 30, 30))
    client = _client(create_app(model, page_options(model, beam=2, attention_mode="argmax")))
    assert "hard attention (argmax decoding)" in client.get("/").text
    response = client.post("/api/caption", files={"image": ("red.png", _png_bytes(image), "image/png")})
    assert response.status_code == 200, response.text
    out = response.json()
    (direct,) = model.caption([image], beam=2, n_best=2, attention_mode="argmax")
    H, W = model.grid_hw
    assert out["attention_mode"] == "argmax" and len(out["words"]) > 0
    assert out["cells"] == [list(divmod(i, W)) for i in direct["locations"]]
    assert len(out["cells"]) == len(out["overlays"]) == len(out["words"])
    # the outline is drawn on each overlay around its cell's top-left corner
    for url, (row, col) in zip(out["overlays"], out["cells"]):
        frame = np.asarray(_decode_data_url(url))
        cell_w, cell_h = frame.shape[1] / W, frame.shape[0] / H
        assert (frame[int(row * cell_h), int(col * cell_w)] >= 250).all()


@pytest.mark.parametrize("filename, payload, reason", [
    ("notes.jpg", b"this is not an image", "not a recognised image format"),
    ("cut.png", "truncated", "truncated"),
    ("empty.png", b"", "empty"),
])
def test_bad_uploads_are_400_with_a_message(shipped, astronaut, filename, payload, reason):
    if payload == "truncated":
        payload = _png_bytes(astronaut)[:4000]
    client = _client(create_app(shipped, page_options(shipped, beam=1)))
    response = client.post("/api/caption", files={"image": (filename, payload, "image/png")})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert filename in detail and reason in detail


def test_missing_upload_is_400_and_oversized_413(shipped):
    client = _client(create_app(shipped, page_options(shipped, beam=1), max_upload_bytes=1000))
    response = client.post("/api/caption")
    assert response.status_code == 400 and "no image uploaded" in response.json()["detail"]
    big = _png_bytes(Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)))
    assert len(big) > 1000
    response = client.post("/api/caption", files={"image": ("big.png", big, "image/png")})
    assert response.status_code == 413 and "'big.png' is larger than" in response.json()["detail"]


def test_create_app_checks_its_arguments(shipped):
    with pytest.raises(ValueError, match="beam"):
        create_app(shipped, DecodeOptions(beam=0))
    with pytest.raises(ValueError, match="n_best"):
        create_app(shipped, DecodeOptions(beam=2, n_best=3))
    with pytest.raises(ValueError, match="reads one grid cell per word"):  # checked against the model once
        create_app(build_model(load_config("smoke", ["model.attention.attention=multi_head",
                                                     "model.attention.heads=2"]), shipped.vocab),
                   DecodeOptions(attention_mode="argmax"))


def test_serve_without_the_extra_says_what_to_install(monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "uvicorn" else real_find_spec(name, *a, **k))
    assert main(["--port", "7861"]) == 2
    err = capsys.readouterr().err
    assert "uvicorn" in err and "pip install 'captioner[serve]'" in err


def test_serve_command_loads_a_run_and_serves_it(smoke_checkpoint, monkeypatch):
    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.update(app=app, **kwargs))
    assert main(["--checkpoint", str(smoke_checkpoint), "--port", "7861", "--beam", "2", "--allow-unk"]) == 0
    assert served["host"] == "127.0.0.1" and served["port"] == 7861
    info = _client(served["app"]).get("/api/info").json()
    assert info["model"] == str(smoke_checkpoint) and info["beam"] == 2 and info["forbid_unk"] is False


def test_serve_names_a_bad_checkpoint(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nowhere.pt")]) == 2
    assert "nowhere.pt" in capsys.readouterr().err


# --- the page itself, in headless Chromium -------------------------------------------------------------------

def _screenshot_script():
    spec = importlib.util.spec_from_file_location("serve_screenshot", ROOT / "scripts" / "serve_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_page_in_headless_chromium(shipped, tmp_path):
    """Upload the astronaut through the page's file input, as a person would; the caption and a loaded
    overlay appear; the word slider moves the overlay. Leaves page.png in tmp_path."""
    browser = _screenshot_script()
    missing = [str(p) for p in (browser.CHROMIUM, browser.CHROMEDRIVER) if not p.exists()]
    if missing:
        message = f"no headless browser: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
        if os.environ.get("CAPTIONER_REQUIRE_BROWSER") == "1":
            pytest.fail(message + "; CAPTIONER_REQUIRE_BROWSER=1 requires it")
        pytest.skip(message)
    pytest.importorskip("selenium")
    from captioner.serving.server import serve_in_background

    photo = tmp_path / "astronaut.png"
    sample_photo("astronaut").save(photo)
    start = time.perf_counter()
    with serve_in_background(create_app(shipped, page_options(shipped, beam=3))) as url:
        driver = browser.start_chromium(tmp_path / "chromium-profile")
        try:
            state = browser.caption_on_page(driver, url, photo)
            assert not state["error"], state["error"]
            assert state["caption"].strip() and state["words"] == state["caption"].split()
            assert state["overlay_loaded"] and state["overlay_width"] > 0
            assert state["active"] == state["words"][:1] and state["slider"] == 0
            assert len(state["nbest_rows"]) == 3 and state["nbest_rows"][0][1] == state["caption"]
            first = state["overlay_src"]
            moved = browser.move_slider(driver, 2)
            assert moved["slider"] == 2 and moved["active"] == [state["words"][2]]
            assert moved["word_label"].startswith(f"word 3/{len(state['words'])}")
            assert moved["overlay_loaded"] and moved["overlay_src"] != first
            driver.save_screenshot(str(tmp_path / "page.png"))
            corrupt = tmp_path / "corrupt.jpg"
            corrupt.write_bytes(b"\xff\xd8\xff not really a JPEG")
            failed = browser.caption_on_page(driver, url, corrupt)
            assert "Could not caption corrupt.jpg" in failed["error"]
            assert "not a recognised image format" in failed["error"]
            assert not failed["caption"]
        finally:
            driver.quit()
    assert Image.open(tmp_path / "page.png").size[0] > 0
    print(f"browser test: {time.perf_counter() - start:.1f} s")
