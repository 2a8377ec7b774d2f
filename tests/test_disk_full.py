"""A disk that fills up during a save (issue 45): every writer says that the disk is full, with the file and
the free space (``atomic.DiskFullError``), and leaves no partial file, the previous one intact. Simulated: the
write raises what the OS, torch's zip writer or safetensors raise on a full disk (ENOSPC; torch's "enforce fail
at inline_container.cc:672 ... unexpected pos"; safetensors' "No space left on device"), and
``shutil.disk_usage`` reports what is left."""

from __future__ import annotations

import collections
import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from captioner import atomic
from captioner.atomic import DiskFullError, write_text_atomic
from captioner.store.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

TORCH_SHORT_WRITE = ("[enforce fail at inline_container.cc:672] . unexpected pos 4352 vs 4240\n"
                     "frame #0: c10::ThrowEnforceNotMet(char const*, int, char const*, std::string, void const*)")
Usage = collections.namedtuple("Usage", "total used free")


@pytest.fixture
def free_1234(monkeypatch):
    """The file system reports 1234 bytes free."""
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1234, 1234))


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   OSError(errno.EDQUOT, "Disk quota exceeded"), RuntimeError(TORCH_SHORT_WRITE)])
def test_an_atomic_write_on_a_full_disk_says_so_and_leaves_the_old_file(tmp_path, monkeypatch, free_1234, error):
    target = tmp_path / "metrics.jsonl"
    write_text_atomic(target, "old\n")

    def full(path, data):
        with atomic.atomic_path(path) as tmp:
            tmp.write_bytes(data[:3])  # a partial temp file
            raise error

    monkeypatch.setattr(atomic, "write_bytes_atomic", full)
    with pytest.raises(DiskFullError) as info:
        atomic.write_text_atomic(target, "new\n" * 1000)
    message = str(info.value)
    full = "your disk quota is used up" if getattr(error, "errno", None) == errno.EDQUOT else "the disk is full"
    assert message.startswith(f"cannot write {target}: {full} (1.2 kB free on the file system holding {tmp_path}")
    assert info.value.errno == errno.ENOSPC and info.value.path == target and info.value.free == 1234
    assert info.value.__cause__ is error
    assert target.read_text() == "old\n" and _only(tmp_path) == ["metrics.jsonl"]


