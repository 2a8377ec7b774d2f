"""The Flickr30k Entities reader (data/entities.py) on files in the published format, and the box grounding
figures (evaluation/grounding.py) against hand computations on a crafted photo with crafted boxes and maps."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from captioner.data.entities import (
    clip_boxes,
    entity_id,
    lemma,
    parse_sentence,
    read_entities,
)
from captioner.data.records import DataError
from captioner.evaluation.grounding import BoxGrounding, centre_cell, format_grounding
from captioner.evaluation.regions import cell_shares
from tests.entities_fixture import write_photo

# --------------------------------------------------------------------------- the reader


def test_a_sentence_becomes_tokens_and_phrases_with_their_chains_and_types():
    s = parse_sentence("[/EN#18/people A child] in [/EN#19/clothing a pink dress] is climbing up "
                       "[/EN#20/other a set of stairs] in [/EN#23/scene an entry way] .")
    assert s.tokens == "a child in a pink dress is climbing up a set of stairs in an entry way".split()
    assert [(p.start, p.end, p.chain, p.types) for p in s.phrases] == [
        (0, 2, "18", ("people",)), (3, 6, "19", ("clothing",)), (9, 13, "20", ("other",)), (14, 17, "23", ("scene",))]
    assert [s.tokens[p.head] for p in s.phrases] == ["child", "dress", "stairs", "way"]


def test_a_phrase_with_several_types_keeps_them_all_and_reports_under_the_first():
    s = parse_sentence("[/EN#7/people/bodyparts A man's hand] waves")
    assert s.phrases[0].types == ("people", "bodyparts")
    assert s.phrases[0].row == "people"
    assert s.tokens == ["a", "man's", "hand", "waves"]


@pytest.mark.parametrize("chains", [("1", "2"), ("55101", "55102")], ids=["per-photo v1.0", "global"])
def test_both_chain_numberings_read_the_same_boxes(tmp_path, chains):
    a, b = chains
    write_photo(tmp_path, "42", [f"[/EN#{a}/animals A dog] chases [/EN#{b}/other a ball] ."], (200, 100),
                {a: [(1, 1, 100, 100)], b: [(101, 51, 200, 100)]})
    photo = read_entities(tmp_path, ["42_deadbeef"]).get("42_deadbeef")
    dog, ball = photo.sentences[0].phrases
    assert photo.phrase_boxes(dog) == [(0.0, 0.0, 0.5, 1.0)]  # normalised by the XML's 200x100
    assert photo.phrase_boxes(ball) == [(0.5, 0.5, 1.0, 1.0)]


def test_nobndbox_and_scene_chains_have_no_box_and_a_photo_without_files_is_counted(tmp_path):
    write_photo(tmp_path, "7", ["[/EN#1/people A man] on [/EN#2/scene a beach] under [/EN#3/other the sky] ."],
                (10, 10), {"1": [(1, 1, 5, 10)], "2": "scene", "3": "nobndbox"})
    entities = read_entities(tmp_path, ["7_x", "8_y", "7_x#mirror"])
    photo = entities.get("7_x")
    man, beach, sky = photo.sentences[0].phrases
    assert photo.phrase_boxes(beach) == [] and photo.phrase_boxes(sky) == []
    assert photo.scene == {"2"} and photo.no_box == {"2", "3"}
    assert entities.missing == ["8_y"] and len(entities.images) == 1
    assert "1 without an annotation" in entities.summary()
    assert list(photo.boxed_heads()) == ["man"]


def test_several_boxes_of_one_chain_are_its_union(tmp_path):
    write_photo(tmp_path, "9", ["[/EN#4/animals Two dogs] play"], (100, 100),
                {"4": [(1, 1, 50, 50), (51, 51, 100, 100)]})
    photo = read_entities(tmp_path, ["9"]).get("9")
    assert cell_shares(photo.phrase_boxes(photo.sentences[0].phrases[0]), (2, 2)).tolist() == [1, 0, 0, 1]


@pytest.mark.parametrize("line", ["[/EN#1/people A man walks", "A man] walks", "[/EN#/people A man] walks",
                                  "[EN#1/people A man] walks"])
def test_a_malformed_sentence_is_refused_with_its_file_and_line(tmp_path, line):
    write_photo(tmp_path, "5", ["[/EN#1/people A woman] sits .", line], (10, 10), {"1": [(1, 1, 5, 5)]})
    with pytest.raises(DataError, match=r"Sentences/5\.txt:2: "):
        read_entities(tmp_path, ["5"])


def test_a_malformed_annotation_is_refused_with_its_file(tmp_path):
    write_photo(tmp_path, "6", ["[/EN#1/people A woman] sits ."], (10, 10), {"1": [(1, 1, 5, 5)]})
    xml = tmp_path / "Annotations" / "6.xml"
    xml.write_text(xml.read_text().replace("</annotation>", ""))
    with pytest.raises(DataError, match=r"Annotations/6\.xml:\d+: not well-formed XML"):
        read_entities(tmp_path, ["6"])
    xml.write_text("<annotation><size><width>ten</width><height>10</height></size></annotation>")
    with pytest.raises(DataError, match=r"6\.xml: <width> missing or not a number \('ten'\)"):
        read_entities(tmp_path, ["6"])
    xml.write_text("<annotation><size><width>10</width><height>10</height></size><object><name>1</name>"
                   "<bndbox><xmin>8</xmin><ymin>1</ymin><xmax>2</xmax><ymax>5</ymax></bndbox></object></annotation>")
    with pytest.raises(DataError, match=r"6\.xml: chain 1: box .* xmax < xmin"):
        read_entities(tmp_path, ["6"])


def test_one_file_without_the_other_and_a_wrong_folder_are_refused(tmp_path):
    write_photo(tmp_path, "3", ["[/EN#1/people A woman] sits ."], (10, 10), {"1": [(1, 1, 5, 5)]})
    (tmp_path / "Annotations" / "3.xml").unlink()
    with pytest.raises(DataError, match=r"Annotations/3\.xml: missing, though .*Sentences/3\.txt exists"):
        read_entities(tmp_path, ["3"])
    with pytest.raises(DataError, match="not a Flickr30k Entities folder"):
        read_entities(tmp_path / "nowhere", ["3"])


@pytest.mark.parametrize("image_id, photo", [
    ("1000268201_693b08cb0e", "1000268201"),  # Flickr8k's stem (karpathy, flickr8k formats)
    ("1000268201_693b08cb0e.jpg", "1000268201"),  # a file name
    ("images/1000268201_693b08cb0e.jpg", "1000268201"),  # data.format captions: the path under data.root
    ("1000092795.jpg", "1000092795"),  # Flickr30k's own file names have no secret
    ("1000268201", "1000268201"),
    ("99_a#mirror", "99"),  # data.mirror's training copy
    ("images/99_a.jpg#mirror", "99"),
    # a '#' in a folder's name is no suffix: only the file name's own is cut
    ("data/set#2/1000268201_693b08cb0e.jpg", "1000268201"),
    ("data/set#2/1000268201_693b08cb0e.jpg#mirror", "1000268201"),
    ("data\\set#2\\1000268201_693b08cb0e.jpg", "1000268201"),
    ("1000268201_693b08cb0e.jpg#2", "1000268201"),  # a caption number's suffix
])
def test_entity_ids_are_file_stems_up_to_the_first_underscore(image_id, photo):
    assert entity_id(image_id) == photo


def test_lemmas():
    assert [lemma(w) for w in ("dogs", "men", "puppies", "boxes", "dress", "jeans", "bus", "dog", "Women")] == [
        "dog", "man", "puppy", "box", "dress", "jeans", "bus", "dog", "woman"]


def test_cell_shares_of_boxes_are_exact_area_shares():
    assert cell_shares([(0.0, 0.0, 0.5, 0.5)], (2, 2)).tolist() == [1, 0, 0, 0]
    np.testing.assert_allclose(cell_shares([(0.25, 0.25, 0.75, 0.75)], (2, 2)), [0.25] * 4)
    # overlapping boxes count once: [0, .5] and [.25, .75] across the top row cover .75 of its width
    np.testing.assert_allclose(cell_shares([(0, 0, 0.5, 0.5), (0.25, 0, 0.75, 0.5)], (2, 2)), [1, 0.5, 0, 0])
    np.testing.assert_allclose(cell_shares([(0.1, 0.2, 0.4, 0.9)], (3, 3)).sum() / 9, 0.3 * 0.7)
    assert cell_shares([], (7, 7)).sum() == 0 and centre_cell((7, 7)) == 24 and centre_cell((2, 2)) == 3


# --------------------------------------------------------------------------- the figures, by hand
#
# A 100x100 photo on a 2x2 grid (cells 0 1 / 2 3; the centre cell is 3). Chain 1 ("a man", people) is the left
# half: cell fractions [1, 0, 1, 0]. Chain 2 ("a cat", animals) is the top-left quarter: [1, 0, 0, 0].

SENTENCE = "[/EN#1/people A man] holds [/EN#2/animals a cat] ."
TF_ALPHAS = np.array([[0.25, 0.25, 0.25, 0.25],  # a
                      [0.5, 0.1, 0.3, 0.1],  # man: inside .8, peak cell 0 (in), uniform .5
                      [0.1, 0.1, 0.1, 0.7],  # holds
                      [0.25, 0.25, 0.25, 0.25],  # a
                      [0.1, 0.6, 0.2, 0.1]])  # cat: inside .1, peak cell 1 (out), uniform .25


@pytest.fixture
def photo_folder(tmp_path):
    write_photo(tmp_path, "100", [SENTENCE, "[/EN#2/animals The cat] and [/EN#3/scene the room] ."], (100, 100),
                {"1": [(1, 1, 50, 100)], "2": [(1, 1, 50, 50)], "3": "scene"})
    return tmp_path


def test_teacher_forced_figures_equal_the_hand_computation(photo_folder):
    entities = read_entities(photo_folder, ["100_a"])
    g = BoxGrounding(entities, (2, 2))
    g.add_teacher_forced(entities.get("100_a"), 0, TF_ALPHAS)
    f = g.figures()["teacher_forced"]
    # mean map over the five words: [1.2, 1.3, 1.1, 1.4] / 5; its peak is cell 3, in neither box
    assert f["words"] == 2 and f["photos"] == 1
    assert f["inside"] == pytest.approx((0.8 + 0.1) / 2)
    assert f["uniform"] == pytest.approx((0.5 + 0.25) / 2)
    assert f["mean_map"] == pytest.approx(((0.24 + 0.22) + 0.24) / 2)
    assert (f["pointing"], f["mean_map_pointing"], f["centre_pointing"]) == (0.5, 0.0, 0.0)
    assert f["by_type"]["people"]["inside"] == pytest.approx(0.8) and f["by_type"]["people"]["pointing"] == 1.0
    assert f["by_type"]["animals"]["inside"] == pytest.approx(0.1) and f["by_type"]["animals"]["pointing"] == 0.0
    assert set(f["by_type"]) == {"people", "animals"}


def test_generated_words_match_boxed_heads_by_lemma_and_the_mean_map_counts_every_word(photo_folder):
    entities = read_entities(photo_folder, ["100_a", "101_b"])
    g = BoxGrounding(entities, (2, 2))
    words = ["two", "men", "and", "a", "cats"]  # "men" -> man (chain 1), "cats" -> cat (chain 2); "room": no box
    alphas = np.array([[0, 0, 0, 1], [0.2, 0.2, 0.4, 0.2], [0, 0, 0, 1], [0, 0, 0, 1], [0.7, 0.1, 0.1, 0.1]])
    g.add_generated("100_a", words, alphas)
    g.add_generated("101_b", ["a", "dog"], np.full((2, 4), 0.25))  # no annotation: counted, not scored
    f = g.figures()["generated"]
    assert f["words"] == 2 and g.without_annotation == 1
    assert f["inside"] == pytest.approx((0.6 + 0.7) / 2)
    assert f["pointing"] == 1.0  # men -> cell 2 (in the left half), cats -> cell 0 (in the top-left box)
    mean_map = alphas.sum(0) / 5  # [0.18, 0.06, 0.1, 0.66]: peak cell 3
    assert f["mean_map"] == pytest.approx(((mean_map[0] + mean_map[2]) + mean_map[0]) / 2)
    assert f["mean_map_pointing"] == 0.0 and f["centre_pointing"] == 0.0


def test_hard_attention_is_scored_on_the_cell_it_read(photo_folder):
    entities = read_entities(photo_folder, ["100_a"])
    g = BoxGrounding(entities, (2, 2), one_cell=True)
    alphas = np.array([[0.1, 0.1, 0.1, 0.7], [0.4, 0.3, 0.2, 0.1]])  # the cat's alpha peaks in the box...
    g.add_generated("100_a", ["a", "cat"], alphas, locations=[3, 1])  # ...but the sampled read was cell 1
    f = g.figures()["generated"]
    assert (f["inside"], f["pointing"]) == (0.0, 0.0)
    tf = BoxGrounding(entities, (2, 2), one_cell=True)
    tf.add_teacher_forced(entities.get("100_a"), 0, TF_ALPHAS)  # one-cell: alpha's arg-max cells
    assert tf.figures()["teacher_forced"]["inside"] == pytest.approx((1.0 + 0.0) / 2)


def test_the_table_prints_every_row_and_says_when_nothing_matched(photo_folder):
    entities = read_entities(photo_folder, ["100_a"])
    g = BoxGrounding(entities, (2, 2))
    g.add_teacher_forced(entities.get("100_a"), 0, TF_ALPHAS)
    text = "\n".join(format_grounding(g.figures()))
    assert "generated        no word matched a boxed phrase" in text
    assert "teacher-forced        2   0.450  0.375  0.350 |  50.0%   0.0%    0.0%" in text
    assert "  people" in text and "  animals" in text


def test_overlays_draw_each_words_boxes_and_its_share_inside(photo_folder):
    from matplotlib.patches import Rectangle
    from PIL import Image

    from captioner.evaluation.grounding import word_boxes, word_grounding
    from captioner.visualize import overlay_attention

    photo = read_entities(photo_folder, ["100_a"]).get("100_a")
    words = ["a", "man", "and", "cats"]
    alphas = np.array([[0.25] * 4, [0.5, 0.1, 0.3, 0.1], [0.25] * 4, [0.1, 0.6, 0.2, 0.1]])
    boxes = word_boxes(photo, words)
    assert boxes[0] is None and boxes[1] == [(0.0, 0.0, 0.5, 1.0)] and boxes[3] == [(0.0, 0.0, 0.5, 0.5)]
    figures = word_grounding(photo, words, alphas, (2, 2))
    assert figures[0] is None and figures[1]["inside"] == pytest.approx(0.8) and figures[1]["pointing"]
    assert figures[3]["inside"] == pytest.approx(0.1) and not figures[3]["pointing"] and not figures[3]["centre"]
    fig = overlay_attention(Image.new("RGB", (100, 100)), words, alphas, (2, 2), boxes=boxes)
    panels = fig.axes[1:]
    assert [ax.get_title() for ax in panels] == ["a", "man\n0.80 in box", "and", "cats\n0.10 in box"]
    dashed = [[p for p in ax.patches if isinstance(p, Rectangle)] for ax in panels]
    assert [len(d) for d in dashed] == [0, 1, 0, 1]
    assert dashed[1][0].get_width() == pytest.approx(50) and dashed[1][0].get_height() == pytest.approx(100)
    with pytest.raises(ValueError, match="boxes has 1 entries but there are 4 words"):
        overlay_attention(Image.new("RGB", (100, 100)), words, alphas, (2, 2), boxes=[None])


# --------------------------------------------------------------------------- the cut at data.max_length


def _read_as_encoded(n_read: int, rows: int = 7) -> np.ndarray:
    """The maps the model gives a reference encoded with ``n_read`` of its words: row t predicts token t, then the
    <end> step's row and padding rows up to the batch's longest, all on cell 0 (in both boxes)."""
    after = np.tile([1.0, 0.0, 0.0, 0.0], (rows - n_read, 1))
    return np.concatenate([TF_ALPHAS[:n_read], after])


@pytest.mark.parametrize("max_length, scored", [(None, ["man", "cat"]), (5, ["man", "cat"]), (4, ["man"]),
                                                 (3, ["man"]), (1, [])])
def test_teacher_forced_scores_only_the_words_read_each_with_its_own_steps_map(photo_folder, max_length, scored):
    # SENTENCE's tokens: a man holds a cat; "man" (index 1) is inside .8 of its own map, "cat" (index 4) .1
    entities = read_entities(photo_folder, ["100_a"])
    g = BoxGrounding(entities, (2, 2))
    n_read = 5 if max_length is None else min(5, max_length)
    g.add_teacher_forced(entities.get("100_a"), 0, _read_as_encoded(n_read), max_length=max_length)
    f = g.figures()["teacher_forced"]
    own = {"man": 0.8, "cat": 0.1}  # were "cat" read with the <end> step's map (cut at 4), it would be 1.0
    fractions = {"man": [1, 0, 1, 0], "cat": [1, 0, 0, 0]}
    assert f["words"] == len(scored) and f["photos"] == (1 if scored else 0)
    if scored:
        assert f["inside"] == pytest.approx(np.mean([own[w] for w in scored]))
        mean_map = TF_ALPHAS[:n_read].mean(0)  # over the words read, not the <end> and padding rows
        assert f["mean_map"] == pytest.approx(np.mean([mean_map @ fractions[w] for w in scored]))


class _StepsReader:
    """What split.box_grounding needs of a model: each step's map is cell 0 (in both boxes) where the step predicts
    <end> or padding, else cell 3 (in neither): a word scored with another step's map shows as inside 1."""

    def __init__(self, vocab, max_length: int) -> None:
        self.vocab, self.grid_hw, self.device = vocab, (2, 2), torch.device("cpu")
        self.decoder = object()
        self.config = SimpleNamespace(data=SimpleNamespace(max_length=max_length))

    def grid_from(self, inputs, images):
        return inputs

    def __call__(self, grid, captions, lengths, attention_mode):
        predicted = captions[:, 1:]  # (N, T-1): row t predicts token t + 1 of the encoded caption
        word = (predicted != self.vocab.end_id) & (predicted != self.vocab.pad_id)
        cells = torch.where(word, 3, 0)
        return SimpleNamespace(alphas=torch.nn.functional.one_hot(cells, 4).float())  # (N, T-1, L)


