"""`captioner evaluate` on the smoke checkpoint (a random tiny model) and six 64-pixel shapes images: the
decoding options it takes reach the decode and its output says what was done."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from captioner.commands.evaluate import main as evaluate


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


def test_jpeg_quality_changes_the_grids_the_encoder_gives(smoke_checkpoint, tmp_path):
    import numpy as np
    import torch
    from PIL import Image

    from captioner import load_captioner
    from captioner.evaluation.split import _grid_batches

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)  # noise: detail at every pixel
    arr[::2, :, 0] = 255  # and one-pixel stripes
    Image.fromarray(arr).save(tmp_path / "fine.png")
    records = [SimpleNamespace(image_id="fine", path=tmp_path / "fine.png")]
    model = load_captioner(smoke_checkpoint).eval()
    bar = SimpleNamespace(update=lambda n: None)

    def grid(quality):
        with torch.no_grad():
            ((_, g),) = list(_grid_batches(model, records, 1, None, bar, quality))
        return g  # (1, L, D)

    original, again = grid(None), grid(None)
    assert torch.equal(original, again)  # the comparison below is not noise
    for quality in (30, 95):
        change = (grid(quality) - original).abs().max() / original.abs().max()
        assert change > 0.05, quality  # relative to the grid's largest value


@pytest.mark.parametrize("quality", ["0", "101"])
def test_jpeg_quality_out_of_range_is_refused_naming_the_value(quality, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate(["--checkpoint", "unused", "--jpeg-quality", quality])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--jpeg-quality" in err and f"got {quality}" in err and "1..95" in err


def test_jpeg_quality_is_in_the_header_and_reads_the_images(smoke_checkpoint, data_root, tmp_path, capsys):
    result = run_evaluate(smoke_checkpoint, data_root, tmp_path / "jpeg.json", "--beam", "1", "--jpeg-quality", "75")
    head = capsys.readouterr().out.splitlines()[0]
    assert "inputs re-encoded as JPEG quality 75" in head and "grids from images" in head
    assert result["jpeg_quality"] == 75 and result["grids"] == "images"
    plain = run_evaluate(smoke_checkpoint, data_root, tmp_path / "plain.json", "--beam", "1")
    assert plain["jpeg_quality"] is None and "re-encoded" not in capsys.readouterr().out


def test_evaluate_model_refuses_jpeg_quality_with_a_feature_cache(smoke_checkpoint):
    from captioner import load_captioner
    from captioner.evaluation.split import evaluate_model

    with pytest.raises(ValueError, match="jpeg_quality=75 .*feature cache"):
        evaluate_model(load_captioner(smoke_checkpoint), [], cache=object(), jpeg_quality=75)
    with pytest.raises(ValueError, match="got 0"):
        evaluate_model(load_captioner(smoke_checkpoint), [], jpeg_quality=0)


def test_data_root_reads_elsewhere_without_writing_into_the_models_config(smoke_checkpoint, data_root, tmp_path,
                                                                         monkeypatch):
    """--data-root reads the photos from another root; the loaded model's config keeps its own (an export or a
    later decode from the same object sees the checkpoint's root)."""
    import captioner.commands.evaluate as command

    loaded = []
    real = command.load_captioner

    def keep(*args, **kwargs):
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(command, "load_captioner", keep)
    read = []
    import captioner.data.datasets as datasets

    real_load = datasets.load_records
    monkeypatch.setattr(datasets, "load_records", lambda data, split: read.append(data.root) or real_load(data, split))
    out = tmp_path / "r.json"
    assert evaluate(["--checkpoint", str(smoke_checkpoint), "--data-root", str(data_root), "--split", "val",
                     "--no-meteor", "--tokenizer", "simple", "--no-cache", "--out", str(out)]) == 0
    before = real(str(smoke_checkpoint)).config.data.root
    assert read == [str(data_root)] and loaded[0].config.data.root == before != str(data_root)


def test_diverse_beam_search_comes_from_the_config_and_is_checked_there():
    from captioner.config import ConfigError, load_config
    from captioner.decoding.options import DecodeOptions

    cfg = load_config("smoke", ["eval.beam_size=4", "eval.beam_groups=2", "eval.diversity=0.5"])
    options = DecodeOptions.from_config(cfg)
    assert (options.beam, options.beam_groups, options.diversity) == (4, 2, 0.5)
    with pytest.raises(ConfigError, match=r"eval.beam_groups: must divide beam \(4\) evenly, got 3"):
        load_config("smoke", ["eval.beam_size=4", "eval.beam_groups=3", "eval.diversity=0.5"])
    with pytest.raises(ConfigError, match="eval.diversity: 0.5 needs beam_groups > 1"):
        load_config("smoke", ["eval.diversity=0.5"])
    with pytest.raises(ConfigError, match="eval.diversity: must be > 0 with beam_groups 2"):
        load_config("smoke", ["eval.beam_size=4", "eval.beam_groups=2"])