def test_raise_if_disk_full_names_the_file_for_writers_of_their_own(tmp_path, free_1234):
    """What a writer outside atomic_path (the feature cache's appends) calls on its errors."""
    with pytest.raises(DiskFullError, match=r"cannot append to .*grids\.f16: the disk is full \(1\.2 kB free"):
        atomic.raise_if_disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "grids.f16",
                                  action="append to")
    atomic.raise_if_disk_full(OSError(errno.EIO, "I/O error"), tmp_path / "grids.f16")  # not a full disk: returns
    assert not atomic.is_disk_full(ValueError("unexpected position 3 in JSON"))


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(PermissionError):
        write_text_atomic(tmp_path / "x.json", "{}")
    assert _only(tmp_path) == []


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError(TORCH_SHORT_WRITE)])
def test_a_checkpoint_save_on_a_full_disk_says_so_and_keeps_the_previous_one(tmp_path, monkeypatch, free_1234,
                                                                              error):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})

    def short_write(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise error

    monkeypatch.setattr(torch, "save", short_write)
    with pytest.raises(DiskFullError) as info:
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    assert isinstance(info.value, CheckpointError)  # what the training loop and the commands already catch
    assert str(info.value).startswith(f"cannot save checkpoint {path}: the disk is full (1.2 kB free")
    monkeypatch.undo()
    assert _only(tmp_path) == ["last.pt"] and load_checkpoint(path)["step"] == 1


def test_an_export_on_a_full_disk_leaves_the_previous_folder(tmp_path, monkeypatch, smoke_checkpoint, free_1234):
    from safetensors import SafetensorError

    from captioner.api import load_captioner
    from captioner.store import hub

    model = load_captioner(smoke_checkpoint, device="cpu")
    folder = model.save_pretrained(tmp_path / "tiny", dtype="float32")
    before = {name: (folder / name).read_bytes() for name in _only(folder)}

    def full_weights(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    real_write = hub.write_text_atomic

    def full_config(path, text):  # the weights fit, and then config.json does not
        if Path(path).name == hub.CONFIG_FILE:
            raise DiskFullError(path, 0, OSError(errno.ENOSPC, "No space left on device"))
        real_write(path, text)

    import safetensors.torch

    for patch in ((safetensors.torch, "save_file", full_weights), (hub, "write_text_atomic", full_config)):
        with monkeypatch.context() as m:
            m.setattr(*patch)
            with pytest.raises(DiskFullError, match=r"the disk is full \((1\.2 kB|0 B) free"):
                model.save_pretrained(folder, dtype="float16")
        assert {name: (folder / name).read_bytes() for name in _only(folder)} == before
    assert load_captioner(folder, device="cpu") is not None


def test_a_results_file_on_a_full_disk(tmp_path, monkeypatch, free_1234):
    from captioner.evaluation.results import write_results

    Record = collections.namedtuple("Record", "image_id path")
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(DiskFullError, match=f"cannot write {tmp_path / 'results.json'}: the disk is full"):
        write_results(tmp_path / "results.json", [Record("1", "1.jpg")], {"1": "a cat"})
    assert _only(tmp_path) == []


def test_evaluate_out_on_a_full_disk_prints_the_scores_and_the_reason(tmp_path, monkeypatch, smoke_checkpoint,
                                                                       capsys, free_1234):
    from captioner.commands import evaluate

    def full(path, text):
        raise DiskFullError(path, shutil.disk_usage(tmp_path).free, OSError(errno.ENOSPC, "No space left"))

    monkeypatch.setattr(evaluate, "write_text_atomic", full)
    out = tmp_path / "result.json"
    assert evaluate.main(["--checkpoint", str(smoke_checkpoint), "--data-root", str(tmp_path / "shapes"),
                          "--split", "val", "--max-images", "2", "--beam", "1", "--no-meteor", "--tokenizer",
                          "simple", "--no-cache", "--device", "cpu", "--json", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_images"] == 2  # the scores of the whole decode are not lost
    assert f"captioner evaluate: cannot write {out}: the disk is full (1.2 kB free" in captured.err
    assert not out.exists()


def test_the_feature_cache_reserves_its_blocks_and_names_a_full_disk(tmp_path, monkeypatch, free_1234):
    """A memmap store into a sparse file on a full disk is a SIGBUS; the cache reserves its file's blocks first, so a
    full disk is an error named before extraction writes a row."""
    from captioner.data import features

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(DiskFullError, match=r"grids\.f16.*disk is full"):
        features.CacheWriter(tmp_path / "cache", ["a", "b"], {"encoder": "x"}, (2, 2), 8)


def test_the_feature_cache_file_is_allocated_not_sparse(tmp_path):
    from captioner.data import features

    writer = features.CacheWriter(tmp_path / "cache", ["a", "b", "c"], {"encoder": "x"}, (7, 7), 64)
    with writer:
        pass
    grids = tmp_path / "cache" / features.GRIDS_FILE
    assert grids.stat().st_size == 3 * 49 * 64 * 2
    if hasattr(os, "posix_fallocate"):
        assert grids.stat().st_blocks * 512 >= grids.stat().st_size  # every block on disk


def test_an_overlay_on_a_full_disk_says_so_and_leaves_nothing(tmp_path, monkeypatch, free_1234):
    """Overlays (caption --attention-out, the demo) are written whole through the atomic writer, so a full disk
    is named and no truncated PNG is left behind."""
    import numpy as np

    from captioner import visualize

    def full(fd, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    result = {"words": ["a", "dog"], "alphas": np.full((2, 4), 0.25), "grid_hw": (2, 2)}
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    monkeypatch.setattr(atomic.os, "fdopen", full)
    with pytest.raises(DiskFullError, match=r"overlay\.png.*disk is full"):
        visualize.save_overlay(image, result, tmp_path / "overlay.png")
    assert _only(tmp_path) == []


def test_extract_and_train_on_a_full_disk_name_the_space_needed_and_leave_no_grid_file(tmp_path, monkeypatch,
                                                                                        free_1234, capsys):
    """Reserving the feature cache on a full disk was a traceback in `captioner extract` and `train` (rc 1, two
    tracebacks) that left a sparse grids.f16 without an index while saying nothing was left half written."""
    import os

    from captioner.commands.extract import main as extract
    from captioner.commands.train import main as train

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    smoke = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
    sets = ["--set", f"data.root={tmp_path / 'data'}", "--set", f"train.run_dir={tmp_path / 'run'}",
            "--set", "train.num_threads=1"]
    for command in (extract, train):
        assert command(["--config", str(smoke), *sets]) == 1
        err = capsys.readouterr().err
        assert "cannot reserve the feature cache" in err and "the disk is full (1.2 kB free" in err
        assert "needed" in err and "Traceback" not in err
        assert not list((tmp_path / "data").rglob("grids.f16"))


def test_every_command_prints_a_full_disk_as_its_error(monkeypatch, capsys, free_1234):
    """A full disk met by any command (an overlay of `caption`, the shapes of `shapes`, ...) is its error line and
    exit status 1, never a traceback (cli.main is where every command runs)."""
    import captioner.cli as cli

    def writes(argv):
        raise DiskFullError("out/overlay.png", 1234, OSError(errno.ENOSPC, "No space left on device"),
                            action="write the overlay", needed=5000)

    monkeypatch.setattr(cli, "_command", lambda name: writes)
    assert cli.main(["caption", "photo.jpg"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("captioner caption: error: cannot write the overlay out/overlay.png: the disk is full "
                          "(1.2 kB free") and "5.0 kB needed" in err