def test_evaluate_reads_references_past_the_cut_without_scoring_them(photo_folder):
    from captioner.data.vocab import Vocab
    from captioner.decoding.options import DecodeOptions
    from captioner.evaluation.split import box_grounding

    entities = read_entities(photo_folder, ["100_a"])
    vocab = Vocab(["<pad>", "<start>", "<end>", "<unk>", "a", "man", "holds", "cat", "the", "and", "room"])

    class Cache:
        def get_batch(self, ids):
            return np.zeros((len(ids), 4, 2), dtype=np.float16)

    def figures(max_length):
        return box_grounding(_StepsReader(vocab, max_length), [SimpleNamespace(image_id="100_a")], {},
                             DecodeOptions(), entities, batch_size=4, cache=Cache())["teacher_forced"]

    # the references: "a man holds a cat" (man at 1, cat at 4) and "the cat and the room" (cat at 1)
    assert figures(20)["words"] == 3 and figures(20)["inside"] == 0.0  # every word its own map, on cell 3
    cut = figures(4)  # "cat" at index 4 lies past the cut: not read, not scored
    assert cut["words"] == 2 and cut["inside"] == 0.0


# --------------------------------------------------------------------------- boxes that clip to nothing


def test_clipping_keeps_the_part_inside_the_photo_and_drops_boxes_left_without_area():
    assert clip_boxes([(-0.2, 0.1, 0.5, 1.3), (1.0, 0.0, 1.3, 0.5), (0.2, 0.2, 0.2, 0.9), (2, 2, 3, 3)]) == [
        (0.0, 0.1, 0.5, 1.0)]
    assert clip_boxes([]) == []


