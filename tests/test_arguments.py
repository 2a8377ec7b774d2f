"""Numeric command-line options out of range are refused before any work, with argparse's message naming
the flag and the value (captioner/commands/arguments.py): `evaluate --beam 0` does not fall back to the
checkpoint's beam, nor `--max-images -5` drop the last five images, silently."""

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

    def fake_evaluate_model(model, records, options, **kwargs):
        seen.update(beam=options.beam, images=len(records))
        return {"scores": {}, "n_images": len(records)}

    monkeypatch.setattr(evaluate, "evaluate_model", fake_evaluate_model)
    monkeypatch.setattr(evaluate, "format_table", lambda result, split: "")
    code = evaluate.main(["--checkpoint", str(smoke_checkpoint), "--data-root", str(tmp_path / "shapes"),
                          "--split", "val", "--beam", "2", "--max-images", "3", "--no-cache", "--tokenizer", "simple"])
    assert code == 0 and seen == {"beam": 2, "images": 3}


SEARCH_FIELDS = ("beam", "attention_mode", "max_length", "length_penalty", "block_trigrams")


def test_caption_evaluate_and_serve_decode_with_the_models_config_when_no_flag_is_given(tmp_path, monkeypatch):
    """One DecodeOptions per decode, from the model's config (eval.*) in the same way for the three commands;
    what differs is each command's own default, named: <unk> is forbidden in captions for people (caption,
    serve) and the page lists every hypothesis of the beam (serve)."""
    pytest.importorskip("fastapi")
    from PIL import Image

    import captioner.api
    import captioner.commands.evaluate as evaluate
    import captioner.commands.serve as serve
    import captioner.data.datasets as datasets
    from captioner.api import build_model
    from captioner.commands.caption import main as caption
    from captioner.config import load_config
    from captioner.data.vocab import Vocab
    from captioner.decoding.options import DecodeOptions

    cfg = load_config("smoke", ["eval.beam_size=2", "eval.max_length=7", "eval.length_penalty=0.5",
                                "eval.block_trigrams=true", "model.attention.attention=hard",
                                "train.objective.kind=reinforce", "eval.attention_mode=argmax"])
    model = build_model(cfg, Vocab.build([["a", "red", "circle"]]))
    seen: dict[str, DecodeOptions] = {}
    monkeypatch.setattr(captioner.api, "load_captioner", lambda *a, **kw: model)
    monkeypatch.setattr(model, "caption", lambda images, options: seen.setdefault("caption", options) and [])
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    assert caption([str(tmp_path / "x.png")]) == 0

    monkeypatch.setattr(evaluate, "load_captioner", lambda *a, **kw: model)
    monkeypatch.setattr(datasets, "load_records", lambda data, split: [])
    monkeypatch.setattr(evaluate, "cached_grids", lambda model, records, data=None: None)
    monkeypatch.setattr(evaluate, "format_table", lambda result, split: "")
    monkeypatch.setattr(evaluate, "evaluate_model",
                        lambda model, records, options, **kw: seen.setdefault("evaluate", options) and {})
    assert evaluate.main(["--checkpoint", "unused", "--tokenizer", "simple"]) == 0

    monkeypatch.setattr(serve, "create_app", lambda model, options, **kw: seen.setdefault("serve", options))
    monkeypatch.setattr("uvicorn.run", lambda *a, **kw: None)
    assert serve.main([]) == 0

    expected = DecodeOptions.from_config(cfg)
    assert (expected.beam, expected.max_length, expected.length_penalty) == (2, 7, 0.5)  # not the defaults
    for command, options in seen.items():
        assert ({f: getattr(options, f) for f in SEARCH_FIELDS}
                == {f: getattr(expected, f) for f in SEARCH_FIELDS}), command
    assert sorted(seen) == ["caption", "evaluate", "serve"]
    assert [seen[c].forbid_unk for c in ("caption", "evaluate", "serve")] == [True, False, True]
    assert [seen[c].n_best for c in ("caption", "evaluate", "serve")] == [1, 1, 2]
    # and a flag wins over the config in each
    monkeypatch.setattr(model, "caption", lambda images, options: seen.__setitem__("caption", options) or [])
    assert caption([str(tmp_path / "x.png"), "--beam", "4", "--no-block-trigrams"]) == 0
    assert (seen["caption"].beam, seen["caption"].block_trigrams, seen["caption"].max_length) == (4, False, 7)
    # the <unk> flag turns the command's own default around
    assert caption([str(tmp_path / "x.png"), "--allow-unk"]) == 0 and seen["caption"].forbid_unk is False
    monkeypatch.setattr(evaluate, "evaluate_model",
                        lambda model, records, options, **kw: seen.__setitem__("evaluate", options) or {})
    assert evaluate.main(["--checkpoint", "unused", "--tokenizer", "simple", "--forbid-unk"]) == 0
    assert seen["evaluate"].forbid_unk is True


def test_each_decoding_default_is_stated_once_in_decode_options():
    """A config that sets no decoding decodes with DecodeOptions' own defaults (eval.max_length 0: the training
    captions' length), and a caption for people differs from them only in <unk>."""
    from captioner.config import Config
    from captioner.decoding.options import DecodeOptions

    cfg = Config()
    assert DecodeOptions.from_config(cfg) == DecodeOptions(max_length=cfg.data.max_length)
    assert DecodeOptions().for_people() == DecodeOptions(forbid_unk=True)
