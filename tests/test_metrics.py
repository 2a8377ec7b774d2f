"""Caption metric and attention-grounding tests on hand-made values."""

import numpy as np
import pytest
import torch

import captioner.evaluation.metrics as metrics
from captioner.evaluation.metrics import CAPTION_METRICS, caption_scores
from captioner.evaluation.regions import cell_shares, grounding_shares, inside

REFS = {
    "1": ["A red circle above a blue square.", "a red circle over a blue square"],
    "2": ["a small green triangle left of a large yellow circle", "a green triangle and a yellow circle"],
    "3": ["two blue squares next to each other", "a pair of blue squares side by side"],
    "4": ["a purple star below a small orange triangle", "an orange triangle above a purple star"],
}


def test_identical_captions_score_100_and_disjoint_score_0():
    same = {k: v[0] for k, v in REFS.items()}
    scores = caption_scores(same, REFS, meteor=False)
    assert list(scores) == list(CAPTION_METRICS)
    for n in range(1, 5):
        assert scores[f"BLEU-{n}"] == pytest.approx(100.0, abs=1e-3)
    assert scores["ROUGE-L"] == pytest.approx(100.0, abs=1e-3)
    assert scores["CIDEr-D"] > 100.0  # CIDEr-D is not capped at 100 (x10 factor)
    assert scores["METEOR"] is None  # skipped, never reported as 0

    disjoint = {k: "zebra giraffe elephant walking quickly home tonight" for k in REFS}
    scores = caption_scores(disjoint, REFS, meteor=False)
    for name in ("BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D"):
        assert scores[name] == pytest.approx(0.0, abs=1e-3)


def test_punctuation_and_case_do_not_matter_and_order_does():
    same = {k: v[0].upper().replace(" ", " , ") for k, v in REFS.items()}
    assert caption_scores(same, REFS, meteor=False)["BLEU-4"] == pytest.approx(100.0, abs=1e-3)
    shuffled = {k: " ".join(reversed(v[0].split())) for k, v in REFS.items()}
    partial = caption_scores(shuffled, REFS, meteor=False)
    assert 0.0 < partial["BLEU-1"] and partial["BLEU-4"] < 50.0


def test_metric_subset_and_unknown_names():
    preds = {k: v[1] for k, v in REFS.items()}
    sub = caption_scores(preds, REFS, metrics=("BLEU-4", "CIDEr-D"))
    assert set(sub) == {"BLEU-4", "CIDEr-D"}
    assert sub["BLEU-4"] == pytest.approx(caption_scores(preds, REFS, meteor=False)["BLEU-4"])
    with pytest.raises(ValueError, match="CIDEr-D"):
        caption_scores(preds, REFS, metrics=("CIDEr",))


def test_mismatched_ids_and_empty_prediction():
    with pytest.raises(ValueError, match="same image ids"):
        caption_scores({"1": "a"}, REFS, meteor=False)
    preds = {k: v[0] for k, v in REFS.items()}
    preds["2"] = ""  # a model may legitimately emit <end> first
    scores = caption_scores(preds, REFS, meteor=False)
    assert all(np.isfinite(v) for k, v in scores.items() if v is not None)


def test_meteor_is_none_without_java(monkeypatch):
    monkeypatch.setattr(metrics.shutil, "which", lambda name: None)
    preds = {k: v[0] for k, v in REFS.items()}
    with pytest.warns(UserWarning, match="java"):
        scores = caption_scores(preds, REFS)
    assert scores["METEOR"] is None and scores["BLEU-4"] == pytest.approx(100.0, abs=1e-3)


def test_meteor_failure_is_none_with_a_warning(monkeypatch):
    import pycocoevalcap.meteor.meteor as pm

    monkeypatch.setattr(pm.Meteor, "__init__", _broken_meteor_init)
    preds = {k: v[0] for k, v in REFS.items()}
    with pytest.warns(UserWarning, match="METEOR failed"):
        assert caption_scores(preds, REFS, metrics=("METEOR",))["METEOR"] is None


def _broken_meteor_init(self):
    import subprocess
    import sys
    import threading

    # a process that exits at once: writes fail or readline returns b'' -> an error, not a hang
    self.meteor_p = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    self.lock = threading.Lock()


@pytest.mark.slow
@pytest.mark.skipif(metrics.shutil.which("java") is None, reason="METEOR needs Java")
def test_meteor_with_java():
    # one JVM start (~30 s on this machine): identical captions for half the images, unrelated for the rest
    preds = {k: (v[0] if k in ("1", "2") else "zebra giraffe elephant") for k, v in REFS.items()}
    score = caption_scores(preds, REFS, metrics=("METEOR",))["METEOR"]
    assert score is not None and 20.0 < score < 90.0


