"""COCO-format results (captioner/evaluation/results.py): `captioner evaluate --results-file` writes them, and
`captioner score` scores them, or any other system's, against Karpathy, COCO or captions-file references with
the numbers evaluate gives."""

from __future__ import annotations

import json

import pytest

from captioner.cli import main as cli_main
from captioner.evaluation.results import ResultsError, read_results, results_image_id


@pytest.fixture(scope="module")
def evaluated(smoke_checkpoint, tmp_path_factory) -> dict:
    """One evaluate run of the smoke model on the shapes val split: its JSON output and its results file."""
    out = tmp_path_factory.mktemp("evaluate")
    code = cli_main(["evaluate", "--checkpoint", str(smoke_checkpoint), "--data-root", str(out / "shapes"),
                     "--split", "val", "--beam", "2", "--no-meteor", "--no-cache", "--out", str(out / "eval.json"),
                     "--results-file", str(out / "results.json")])
    assert code == 0
    return {"eval": json.loads((out / "eval.json").read_text()), "results": out / "results.json",
            "references": out / "shapes" / "dataset_shapes.json"}


def _score(capsys, *args: str) -> dict:
    assert cli_main(["score", *args, "--no-meteor", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_writes_one_result_per_image_in_coco_format(evaluated):
    results = json.loads(evaluated["results"].read_text())
    predictions = evaluated["eval"]["predictions"]
    assert len(results) == len(predictions) == 6
    assert all(set(r) == {"image_id", "caption"} for r in results)
    assert {r["image_id"]: r["caption"] for r in results} == predictions  # shapes ids are the file stems


def test_rescoring_the_results_file_gives_evaluates_numbers(evaluated, capsys):
    scored = _score(capsys, str(evaluated["results"]), "--references", str(evaluated["references"]), "--split", "val")
    assert scored["tokenizer"] == evaluated["eval"]["tokenizer"] and scored["n_images"] == 6
    expected = evaluated["eval"]["scores"]
    assert scored["scores"].keys() == expected.keys()
    for name, value in expected.items():
        if value is None:  # METEOR, skipped by both
            assert scored["scores"][name] is None, name
        else:
            assert scored["scores"][name] == pytest.approx(value, abs=1e-9), name
    assert expected["BLEU-1"] is not None and expected["CIDEr-D"] is not None
    # without --split the results' own images are scored: the same six
    assert _score(capsys, str(evaluated["results"]), "--references", str(evaluated["references"]))["scores"] == \
        pytest.approx(scored["scores"])


def test_a_results_file_that_misses_images_of_the_split_is_refused(evaluated, tmp_path, capsys):
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(json.loads(evaluated["results"].read_text())[:4]))
    assert cli_main(["score", str(partial), "--references", str(evaluated["references"]), "--split", "val"]) == 2
    assert "the results have no caption for 2 images of the split" in capsys.readouterr().err
    assert cli_main(["score", str(partial), "--references", str(evaluated["references"]), "--split", "test"]) == 2
    assert "4 result image ids have no references" in capsys.readouterr().err


def test_coco_annotations_and_a_captions_file_are_references_too(tmp_path, capsys):
    refs = {391895: ["a man rides a bike down a dirt road", "a person on a bicycle on a path"],
            522418: ["a woman cuts a large cake with a knife", "a lady slicing a white cake"]}
    coco = tmp_path / "captions_val2014.json"
    coco.write_text(json.dumps({
        "images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in refs],
        "annotations": [{"id": n, "image_id": i, "caption": c} for n, (i, c) in
                        enumerate((i, c) for i, cs in refs.items() for c in cs)]}))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": cs[0]} for i, cs in refs.items()]))
    exact = _score(capsys, str(results), "--references", str(coco), "--tokenizer", "treebank")["scores"]
    assert [round(exact[f"BLEU-{n}"], 6) for n in (1, 2, 3, 4)] == [100.0] * 4  # each caption is a reference
    captions = tmp_path / "captions.csv"
    captions.write_text("image,caption\n" + "".join(f"val2014/COCO_val2014_{i:012d}.jpg,{c}\n"
                                                    for i, cs in refs.items() for c in cs))
    assert _score(capsys, str(results), "--references", str(captions), "--tokenizer", "treebank")["scores"] == \
        pytest.approx(exact)
    results.write_text(json.dumps([{"image_id": 391895, "caption": "a bike"}, {"image_id": 7, "caption": "a cat"}]))
    assert cli_main(["score", str(results), "--references", str(coco)]) == 2
    err = capsys.readouterr().err
    assert "1 result image ids have no references" in err and "['7']" in err


def test_image_ids_and_malformed_results(tmp_path):
    assert results_image_id("COCO_val2014_000000391895", "val2014/COCO_val2014_000000391895.jpg") == 391895
    assert results_image_id("000000391895", "000000391895.jpg") == 391895  # COCO 2017 names
    assert results_image_id("1000268201_693b08cb0e", "1000268201_693b08cb0e.jpg") == "1000268201_693b08cb0e"
    assert results_image_id("cats/01.jpg", "cats/01.jpg") == "cats/01.jpg"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"image_id": 1, "caption": "x"}))
    with pytest.raises(ResultsError, match=r"bad.json: expected a JSON list"):
        read_results(bad)
    bad.write_text(json.dumps([{"image_id": 1, "caption": "x"}, {"image_id": 1, "caption": "y"}]))
    with pytest.raises(ResultsError, match=r"bad.json: image_id 1 has a second caption at entry \[1\]"):
        read_results(bad)
    bad.write_text(json.dumps([{"image_id": 1, "text": "x"}]))
    with pytest.raises(ResultsError, match=r"bad.json: entry \[0\] is not an object with an image_id and a caption"):
        read_results(bad)


def test_the_score_table_and_the_evaluate_table_print_the_same_score_rows():
    from captioner.evaluation.score import format_scores, score_rows

    result = {"results": "r.json", "references": "refs.json", "split": None, "n_images": 2, "tokenizer": "simple",
              "scores": {"BLEU-4": 12.5, "METEOR": None}}
    head, *rows = format_scores(result).splitlines()
    assert rows == score_rows(result, head) == [
        "tokenizer=simple  (not PTB: scores differ slightly from published tables)", "-" * len(head),
        "BLEU-4      12.50", "METEOR     unavailable"]
