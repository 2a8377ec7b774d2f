"""Numeric command-line options out of range are refused before any work, with argparse's message naming
the flag and the value (captioner/arguments.py): `evaluate --beam 0` used to fall back to the checkpoint's
beam and `--max-images -5` to drop the last five images, both silently."""

from __future__ import annotations

import pytest

from captioner.cli import main as cli


@pytest.mark.parametrize("argv, flag, value", [
    (["evaluate", "--checkpoint", "unused", "--beam", "0"], "--beam", "0"),
    (["evaluate", "--checkpoint", "unused", "--max-images", "-5"], "--max-images", "-5"),
    (["evaluate", "--checkpoint", "unused", "--max-length", "0"], "--max-length", "0"),
    (["caption", "x.png", "--beam", "0"], "--beam", "0"),
    (["caption", "x.png", "--batch-size", "0"], "--batch-size", "0"),
    (["caption", "x.png", "--beam", "2", "--n-best", "3"], "--n-best", "3"),
    (["serve", "--port", "70000"], "--port", "70000"),
    (["serve", "--beam", "-1"], "--beam", "-1"),
    (["serve", "--max-in-flight", "0"], "--max-in-flight", "0"),
    (["serve", "--max-pixels", "0"], "--max-pixels", "0"),
    (["extract", "--batch-size", "0"], "--batch-size", "0"),
    (["shapes", "--out", "unused", "--n-train", "-1"], "--n-train", "-1"),
    (["demo", "--time-budget", "-60"], "--time-budget", "-60"),
    (["demo", "--n-captions", "nan"], "--n-captions", "nan"),
])
def test_out_of_range_values_are_refused_naming_the_flag(argv, flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and value in err, err


def test_evaluate_beam_and_max_images_reach_the_run(smoke_checkpoint, tmp_path, monkeypatch):
    """In range, the values are used as given: an explicit beam is not replaced by the checkpoint's."""
    import captioner.commands.evaluate as evaluate

    seen = {}

    def fake_evaluate_model(model, records, beam_size, **kwargs):
        seen.update(beam=beam_size, images=len(records))
        return {"scores": {}, "n_images": len(records)}

    monkeypatch.setattr(evaluate, "evaluate_model", fake_evaluate_model)
    monkeypatch.setattr(evaluate, "format_table", lambda result, split: "")
    code = evaluate.main(["--checkpoint", str(smoke_checkpoint), "--data-root", str(tmp_path / "shapes"),
                          "--split", "val", "--beam", "2", "--max-images", "3", "--no-cache", "--tokenizer", "simple"])
    assert code == 0 and seen == {"beam": 2, "images": 3}