# ------------------------------------------------------------------ grounding

GRID = (4, 4)
SIZE = (64, 64)  # (W, H): each cell is 16 x 16 pixels
BOX = {"name": "circle", "box": [0, 0, 32, 32]}  # exactly the top-left 2 x 2 cells


def alpha_on(cells):
    a = torch.zeros(16)
    a[cells] = 1.0 / len(cells)
    return a


def test_grounding_inside_outside_half():
    inside, outside = alpha_on([0, 1, 4, 5]), alpha_on([10, 15])
    half = alpha_on([0, 15])
    words = ["a", "circle"]
    for alpha, expected in ((inside, 1.0), (outside, 0.0), (half, 0.5)):
        alphas = torch.stack([alpha_on([15]), alpha])  # "a" names nothing: ignored
        assert grounding_shares(words, alphas, GRID, [BOX], SIZE) == pytest.approx([expected])


def test_grounding_uses_cell_area_fractions_and_box_unions():
    # a box covering the left half of cell 0 only: full attention on cell 0 -> 0.5
    box = {"name": "square", "box": [0, 0, 8, 16]}
    assert grounding_shares(["square"], alpha_on([0])[None], GRID, [box], SIZE) == pytest.approx([0.5])
    # two overlapping boxes with the same name: union, counted once
    boxes = [{"name": "square", "box": [0, 0, 16, 16]}, {"name": "square", "box": [8, 0, 32, 16]}]
    assert grounding_shares(["square"], alpha_on([0, 1])[None], GRID, boxes, SIZE) == pytest.approx([1.0])
    # grid that does not divide the image: 3 cells over 10 pixels, box = first 5 pixels
    frac = cell_shares(np.pad(np.ones((1, 5)), ((0, 0), (0, 5))), (1, 3))  # a mask
    assert frac == pytest.approx([1.0, (5 - 10 / 3) / (10 / 3), 0.0])


def test_grounding_counts_every_referring_word_and_only_those():
    alphas = torch.stack([alpha_on([0]), alpha_on([15])])
    assert grounding_shares(["a", "dog"], alphas, GRID, [BOX], SIZE) == []
    assert grounding_shares(["circle", "circle"], alphas, GRID, [BOX], SIZE) == pytest.approx([1.0, 0.0])
    # a word naming an object kind of the data set that this image does not show scores 0
    assert grounding_shares(["a", "square"], alphas, GRID, [BOX], SIZE, names={"square"}) == [0.0]


def test_grounding_shape_errors_name_the_sizes():
    with pytest.raises(ValueError, match=r"n_words=2.*H\*W=16"):
        grounding_shares(["a", "circle"], torch.zeros(2, 15), GRID, [BOX], SIZE)


def test_grounding_from_mask():
    mask = np.zeros((64, 64), dtype=bool)
    mask[:32, :32] = True
    assert inside(alpha_on([0, 5]), cell_shares(mask, GRID)) == pytest.approx(1.0)
    assert inside(alpha_on([0, 15]), cell_shares(mask, GRID)) == pytest.approx(0.5)
    assert inside(np.zeros(16), cell_shares(mask, GRID)) == 0.0  # an all-zero map has no weight anywhere


def test_one_rasteriser_reads_boxes_and_masks_alike():
    """A box given as normalised coordinates and as the pixel mask it covers give the same cell shares, on a grid
    that divides the photo unevenly (3 x 3 cells over 10 x 10 pixels)."""
    mask = np.zeros((10, 10))
    mask[2:7, 1:4] = 1.0  # rows 2..6, columns 1..3
    by_box = cell_shares([(0.1, 0.2, 0.4, 0.7)], (3, 3))
    np.testing.assert_allclose(by_box, cell_shares(mask, (3, 3)), atol=1e-12)
    assert by_box.sum() / 9 == pytest.approx(0.3 * 0.5)  # the box's area share
    with pytest.raises(ValueError, match="mask must be"):
        cell_shares(np.zeros((2, 2, 2)), (3, 3))


# ------------------------------------------------------------------ tokenizers


def test_simple_tokenizer_differs_from_ptb_where_expected():
    caps = {"a": ["A man's red T-shirt, on the grass."]}
    assert metrics.tokenize_captions(caps, "simple") == {"a": ["a man's red t shirt on the grass"]}


