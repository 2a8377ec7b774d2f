"""Tests for captioner/store/checkpoint.py: bit-exact round trip, atomic save under SIGKILL,
clear errors for missing / truncated / corrupted / foreign / newer files, refusal of
crafted pickles (no code runs), refusal to save unloadable payloads, and state-dict /
vocabulary compatibility messages that name the offending key."""

from __future__ import annotations

import builtins
import collections
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from captioner.store.checkpoint import (
    DIGEST_KEY,
    FORMAT_VERSION,
    CheckpointError,
    check_state_dict,
    check_vocab,
    find_unsafe_values,
    load_checkpoint,
    payload_digest,
    save_checkpoint,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _bits(t: torch.Tensor) -> torch.Tensor:
    # Byte view, so NaNs and -0.0 compare exactly (torch.equal treats NaN != NaN).
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _assert_same(a, b, where="payload"):
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(_bits(a), _bits(b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


def _training_like_payload() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(30, 8), torch.nn.LSTM(8, 16, batch_first=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    out, _ = model(torch.randint(0, 30, (2, 5)))
    out.sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "epoch": 3,
        "step": 1234,
        "baseline": None,
        "config": {"train": {"lr": 1e-3, "epochs": 10}, "model": {"attention": "soft", "heads": 1}},
        "vocab": {"words": ["<pad>", "<start>", "<end>", "<unk>", "a", "red", "circle"], "min_count": 1},
        "metrics": {"CIDEr": 91.25, "METEOR": None, "history": [1.0, 0.5]},
        "odd_tensors": {
            "half": torch.tensor([1.5, float("nan"), -0.0], dtype=torch.float16),
            "bf16": torch.randn(3, dtype=torch.bfloat16),
            "bool": torch.tensor([True, False]),
            "empty": torch.empty(0, 7),
            "scalar": torch.tensor(3.25),
            "view": torch.arange(20.0).view(4, 5)[:, 1:3],
        },
    }


# ------------------------------------------------------------------ round trip


def test_round_trip_is_bit_exact(tmp_path):
    payload = _training_like_payload()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, payload)
    loaded = load_checkpoint(path)
    assert loaded["format_version"] == FORMAT_VERSION
    assert "format_version" not in payload, "save_checkpoint must not modify the caller's dict"
    _assert_same(dict(payload, format_version=FORMAT_VERSION), loaded)
    # The loaded state still drives a model and optimizer.
    model = torch.nn.Sequential(torch.nn.Embedding(30, 8), torch.nn.LSTM(8, 16, batch_first=True))
    model.load_state_dict(loaded["model"])
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.load_state_dict(loaded["optimizer"])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_overwrite_and_parent_creation(tmp_path):
    path = tmp_path / "run" / "nested" / "last.pt"
    save_checkpoint(path, {"step": 1})
    save_checkpoint(path, {"step": 2})
    assert load_checkpoint(path)["step"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"], "no temp files left after clean saves"


safe_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=10),
    st.sampled_from([torch.float16, torch.int64, torch.device("cpu"), torch.Size([2, 3])]),
    st.builds(lambda xs: torch.tensor(xs, dtype=torch.float32), st.lists(st.floats(width=32), max_size=5)),
)
safe_payloads = st.recursive(
    safe_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), children, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=safe_payloads)
def test_any_plain_payload_round_trips(tmp_path, value):
    assert find_unsafe_values({"v": value}) == []
    path = tmp_path / "prop.pt"
    save_checkpoint(path, {"v": value})
    _assert_same(value, load_checkpoint(path)["v"], "v")


# ------------------------------------------------------------------ atomicity

