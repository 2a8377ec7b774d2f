"""A screenshot of `captioner serve`'s page after it captioned a photo, taken by headless Chromium.

    python scripts/serve_screenshot.py                       # docs/serve_page.png: the shipped model, the astronaut
    python scripts/serve_screenshot.py --word shirt --out /tmp/page.png --checkpoint runs/flickr8k_hard

It does what a person does: opens the page, uploads the photo through the file input, waits for the
caption, and moves the word slider with the arrow keys. Uses Debian's `chromium` and `chromium-driver`
(/usr/bin/chromium, /usr/bin/chromedriver) through Selenium, never a downloaded browser or driver.
tests/test_serve.py's browser test drives the page with the functions below.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW = (1120, 800)  # the page's result fits in it: a 384-pixel overlay beside the caption and n-best


def start_chromium(user_data_dir: Path, window: tuple[int, int] = WINDOW):
    """A headless Chromium under Selenium, isolated in ``user_data_dir`` and kept off the network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--hide-scrollbars", f"--window-size={window[0]},{window[1]}",
                 f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    # an explicit driver path: Selenium Manager never looks for (or downloads) one
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


def page_state(driver) -> dict:
    """What a person sees: caption, words, the active word, the overlay's source and whether it loaded."""
    return driver.execute_script("""
        const img = document.getElementById("overlay");
        return {
          caption: document.getElementById("caption").textContent,
          words: Array.from(document.querySelectorAll("#words span")).map((s) => s.textContent),
          active: Array.from(document.querySelectorAll("#words span.active")).map((s) => s.textContent),
          word_label: document.getElementById("word-label").textContent,
          slider: Number(document.getElementById("word-slider").value),
          overlay_src: img.getAttribute("src") || "",
          overlay_loaded: img.complete && img.naturalWidth > 0,
          overlay_width: img.naturalWidth,
          nbest_rows: Array.from(document.querySelectorAll("#nbest tbody tr")).map(
            (r) => Array.from(r.cells).map((c) => c.textContent)),
          error: document.getElementById("error").style.display === "none" ? "" :
                 document.getElementById("error").textContent,
        };""")


def caption_on_page(driver, url: str, photo: Path, timeout: float = 120.0) -> dict:
    """Open ``url``, upload ``photo`` through the file input, wait until the caption and its first overlay
    are shown (or the page shows an error); returns ``page_state``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    driver.find_element(By.ID, "file").send_keys(str(Path(photo).resolve()))
    WebDriverWait(driver, timeout).until(
        lambda d: (lambda s: s["error"] or (s["caption"] and s["overlay_loaded"]))(page_state(d)))
    return page_state(driver)


def move_slider(driver, steps: int, timeout: float = 10.0) -> dict:
    """Press the right arrow key ``steps`` times on the word slider (left when negative); waits for the
    overlay of the word it lands on to load and returns ``page_state``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    slider = driver.find_element(By.ID, "word-slider")
    slider.send_keys(*([Keys.ARROW_RIGHT if steps > 0 else Keys.ARROW_LEFT] * abs(steps)))
    WebDriverWait(driver, timeout).until(lambda d: page_state(d)["overlay_loaded"])
    return page_state(driver)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/serve_page.png")
    parser.add_argument("--photo", default="astronaut", help="one of scikit-image's photos (captioner.demo)")
    parser.add_argument("--word", default="shirt", help="show this word's overlay (the first word if absent)")
    parser.add_argument("--checkpoint", default=None, help="default: the shipped model")
    parser.add_argument("--beam", type=int, default=None, help="default: the model's eval.beam_size")
    parser.add_argument("--attention-mode", default=None, choices=("expectation", "argmax", "sample"))
    args = parser.parse_args(argv)
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        print(f"missing {', '.join(missing)}: apt-get install chromium chromium-driver", file=sys.stderr)
        return 2

    import tempfile

    from captioner.api import load_captioner
    from captioner.demo import sample_photo
    from captioner.serving.server import create_app, page_options, serve_in_background

    model = load_captioner(args.checkpoint)
    label = f"{model.shipped_name} (shipped)" if getattr(model, "shipped_name", None) else str(args.checkpoint)
    options = page_options(model).replace_given(beam=args.beam, attention_mode=args.attention_mode)
    app = create_app(model, options.replace_given(n_best=options.beam), model_label=label)
    with tempfile.TemporaryDirectory() as tmp, serve_in_background(app) as url:
        photo = Path(tmp) / f"{args.photo}.png"
        sample_photo(args.photo).save(photo)
        driver = start_chromium(Path(tmp) / "chromium")
        try:
            start = time.perf_counter()
            state = caption_on_page(driver, url, photo)
            if state["error"]:
                print(f"the page showed an error: {state['error']}", file=sys.stderr)
                return 1
            print(f"{state['caption']!r} on the page after {time.perf_counter() - start:.1f} s")
            if args.word in state["words"]:
                state = move_slider(driver, state["words"].index(args.word))
            driver.execute_script("window.scrollTo(0, 0); document.activeElement.blur();")
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(out))
            print(f"{state['word_label']}; wrote {out}")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