@pytest.mark.skipif(metrics.shutil.which("java") is None, reason="the PTB tokenizer needs Java")
def test_ptb_tokenizer_splits_possessives_and_keeps_hyphens():
    caps = {"a": ["A man's red T-shirt, on the grass.", ""], "b": ["Two dogs\nplay ."]}
    assert metrics.tokenize_captions(caps, "ptb") == {
        "a": ["a man 's red t-shirt on the grass", ""], "b": ["two dogs play"]}
    # The difference reaches the scores: a candidate written "man 's" matches a reference written
    # "man's" under PTB (both become "man 's"), not under the simple tokenizer ("man s" vs "man's").
    preds = {"1": "a man 's red t-shirt"}
    refs = {"1": ["A man's red T-shirt."]}
    assert caption_scores(preds, refs, meteor=False, tokenizer="ptb")["BLEU-4"] == pytest.approx(100.0, abs=1e-3)
    assert caption_scores(preds, refs, meteor=False, tokenizer="simple")["BLEU-4"] < 50.0


# Captions with what tokenizers disagree on; the three where nltk's Treebank tokenizer and coco-caption's
# PTB tokenizer still differ are named in TREEBANK_DIFFERS.
TOKENIZER_FIXTURE = [
    "A man's red T-shirt, on the grass.", "A person riding transit ( catching ? ) a paper bag .",
    "Two dogs don't play; they sleep...", 'A "happy" child [smiling] at 3:30 p.m.', "The U.S. flag flies.",
    "A woman in a 50's style dress", "Kids play in the o'clock sun!", "A boy -- jumping -- into water",
    "It's a dog's life: {fun}", "A man with a $5 bill and 50% off", "rock-climbing at sunset , wearing 'shades'",
    "A cat can't reach the toy.", "Dogs' bowls are empty", "An e-mail from Mr. Smith", "A 3-year-old girl",
    "The girls are gonna win", "A car ...going fast", "a man & a woman", "a dog#1 in the yard", "he said:'hi'",
]
TREEBANK_DIFFERS = {
    3: "a sentence-final abbreviation: PTB keeps 'p.m.', Treebank splits its last period off (dropped)",
    10: "single quotes around a word: PTB drops both, Treebank keeps the opening one ('shades)",
    19: "the same after a colon: 'hi",
}


@pytest.mark.skipif(metrics.shutil.which("java") is None, reason="the PTB tokenizer needs Java")
def test_treebank_tokenizer_is_close_to_ptb_and_its_differences_are_named():
    keyed = {i: [c] for i, c in enumerate(TOKENIZER_FIXTURE)}
    ptb = metrics.tokenize_captions(keyed, "ptb")
    treebank = metrics.tokenize_captions(keyed, "treebank")
    simple = metrics.tokenize_captions(keyed, "simple")
    differs = {i for i in keyed if treebank[i] != ptb[i]}
    assert differs == set(TREEBANK_DIFFERS), {i: (ptb[i], treebank[i]) for i in differs ^ set(TREEBANK_DIFFERS)}
    assert sum(simple[i] != ptb[i] for i in keyed) >= 12  # what the Treebank fallback improves on
    assert treebank[0] == ["a man 's red t-shirt on the grass"]


UNK_CAPTIONS = {"a": ["a man in a <unk> shirt", "<UNK> dog.", "a <unk> <unk> , on the grass"]}
UNK_TOKENIZED = ["a man in a <unk> shirt", "<unk> dog", "a <unk> <unk> on the grass"]


@pytest.mark.parametrize("tokenizer", ["treebank", "simple"])
def test_the_fallback_tokenizers_keep_unk_one_token(tokenizer):
    """Without Java, <unk> used to become "< unk >" (treebank) or "unk" (simple): three tokens where PTB gives
    one, or a word no reference holds."""
    assert metrics.tokenize_captions(UNK_CAPTIONS, tokenizer) == {"a": UNK_TOKENIZED}


@pytest.mark.skipif(metrics.shutil.which("java") is None, reason="the PTB tokenizer needs Java")
def test_ptb_keeps_unk_one_token_as_the_fallbacks_now_do():
    assert metrics.tokenize_captions(UNK_CAPTIONS, "ptb") == {"a": UNK_TOKENIZED}


def test_tokenizer_choice_follows_java(monkeypatch):
    monkeypatch.setattr(metrics.shutil, "which", lambda name: None)
    assert metrics.resolve_tokenizer("auto") == "treebank"
    with pytest.raises(ValueError, match="Java"):
        metrics.resolve_tokenizer("ptb")
    with pytest.raises(ValueError, match="auto, ptb, treebank, simple"):
        metrics.resolve_tokenizer("moses")
    monkeypatch.setattr(metrics.shutil, "which", lambda name: "/usr/bin/java")
    assert metrics.resolve_tokenizer("auto") == "ptb"