_WRITER = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    from captioner.store.checkpoint import save_checkpoint
    path = sys.argv[1]
    data = torch.empty(16 * 1024 * 1024)  # 64 MB of float32: a save takes long enough to be hit mid-write
    for i in range(1000000):
        data.fill_(float(i))
        save_checkpoint(path, {"iteration": i, "data": data, "tail": torch.full((5,), float(i))})
        print(i, flush=True)
    """
)


@pytest.mark.slow
def test_sigkill_mid_save_keeps_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_mid_write = False
    try:
        assert proc.stdout.readline().strip() == b"0", proc.stderr.read().decode()[-2000:]
        # The first checkpoint is complete; now wait until the next save's temp file
        # exists (bytes are being written, path not yet replaced) and kill right then.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list(tmp_path.glob(".last.pt.tmp-*")):
                proc.send_signal(signal.SIGKILL)
                killed_mid_write = True
                break
            time.sleep(0.0005)
    finally:
        proc.kill()
        proc.communicate(timeout=30)  # reaps the child and closes its pipes
    assert killed_mid_write, "never saw a save in progress"
    assert proc.returncode == -signal.SIGKILL

    loaded = load_checkpoint(path)  # the last completed save, whole
    i = loaded["iteration"]
    assert loaded["data"].shape == (16 * 1024 * 1024,)
    assert bool((loaded["data"] == float(i)).all()) and torch.equal(loaded["tail"], torch.full((5,), float(i)))
    # A killed save may leave its hidden temp file; it never looks like a checkpoint.
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last.pt"]
    assert all(name.startswith(".last.pt.tmp-") and not name.endswith(".pt") for name in leftovers), leftovers
    assert load_checkpoint(tmp_path)["iteration"] == i, "a run directory resolves to last.pt, not the temp file"


def test_failed_save_removes_temp_file_and_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(CheckpointError, match="No space left on device") as info:
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    assert str(path) in str(info.value)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert load_checkpoint(path)["step"] == 1


# ------------------------------------------------------------- damaged files


def _good_file(tmp_path: Path, legacy: bool = False) -> Path:
    path = tmp_path / "good.pt"
    payload = {"format_version": 1, "model": {"w": torch.randn(2000)}, "step": 7}
    if legacy:
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        save_checkpoint(path, payload)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found: .*nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_truncated_file(tmp_path, legacy):
    good = _good_file(tmp_path, legacy)
    data = good.read_bytes()
    bad = tmp_path / "half.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupted") as info:
        load_checkpoint(bad)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"", os.urandom(4096), b"hello world\n" * 100, b"PK\x03\x04" + os.urandom(500)],
    ids=["empty", "random", "text", "fake-zip-header"],
)
def test_garbage_file(tmp_path, content):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(content)
    with pytest.raises(CheckpointError, match="truncated or corrupted") as info:
        load_checkpoint(bad)
    assert str(bad) in str(info.value)


def test_flipped_bytes_inside_tensor_data_are_not_silently_accepted_as_other_errors(tmp_path):
    # Overwriting the zip's central directory must be reported as corruption, not a crash.
    good = _good_file(tmp_path)
    data = bytearray(good.read_bytes())
    data[-100:] = os.urandom(100)
    good.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(good)


def test_a_flipped_byte_inside_a_saved_tensor_is_refused_naming_the_file(tmp_path):
    weights = torch.arange(1000, dtype=torch.float32)
    path = tmp_path / "run" / "last.pt"
    save_checkpoint(path, {"model": {"w": weights}, "step": 3})
    data = bytearray(path.read_bytes())
    at = bytes(data).find(weights.numpy().tobytes())
    assert at >= 0  # torch's zip entries are stored, not compressed: the elements' bytes are in the file
    data[at + 4 * 500 + 1] ^= 0x01  # one bit of element 500
    path.write_bytes(bytes(data))
    raw = torch.load(path, weights_only=True)  # torch reads the changed value without a word ...
    assert raw["model"]["w"][500] != 500.0 and torch.equal(raw["model"]["w"][:500], weights[:500])
    with pytest.raises(CheckpointError, match="corrupted: its contents do not match the SHA-256") as info:
        load_checkpoint(path)  # ... the digest does not let it through
    assert str(path) in str(info.value)


def test_a_changed_plain_value_is_refused(tmp_path):
    import struct

    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"model": {}, "metrics": {"best": 0.123456789}})
    data = path.read_bytes()
    packed = struct.pack(">d", 0.123456789)  # pickle's BINFLOAT: 8 big-endian bytes
    assert data.count(packed) == 1
    path.write_bytes(data.replace(packed, struct.pack(">d", 0.987654321)))
    assert torch.load(path, weights_only=True)["metrics"]["best"] == 0.987654321
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(path)


def test_digest_is_checked_for_the_current_format_and_dropped_from_the_result(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(3)}, "format_version": 1})
    loaded = load_checkpoint(path)
    assert loaded["format_version"] == FORMAT_VERSION and DIGEST_KEY not in loaded
    assert torch.load(path, weights_only=True)[DIGEST_KEY] == payload_digest(loaded)
    stripped = torch.load(path, weights_only=True)
    del stripped[DIGEST_KEY]
    torch.save(stripped, path)  # a current-format file without its digest
    with pytest.raises(CheckpointError, match=f"must hold its payload's SHA-256 under '{DIGEST_KEY}'"):
        load_checkpoint(path)
    stripped["format_version"] = 1  # written before digests: still loads
    torch.save(stripped, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(3))


def test_not_a_captioner_checkpoint(tmp_path):
    path = tmp_path / "x.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="not a captioner checkpoint.*list"):
        load_checkpoint(path)
    torch.save({"state_dict": {"w": torch.ones(1)}}, path)
    with pytest.raises(CheckpointError, match="no 'format_version' key .*state_dict"):
        load_checkpoint(path)


def test_newer_format_version(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({"format_version": FORMAT_VERSION + 1, "model": {}}, path)
    with pytest.raises(CheckpointError, match=f"format {FORMAT_VERSION + 1}, newer .*upgrade"):
        load_checkpoint(path)
    torch.save({"format_version": "1"}, path)
    with pytest.raises(CheckpointError, match="invalid format_version"):
        load_checkpoint(path)


# ------------------------------------------------------------ crafted pickles


class _SystemGadget:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


class _ExecGadget:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize("gadget", [_SystemGadget, _ExecGadget], ids=["os.system", "exec"])
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_crafted_pickle_is_refused_and_never_runs(tmp_path, gadget, legacy):
    evil = tmp_path / "evil.pt"
    marker = tmp_path / "pwned"
    payload = {"format_version": 1, "model": {"w": torch.ones(2)}, "metrics": gadget(marker)}
    torch.save(payload, evil, _use_new_zipfile_serialization=not legacy)

    with pytest.raises(CheckpointError, match="not plain weights/data; refusing to load") as info:
        load_checkpoint(evil)
    assert str(evil) in str(info.value)
    assert not marker.exists(), "loading a checkpoint ran code from the file"

    # Control: the file really is dangerous, so the check above could have failed.
    torch.load(evil, weights_only=False)
    assert marker.exists()


# ------------------------------------------------------- refusing bad payloads


@pytest.mark.parametrize(
    "payload, where, kind",
    [
        ({"rng": {"numpy": np.random.get_state()}}, 'payload["rng"]["numpy"][1]', "numpy.ndarray"),
        ({"metrics": {"BLEU-4": np.float64(0.3)}}, "payload[\"metrics\"][\"BLEU-4\"]", "numpy.float64"),
        ({"config": {"model": collections.defaultdict(list)}}, 'payload["config"]["model"]', "defaultdict"),
        ({"extra": [1, {"fn": len}]}, 'payload["extra"][1]["fn"]', "builtin_function_or_method"),
        ({"vocab": {"words": {"a", "b"}}}, 'payload["vocab"]["words"]', "set"),
        ({"bad_key": {Path("x"): 1}}, 'payload["bad_key"] has a key', "PosixPath"),
        ({"blob": b""}, 'payload["blob"]', "bytes"),  # protocol 2 pickles b"" as a call to bytes()
    ],
    ids=["numpy-array", "numpy-scalar", "defaultdict", "function", "set", "path-key", "bytes"],
)
def test_save_refuses_unloadable_values_naming_the_key(tmp_path, payload, where, kind):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1})
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(path, payload)
    message = str(info.value)
    assert where.replace("'", '"') in message.replace("'", '"'), message
    assert kind in message and str(path) in message
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert load_checkpoint(path)["step"] == 1, "a refused save must not touch the previous checkpoint"


def test_save_refuses_custom_object(tmp_path):
    class Thing:
        pass

    with pytest.raises(CheckpointError, match=r'payload\[.model.\]\[.head.\] is a .*Thing'):
        save_checkpoint(tmp_path / "x.pt", {"model": {"head": Thing()}})
    assert not (tmp_path / "x.pt").exists()


# -------------------------------------------------------------- run directories


def test_run_directory_prefers_best_then_last(tmp_path):
    save_checkpoint(tmp_path / "last.pt", {"which": "last"})
    assert load_checkpoint(tmp_path)["which"] == "last"
    save_checkpoint(tmp_path / "best.pt", {"which": "best"})
    assert load_checkpoint(tmp_path)["which"] == "best"
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="checkpoint not found: .*empty_run.*best.pt or last.pt"):
        load_checkpoint(empty)


# -------------------------------------------------------------- compatibility


def test_state_dict_shape_mismatch_names_the_key():
    ckpt = {"decoder.embedding.weight": torch.zeros(100, 8), "decoder.fc.bias": torch.zeros(100)}
    model = {"decoder.embedding.weight": torch.zeros(90, 8), "decoder.fc.bias": torch.zeros(100)}
    with pytest.raises(CheckpointError) as info:
        check_state_dict(ckpt, model)
    message = str(info.value)
    assert "decoder.embedding.weight: checkpoint (100, 8) vs model (90, 8)" in message
    assert "decoder.fc.bias" not in message


def test_state_dict_missing_and_unexpected_keys():
    a = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).state_dict()
    b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).state_dict()
    check_state_dict(a, a)  # identical: no error
    with pytest.raises(CheckpointError) as info:
        check_state_dict(a, b)
    message = str(info.value)
    assert "missing from checkpoint: 1.weight, 1.bias" in message
    assert "not in model: 2.weight, 2.bias" in message


def test_vocab_mismatch_messages():
    words = ["<pad>", "<start>", "<end>", "<unk>", "a", "red", "circle"]
    check_vocab({"words": words}, list(words))
    with pytest.raises(CheckpointError, match="checkpoint has 7 words, the given vocabulary 6"):
        check_vocab({"words": words}, words[:-1])
    swapped = words[:4] + ["red", "a", "circle"]
    with pytest.raises(CheckpointError, match="first difference at id 4: checkpoint 'a' vs given 'red'"):
        check_vocab({"words": words}, swapped)

    class FakeVocab:
        def __init__(self, w):
            self.words = w

    check_vocab({"words": words}, FakeVocab(words))
    with pytest.raises(CheckpointError, match="no 'words' key"):
        check_vocab({"itos": words}, words)
