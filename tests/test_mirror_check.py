"""The mirror check (metrics.mirror_following, `captioner evaluate --mirror-check`): attention grounded in the
photo's content follows it when the photo is mirrored left-right; a per-word position code stays put. Crafted
maps on a 3x3 grid (cells row-major: column = cell % 3), then the command on the smoke checkpoint."""

import json

import numpy as np
import pytest

from captioner.commands.evaluate import main as evaluate
from captioner.evaluation.metrics import mirror_following

GRID = (3, 3)


def one_hot(*cells: int) -> np.ndarray:
    maps = np.zeros((len(cells), 9))
    maps[np.arange(len(cells)), cells] = 1.0
    return maps


def pair(words_a, cells_a, words_b, cells_b, maps_a=None, maps_b=None):
    return (words_a, one_hot(*cells_a) if maps_a is None else maps_a, list(cells_a),
            words_b, one_hot(*cells_b) if maps_b is None else maps_b, list(cells_b))


def test_a_map_that_follows_the_photo_mirrors_and_a_position_code_stays():
    # "dog" read at (0, 0) and "ball" at (2, 1) in the photo; mirrored: the dog at (0, 2), the ball at (2, 1)
    # (centre column). A position code reads the same cells on both photos.
    follows = pair(["dog", "ball"], [0, 7], ["dog", "ball"], [2, 7])
    stays = pair(["dog", "ball"], [0, 7], ["dog", "ball"], [0, 7])
    grounded = mirror_following([follows], GRID)
    assert grounded["mirror_words"] == 2
    assert grounded["mirror_informative"] == 1  # the ball's map in the centre column is its own mirror image
    assert grounded["mirror_follow"] == 1.0
    assert grounded["mirror_overlap_flipped"] == 1.0 and grounded["mirror_overlap_unflipped"] == 0.5
    assert grounded["mirror_columns"] == 1  # the centre column neither mirrors nor stays
    assert grounded["columns_mirror"] == 1.0 and grounded["columns_stay"] == 0.0
    position = mirror_following([stays], GRID)
    assert position["mirror_follow"] == 0.0
    assert position["columns_mirror"] == 0.0 and position["columns_stay"] == 1.0


def test_only_content_words_both_captions_use_count_at_their_first_use():
    # "a"/"the"/"left" are function words; "dog" appears twice in the first caption (its first use counts);
    # "cat" is in one caption only.
    words_a = ["a", "dog", "on", "the", "left", "dog", "cat"]
    words_b = ["a", "dog", "on", "the", "right"]
    result = mirror_following([pair(words_a, [4, 3, 4, 4, 3, 5, 1], words_b, [4, 5, 4, 4, 3])], GRID)
    assert result["mirror_words"] == 1
    assert result["columns_mirror"] == 1.0  # dog's first use: column 0 -> column 2


def test_soft_maps_compare_by_histogram_intersection():
    a = np.full((1, 9), 0.0)
    a[0, [0, 3, 6]] = [0.5, 0.3, 0.1]  # mostly the left column
    a[0, 4] = 0.1
    flipped = a.reshape(3, 3)[:, ::-1].reshape(1, 9)
    mostly_flipped = 0.8 * flipped + 0.2 * a
    result = mirror_following([("dog".split(), a, None, "dog".split(), mostly_flipped, None)], GRID)
    assert result["mirror_follow"] == 1.0
    expected = np.minimum(mostly_flipped, flipped).sum()
    assert result["mirror_overlap_flipped"] == pytest.approx(expected)
    assert result["mirror_overlap_unflipped"] == pytest.approx(np.minimum(mostly_flipped, a).sum())
    assert result["mirror_columns"] == 0 and result["columns_mirror"] is None  # no cells given
    uniform = np.full((1, 9), 1 / 9)
    symmetric = mirror_following([("dog".split(), uniform, None, "dog".split(), uniform, None)], GRID)
    assert symmetric["mirror_words"] == 1 and symmetric["mirror_informative"] == 0
    assert symmetric["mirror_follow"] is None


def test_evaluate_mirror_check_reports_the_figures(smoke_checkpoint, tmp_path_factory, tmp_path, capsys):
    data_root = tmp_path_factory.mktemp("shapes")
    out = tmp_path / "result.json"
    code = evaluate(["--checkpoint", str(smoke_checkpoint), "--data-root", str(data_root), "--split", "val",
                     "--no-meteor", "--tokenizer", "simple", "--no-cache", "--beam", "1", "--mirror-check",
                     "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    table = capsys.readouterr().out
    for key in ("mirror_words", "mirror_follow", "mirror_overlap_flipped", "columns_mirror", "columns_stay"):
        assert key in result
    assert result["mirror_words"] > 0  # the untrained model says the same words of a photo and its mirror
    assert any(line.startswith("mirror ") for line in table.splitlines())
    assert any(line.startswith("columns ") for line in table.splitlines())
    plain = tmp_path / "plain.json"
    assert evaluate(["--checkpoint", str(smoke_checkpoint), "--data-root", str(data_root), "--split", "val",
                     "--no-meteor", "--tokenizer", "simple", "--no-cache", "--beam", "1", "--out", str(plain)]) == 0
    assert "mirror_words" not in json.loads(plain.read_text())


def test_per_epoch_validation_reports_the_mirror_figures_when_asked(tmp_path):
    from captioner.config import load_config
    from captioner.training.loop import train

    def run(name, *extra):
        cfg = load_config("configs/smoke.yaml", [f"train.run_dir={tmp_path / name}", f"data.root={tmp_path / 'data'}",
                                                 "train.epochs=1", *extra])
        train(cfg)
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()][-1]

    asked = run("asked", "eval.mirror_check=true")
    assert asked["mirror_words"] >= 0 and "columns_stay" in asked
    assert "mirror_words" not in run("plain")


def test_mirrored_photos_are_prepared_like_cached_originals(smoke_checkpoint, tmp_path_factory, monkeypatch):
    """Originals decoded from the float16 feature cache meet mirrored photos rounded to the same float16 rows
    (issue 45: a float32 mirror against a float16 original could move an arg-max cell for the rounding alone)."""
    import torch

    from captioner.api import load_captioner
    from captioner.data.datasets import load_records
    from captioner.decoding.options import DecodeOptions
    from captioner.evaluation import split

    model = load_captioner(smoke_checkpoint, device="cpu")
    cfg = model.config
    cfg.data.root = str(tmp_path_factory.mktemp("shapes_cache"))
    records = load_records(cfg.data, "val")[:3]
    seen = []
    real = model.prepare_rows

    def spy(rows):
        seen.append(rows.detach().clone())
        return real(rows)

    monkeypatch.setattr(model, "prepare_rows", spy)
    options = DecodeOptions(beam=1)
    reads = split.decode_reads(model, split._grid_batches(model, records, 8, None, _NoBar()), options)[1]
    seen.clear()
    split.mirror_figures(model, records, reads, options, 8, cached_originals=True)
    assert seen and all(torch.equal(r, r.half().float()) for r in seen)  # float16 rows, as the cache serves
    seen.clear()
    split.mirror_figures(model, records, reads, options, 8, cached_originals=False)
    assert seen and not all(torch.equal(r, r.half().float()) for r in seen)  # the image's float32 rows


class _NoBar:
    def update(self, n: int) -> None:
        pass