def test_tokenizer_choice_follows_the_ptb_jar_too(monkeypatch, tmp_path):
    """A slimmed pycocoevalcap (an offline GPU node's, scripts/slim_pycocoevalcap.py) has no CoreNLP jar: with Java
    present "auto" still picks the Treebank tokenizer there, and "ptb" names the missing jar."""
    import importlib.util

    package = tmp_path / "pycocoevalcap"
    (package / "tokenizer").mkdir(parents=True)
    spec = importlib.util.spec_from_file_location("pycocoevalcap", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "pycocoevalcap" else None)
    monkeypatch.setattr(metrics.shutil, "which", lambda name: "/usr/bin/java")
    assert metrics.resolve_tokenizer("auto") == "treebank"
    with pytest.raises(ValueError, match="CoreNLP jar"):
        metrics.resolve_tokenizer("ptb")
    (package / "tokenizer" / "stanford-corenlp-3.4.1.jar").write_bytes(b"")
    assert metrics.resolve_tokenizer("auto") == "ptb"


def test_attention_sharpness_of_uniform_and_one_hot_attention():
    L = 49
    uniform = np.full((5, L), 1.0 / L)
    one_hot = np.eye(L)[:3]
    s = metrics.attention_sharpness([uniform])
    assert s["alpha_max"] == pytest.approx(1.0 / L) and s["alpha_entropy"] == pytest.approx(1.0) and s["locations"] == L
    s = metrics.attention_sharpness([one_hot])
    assert s["alpha_max"] == pytest.approx(1.0) and s["alpha_entropy"] == pytest.approx(0.0, abs=1e-9)
    # Averaged over words, not captions: 5 uniform words and 3 one-hot words.
    s = metrics.attention_sharpness([uniform, torch.from_numpy(one_hot), np.zeros((0, L))])
    assert s["alpha_max"] == pytest.approx((5 / L + 3) / 8)
    assert metrics.attention_sharpness([])["alpha_max"] is None


def test_attention_movement_on_crafted_alphas():
    """A collapsed model (one cell for every word) against one that moves: distinct cells per caption and
    the share of consecutive words whose cell changes, pooled over captions."""
    L = 49
    collapsed = np.full((5, L), 0.1 / (L - 1))
    collapsed[:, 7] = 0.9  # every word's arg-max is cell 7
    moving = np.eye(L)[[3, 3, 10, 20, 10]]  # cells 3, 3, 10, 20, 10
    cells = [metrics.cells_of(collapsed), metrics.cells_of(moving)]
    assert cells[0].tolist() == [7] * 5 and cells[1].tolist() == [3, 3, 10, 20, 10]
    got = metrics.attention_movement(cells)
    assert got["cells_per_caption"] == pytest.approx((1 + 3) / 2)
    assert got["cell_changes"] == pytest.approx((0 + 3) / (4 + 4))
    # One-cell decoding reports the cells it read, not α's arg-max (a sampled cell may differ from it).
    assert metrics.cells_of(collapsed, locations=[1, 2, 2, 2, 2, 9]).tolist() == [1, 2, 2, 2, 2]
    # One-word captions have no pairs; no words at all gives no figures.
    assert metrics.attention_movement([[4]]) == {"cells_per_caption": 1.0, "cell_changes": None}
    assert metrics.attention_movement([]) == {"cells_per_caption": None, "cell_changes": None}


def test_caption_diversity_counts_distinct_words_and_captions():
    from captioner.evaluation.metrics import caption_diversity

    predictions = {
        "1": "a dog runs on the grass",
        "2": "a dog runs on the grass",  # the same caption for another image
        "3": "A Dog  runs on the grass",  # the same words, as stored (lower-cased, whitespace-split)
        "4": "a cat sleeps",
        "5": "",  # an empty caption is a caption with no words
        "6": "<unk> <unk> sleeps",
    }
    figures = caption_diversity(predictions)
    # a dog runs on the grass cat sleeps <unk>
    assert figures["vocabulary"] == 9
    assert figures["distinct_captions"] == pytest.approx(4 / 6)
    assert caption_diversity({"1": "a b", "2": "b a"}) == {"vocabulary": 2, "distinct_captions": 1.0}
    assert caption_diversity({"1": "", "2": ""}) == {"vocabulary": 0, "distinct_captions": 0.5}
    assert caption_diversity({}) == {"vocabulary": 0, "distinct_captions": None}
