"""Attention grounding as `captioner evaluate` reports it: averaged over words (not images), a wrongly
named object counts against it, and hard attention's argmax/sample decoding scores the cell it read.

A stand-in model decodes scripted captions with scripted attention over a 4x4 grid, so every figure is
known by hand; the records are 64x64 images with one 32x32 box in the top-left corner (cells 0, 1, 4, 5).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.decoding.options import DecodeOptions
from captioner.evaluation.split import evaluate_model

GRID = (4, 4)
INSIDE, OUTSIDE = [0, 1, 4, 5], [10, 11, 14, 15]


def spread(cells: list[int]) -> np.ndarray:
    a = np.zeros(16, dtype=np.float32)
    a[cells] = 1.0 / len(cells)
    return a


class ScriptedModel:
    """What evaluate_model needs of an api.ImageCaptioner; image i decodes script[i] = (words, alphas, cells)."""

    grid_hw, device, decode_options = GRID, torch.device("cpu"), DecodeOptions(max_length=8)

    def __init__(self, script: list[tuple[list[str], list[np.ndarray], list[int] | None]]) -> None:
        self.script = list(script)

    def eval(self):
        return self

    def grid_from(self, inputs, images):
        return inputs

    prepare_grid = encode = lambda self, inputs: inputs

    def generate(self, grid, options):
        hyps = []
        for _ in range(grid.size(0)):
            words, alphas, cells = self.script.pop(0)
            hyps.append([SimpleNamespace(tokens=list(words), score=0.0,
                                         alphas=torch.from_numpy(np.stack(alphas)), locations=cells)])
        return hyps

    def words(self, hyp):
        return list(hyp.tokens)  # the script's "token ids" are its words

    vocab = SimpleNamespace(decode=lambda tokens, keep_unk=True: list(tokens))


class ZeroCache:
    def get_batch(self, ids):
        return np.zeros((len(ids), 16, 2), dtype=np.float16)


@pytest.fixture
def records(tmp_path):
    out = []
    for i, objects in enumerate([["circle"], ["circle", "square"], ["circle"]]):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (64, 64)).save(path)
        boxes = {"circle": [0, 0, 32, 32], "square": [32, 32, 64, 64]}  # square: cells 10, 11, 14, 15
        out.append(SimpleNamespace(image_id=str(i), path=path, raw=["a circle"],
                                   objects=[{"name": n, "box": boxes[n]} for n in objects]))
    return out


def _grounding(records, script, attention_mode="expectation"):
    options = DecodeOptions(beam=1, max_length=8, attention_mode=attention_mode)
    result = evaluate_model(ScriptedModel(script), records, options, tokenizer="simple", cache=ZeroCache(),
                            meteor=False, metrics=("BLEU-1",), progress=False)
    return result["grounding"], result.get("grounding_words")


def test_grounding_is_averaged_over_words_not_images(records):
    script = [(["circle"], [spread(INSIDE)], None),  # 1.0
              (["circle", "square", "circle"], [spread(OUTSIDE), spread(INSIDE), spread(OUTSIDE)], None),  # 0, 0, 0
              (["a"], [spread(INSIDE)], None)]  # no referring word
    grounding, words = _grounding(records, script)
    assert grounding == pytest.approx(1 / 4)  # per image it would be (1 + 0) / 2
    assert words == 4


def test_a_wrongly_named_object_counts_against_grounding(records):
    # image 2 shows a circle only: "square" names an object kind of the data set that is not there
    script = [(["circle"], [spread(INSIDE)], None), (["a"], [spread(INSIDE)], None),
              (["square"], [spread(INSIDE)], None)]
    grounding, words = _grounding(records, script)
    assert grounding == pytest.approx(0.5)  # skipped, it would be 1.0
    assert words == 2


def test_hard_attention_scores_the_cell_it_read(records):
    # alpha puts a quarter of its mass on the circle; the decoder read a cell of it (argmax/sample decoding)
    quarter = spread([0, 10, 11, 15])
    script = [(["circle"], [quarter], [0]), (["a"], [quarter], [10]), (["circle"], [quarter], [10])]
    grounding, _ = _grounding(records, script, attention_mode="argmax")
    assert grounding == pytest.approx(0.5)  # cell 0: 1, cell 10: 0 (alpha would give 0.25 for both)
    script = [(["circle"], [quarter], None), (["a"], [quarter], None), (["circle"], [quarter], None)]
    assert _grounding(records, script)[0] == pytest.approx(0.25)  # expectation decoding: alpha itself


def test_grounding_shares_and_cells_read():
    from captioner.evaluation.metrics import cells_read
    from captioner.evaluation.regions import grounding_shares

    objects = [{"name": "circle", "box": [0, 0, 32, 32]}]
    alphas = np.stack([spread(INSIDE), spread(INSIDE), spread(OUTSIDE)])
    words = ["circle", "star", "circle"]
    assert grounding_shares(words, alphas, GRID, objects, (64, 64)) == pytest.approx([1.0, 0.0])  # star: unknown
    assert grounding_shares(words, alphas, GRID, objects, (64, 64), names={"circle", "star"}) == pytest.approx(
        [1.0, 0.0, 0.0])  # star: a shape this image does not show
    assert np.array_equal(cells_read([2, 0], 3), [[0, 0, 1], [1, 0, 0]])