def test_a_phrase_whose_boxes_all_clip_to_nothing_counts_in_no_setting(tmp_path):
    from captioner.data.vocab import Vocab
    from captioner.evaluation.grounding import word_boxes
    from captioner.training.objectives.base import BoxTargets

    # a 100x100 photo whose XML puts the cat's boxes past its right edge (x from 101) and wholly outside it
    write_photo(tmp_path, "200", [SENTENCE], (100, 100),
                {"1": [(1, 1, 50, 100)], "2": [(101, 1, 150, 50), (120, 120, 130, 130)]})
    entities = read_entities(tmp_path, ["200_a"])
    photo = entities.get("200_a")
    man, cat = photo.sentences[0].phrases
    assert photo.phrase_boxes(man) == [(0.0, 0.0, 0.5, 1.0)] and photo.phrase_boxes(cat) == []

    teacher_forced = BoxGrounding(entities, (2, 2))
    teacher_forced.add_teacher_forced(photo, 0, TF_ALPHAS)
    generated = BoxGrounding(entities, (2, 2))
    generated.add_generated("200_a", ["a", "man", "holds", "a", "cat"], TF_ALPHAS)
    for g in (teacher_forced.figures()["teacher_forced"], generated.figures()["generated"]):
        assert g["words"] == 1 and set(g["by_type"]) == {"people"} and g["inside"] == pytest.approx(0.8)

    vocab = Vocab(["<pad>", "<start>", "<end>", "<unk>", "a", "man", "holds", "cat"])
    targets = BoxTargets([SimpleNamespace(image_id="200_a", mirrored=False)], entities, vocab, (2, 2))
    _, hit = targets.lookup(torch.tensor([0]), torch.tensor([[vocab.id("man"), vocab.id("cat")]]))
    assert hit.tolist() == [[True, False]]  # supervised attention: the man's map only
    assert word_boxes(photo, ["man", "cat"])[1] is None  # and the overlays draw no box for the cat


