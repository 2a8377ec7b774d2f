"""Every file the project writes and later reads again is written atomically (captioner/atomic.py): the
target is never opened for writing, a temp file beside it is renamed onto it, and a write that fails
half-way leaves the previous file as it was.

Seen through Python's audit events (tests/file_events.py: "open" with a write mode or flags, "os.rename"
which os.replace raises), so the tests hold whatever writer a function uses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from file_events import file_events  # tests/file_events.py

from captioner.atomic import write_text_atomic
from captioner.config import Config, load_config, save_config


def _assert_atomic(events: list[tuple[str, str]], target: Path) -> None:
    target = os.path.abspath(target)
    assert ("write", target) not in events, f"{target} was opened for writing in place"
    assert ("rename", target) in events, f"nothing was renamed onto {target}"


def test_the_recorder_sees_an_in_place_write(tmp_path):
    target = tmp_path / "plain.txt"
    with file_events() as events:
        target.write_text("x")
    assert ("write", os.path.abspath(target)) in events and not any(e == "rename" for e, _ in events)


def test_save_config_is_atomic(tmp_path):
    target = tmp_path / "config.yaml"
    save_config(Config(), target)  # a first version, as a resume finds it
    with file_events() as events:
        save_config(load_config(None, ["train.epochs=7"]), target)
    _assert_atomic(events, target)
    assert load_config(target).train.epochs == 7


def test_metrics_log_and_vocabulary_are_atomic(tmp_path):
    from captioner.data.vocab import Vocab
    from captioner.training.loop import _write_metrics

    with file_events() as events:
        _write_metrics(tmp_path / "metrics.jsonl", [{"epoch": 1}, {"epoch": 2}])
        Vocab.build([["a", "cat"]]).save(tmp_path / "vocab.json")
    _assert_atomic(events, tmp_path / "metrics.jsonl")
    _assert_atomic(events, tmp_path / "vocab.json")
    assert [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_export_writes_its_model_folder_atomically(tmp_path, smoke_checkpoint):
    from captioner.api import export_model, load_captioner
    from captioner.store.hub import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE

    folder = tmp_path / "tiny"
    with file_events() as events:
        export_model(smoke_checkpoint, folder, dtype="float32")
    for name in (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE):
        _assert_atomic(events, folder / name)
    assert load_captioner(folder).vocab is not None
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no temp file left


def test_evaluate_out_is_atomic(tmp_path, smoke_checkpoint):
    from captioner.commands.evaluate import main as evaluate

    out = tmp_path / "result.json"
    with file_events() as events:
        assert evaluate(["--checkpoint", str(smoke_checkpoint), "--data-root", str(tmp_path / "shapes"),
                         "--split", "val", "--max-images", "2", "--beam", "1", "--no-meteor",
                         "--tokenizer", "simple", "--no-cache", "--json", "--out", str(out)]) == 0
    _assert_atomic(events, out)
    assert json.loads(out.read_text())["n_images"] == 2


def test_a_failed_write_leaves_the_previous_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "config.yaml"
    write_text_atomic(target, "old: 1\n")

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(target, "new: 2\n")
    assert target.read_text() == "old: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
