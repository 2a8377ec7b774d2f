"""`captioner evaluate` on the smoke checkpoint (a random tiny model) and six 64-pixel shapes images: the
decoding options it takes reach the decode and its output says what was done."""

import json
from pathlib import Path

import pytest

from captioner.evaluate import main as evaluate


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shapes")  # the shapes images are drawn there on first use


def run_evaluate(checkpoint: Path, data_root: Path, out: Path, *flags: str) -> dict:
    """The JSON result (with predictions) of one evaluate run on the val split; the table goes to stdout."""
    code = evaluate(["--checkpoint", str(checkpoint), "--data-root", str(data_root), "--split", "val",
                     "--no-meteor", "--tokenizer", "simple", "--no-cache", "--out", str(out), *flags])
    assert code == 0
    return json.loads(out.read_text())


def trigrams(caption: str) -> list[tuple[str, ...]]:
    words = caption.split()
    return [tuple(words[i : i + 3]) for i in range(len(words) - 2)]


def test_block_trigrams_reaches_the_decode_and_the_table(smoke_checkpoint, data_root, tmp_path, capsys):
    plain = run_evaluate(smoke_checkpoint, data_root, tmp_path / "plain.json", "--beam", "2")
    table = capsys.readouterr().out
    assert plain["block_trigrams"] is False and "trigrams" not in table
    # the untrained model loops: some caption repeats a trigram, and none does with the ban
    assert any(len(set(trigrams(c))) < len(trigrams(c)) for c in plain["predictions"].values())
    blocked = run_evaluate(smoke_checkpoint, data_root, tmp_path / "blocked.json", "--beam", "2",
                              "--block-trigrams")
    table = capsys.readouterr().out
    assert blocked["block_trigrams"] is True and "repeated trigrams blocked" in table.splitlines()[0]
    assert all(len(set(trigrams(c))) == len(trigrams(c)) for c in blocked["predictions"].values())


def test_the_table_and_json_report_caption_diversity(smoke_checkpoint, data_root, tmp_path, capsys):
    result = run_evaluate(smoke_checkpoint, data_root, tmp_path / "result.json", "--beam", "1")
    table = capsys.readouterr().out
    captions = list(result["predictions"].values())
    assert len(captions) == 6
    words = {w for c in captions for w in c.split()}
    assert result["vocabulary"] == len(words) > 0
    assert result["distinct_captions"] == pytest.approx(len(set(captions)) / 6)
    assert f"vocabulary: {len(words)} distinct words" in table.splitlines()
    assert f"distinct captions: {100 * len(set(captions)) / 6:.1f} %" in table.splitlines()