class WordCount:
    """A toy grounding metric: the scored words per setting (what a new metric needs: a class and one line)."""

    def __init__(self) -> None:
        self.counts = {"generated": 0, "teacher_forced": 0}

    @classmethod
    def build(cls, grid_hw, entities, class_photos):
        return cls()

    def add(self, caption) -> None:
        self.counts[caption.setting] += len(caption.scored)

    def figures(self) -> dict:
        return {"word_count": dict(self.counts)}

    @staticmethod
    def lines(figures: dict) -> list[str]:
        return [f"scored words: {figures['word_count']}"] if figures.get("word_count") else []


def test_a_grounding_metric_is_one_class_and_one_registry_line(photo_folder, monkeypatch):
    from captioner.names import GROUNDING_METRICS

    monkeypatch.setitem(GROUNDING_METRICS.paths, "word_count", f"{__name__}:WordCount")
    entities = read_entities(photo_folder, ["100_a"])
    g = BoxGrounding(entities, (2, 2))
    g.add_teacher_forced(entities.get("100_a"), 0, TF_ALPHAS)
    g.add_generated("100_a", ["a", "man", "and", "a", "cat"], np.full((5, 4), 0.25))
    figures = g.figures()
    assert figures["word_count"] == {"generated": 2, "teacher_forced": 2}
    assert figures["teacher_forced"]["words"] == 2 and figures["localization"] is not None  # the others still run
    assert format_grounding(figures)[-1] == "scored words: {'generated': 2, 'teacher_forced': 2}"
    only = BoxGrounding(entities, (2, 2), metrics=("word_count",))  # validation's way: the metrics named
    only.add_generated("100_a", ["a", "cat"], np.full((2, 4), 0.25))
    assert only.figures()["pointing"] is None and only.figures()["word_count"]["generated"] == 1
