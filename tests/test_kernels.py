"""The fused C kernels (captioner/fast/kernels) against the PyTorch code they replace.

- The additive scorer: forward and backward agree with autograd through tanh(p + q) @ v for one and several
  queries per key row, strided queries and sizes that are not a multiple of the vector width; the results
  do not depend on the thread count; the scorer uses it where it applies.
- The searches' read of raw logits (search.Logits.best): the same words and log-probs as the PyTorch path,
  banned words counted in the normaliser, ties to the lower id, the output layer's bias added on the fly
  exactly as an add would, the PyTorch path for rows it does not serve;
  a whole beam search gives the same captions with and without all three kernels.
- The LSTM cell of a decoding step (with projected values also the gate and the gate sums): the same h, c and
  gated L_z z as the PyTorch ops, strided inputs as the decoder hands them; used only without autograd.
- Without a compiler (or with CAPTIONER_KERNELS=0) the PyTorch path runs, with one warning that says why.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from captioner.decoding.options import DecodeOptions
from captioner.decoding.search import Logits, beam_search
from captioner.fast import kernels
from captioner.fast.kernels import build
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.models.scorers import AdditiveScorer

if not kernels.available() and os.environ.get("CAPTIONER_REQUIRE_KERNELS") != "1":
    pytest.skip("the fused kernels cannot be built here (no C compiler or no libmvec)", allow_module_level=True)


def _reference(q, prepared, v):
    M, L, A = prepared.shape
    hidden = torch.tanh(prepared.unsqueeze(1) + q.reshape(M, -1, 1, A))  # (M, G, L, A)
    return (hidden @ v.reshape(-1)).reshape(-1, L)  # (M*G, L)


@pytest.mark.parametrize("M,G,L,A", [(3, 1, 7, 32), (2, 5, 4, 19), (1, 3, 1, 1), (4, 2, 9, 100)])
@pytest.mark.parametrize("strided", [False, True])
def test_scores_and_gradients_equal_autograd(M, G, L, A, strided):
    g = torch.Generator().manual_seed(M * 100 + G * 10 + A)
    prepared = torch.randn(M, L, A, generator=g, requires_grad=True)
    wide = torch.randn(M * G, A + 5, generator=g)  # q as a column slice, as the decoder's split hands it over
    q = (wide[:, 2:2 + A] if strided else wide[:, :A].contiguous()).requires_grad_()
    v = (torch.randn(1, A, generator=g) / A ** 0.5).requires_grad_()
    weights = torch.randn(M * G, L, generator=g)

    fast = kernels.additive_scores(q, prepared, v)
    ref = _reference(q, prepared, v)
    torch.testing.assert_close(fast, ref, atol=2e-6, rtol=1e-5)
    fast_grads = torch.autograd.grad((fast * weights).sum(), (q, prepared, v))
    ref_grads = torch.autograd.grad((ref * weights).sum(), (q, prepared, v))
    for name, a, b in zip(("q", "prepared", "v"), fast_grads, ref_grads):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"gradient of {name} differs")


def test_results_do_not_depend_on_the_thread_count():
    g = torch.Generator().manual_seed(0)
    prepared, q, v = torch.randn(8, 49, 64, generator=g), torch.randn(40, 64, generator=g), torch.randn(64, generator=g)
    prepared.requires_grad_()
    q.requires_grad_()
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            e = kernels.additive_scores(q, prepared, v)
            runs.append((e, *torch.autograd.grad(e.square().sum(), (q, prepared))))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_scorer_uses_the_kernel_where_it_applies(monkeypatch):
    torch.manual_seed(0)
    scorer = AdditiveScorer(12, 10, 16)
    keys, h = torch.randn(3, 5, 12), torch.randn(6, 10)  # two queries per image
    calls = []
    real = kernels.additive_scores
    monkeypatch.setattr(kernels, "additive_scores", lambda *a: calls.append(1) or real(*a))
    fused = scorer(h, scorer.prepare(keys))
    assert calls, "float32 on the CPU should run the kernel"
    scorer.fused = False
    plain = scorer(h, scorer.prepare(keys))
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-5)
    calls.clear()
    scorer.fused = True
    scorer.double()(h.double(), scorer.prepare(keys.double()))  # float64: the PyTorch path
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scorer.float()(h, scorer.prepare(keys))
    assert not calls


def _best(logits, k, banned, fused):
    saved, Logits.fused = Logits.fused, fused
    try:
        return Logits(logits.clone()).best(k, banned)
    finally:
        Logits.fused = saved


@pytest.mark.parametrize("k,banned", [(1, []), (5, [0, 1, 2]), (3, [7]), (10, list(range(0, 600, 3)))])
def test_best_words_equal_the_pytorch_read(k, banned):
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(37, 1003, generator=g) * 4  # 1003: a partial group of 16 at the end
    logits[:, 1000] += 30  # a last-group word is the best of every row
    logits[4, 2] = 150.0  # a banned word holds a row's maximum, 100+ above the rest: the normaliser must shift by it
    fast = kernels.row_best_log_probs(logits, k, banned)
    assert fast is not None
    ref = _best(logits, k, banned, fused=False)
    assert torch.equal(fast[1], ref[1])
    torch.testing.assert_close(fast[0], ref[0], atol=1e-5, rtol=1e-6)
    dense = torch.log_softmax(logits, 1)  # the definition: log-probs of the full softmax, banned words included
    torch.testing.assert_close(fast[0], dense.gather(1, fast[1]), atol=1e-5, rtol=1e-6)
    assert not torch.isin(fast[1], torch.tensor(banned, dtype=torch.long)).any()
    assert _best(logits, k, banned, fused=True)[1].equal(fast[1])  # Logits.best reads through the kernel


def test_best_words_ties_go_to_the_lower_id_and_odd_rows_fall_back():
    logits = torch.zeros(2, 300)
    logits[0, [250, 20, 100]] = 5.0  # a three-way tie
    values, ids = kernels.row_best_log_probs(logits, 2, [])
    assert ids[0].tolist() == [20, 100]
    assert torch.equal(values[0], values[0, :1].expand(2))
    nan = logits.clone()
    nan[1, 7] = float("nan")
    assert kernels.row_best_log_probs(nan, 2, []) is None  # a non-finite normaliser: the PyTorch path decides
    assert kernels.row_best_log_probs(logits, 2, list(range(298))) is None  # fewer eligible words than k + margin
    assert kernels.row_best_log_probs(logits[:, :100], 2, []) is None  # few words: not worth the kernel
    assert kernels.row_best_log_probs(logits.double(), 2, []) is None


def test_best_words_with_a_bias_read_logits_plus_bias_rounded_as_an_add():
    g = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(21, 700, generator=g) * 3, torch.randn(700, generator=g) * 5
    bias[650] = 40.0  # the bias alone makes a late word every row's best
    added = logits + bias
    fast = kernels.row_best_log_probs(logits, 4, [0, 1], bias)
    assert fast is not None
    pre = kernels.row_best_log_probs(added, 4, [0, 1])  # the same sums, formed beforehand
    assert torch.equal(fast[1], pre[1]) and torch.equal(fast[0], pre[0])  # bit for bit
    assert (fast[1][:, 0] == 650).all()
    for fused in (True, False):  # Logits(logits, bias) = Logits(logits + bias), on both paths
        saved, Logits.fused = Logits.fused, fused
        try:
            words = Logits(logits.clone(), bias).best(4, [0, 1])
            ref = Logits(added.clone()).best(4, [0, 1])
            assert torch.equal(words[1], ref[1])
            torch.testing.assert_close(words[0], ref[0], atol=1e-5, rtol=1e-6)
        finally:
            Logits.fused = saved
    read = Logits(logits.clone(), bias)
    torch.testing.assert_close(read.dense(), torch.log_softmax(added, 1))
    torch.testing.assert_close(read.dense(), torch.log_softmax(added, 1))  # the bias is added once
    with pytest.raises(ValueError, match=r"bias must have shape \(700,\)"):
        kernels.row_best_log_probs(logits, 4, [], bias[:-1])
    assert kernels.row_best_log_probs(logits, 4, [], bias.double()) is None  # the PyTorch path then


def test_decoder_step_hands_the_search_its_logits_and_output_bias():
    torch.manual_seed(1)
    dec = FastShowAttendTellDecoder(300, 24, embed_dim=16, hidden_dim=16, attention_dim=12).eval()
    grid, tokens = torch.randn(3, 9, 24), torch.tensor([1, 5, 7])
    with torch.inference_mode():
        state = dec.init_state(grid)
        dense = dec.step_with_location(tokens, state)[0]
        logits = dec.step_with_location(tokens, state, dense=False)[0]
        assert logits.bias is dec.out.bias
        torch.testing.assert_close(logits.dense(), dense)
    with pytest.raises(RuntimeError, match="inference"):
        dec._deep_output_fast(torch.randn(3, 16), torch.randn(3, 16), torch.randn(3, 24), bias=False)


def _cell_reference(a, c, b=None, z=None, gate_logit=None):
    H = c.shape[1]
    beta = torch.sigmoid(gate_logit) if gate_logit is not None else torch.ones(())
    gates = a if b is None else a + b + beta * z[:, :4 * H]
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    zl = None if z is None or z.shape[1] == 4 * H else beta * z[:, 4 * H:]
    return torch.sigmoid(o) * torch.tanh(c), c, zl


@pytest.mark.parametrize("N,H,E", [(5, 16, 7), (1, 3, 0), (33, 40, 24)])
@pytest.mark.parametrize("form", ["gates", "sums", "sums and gate"])
def test_lstm_cell_equals_the_pytorch_ops(N, H, E, form):
    g = torch.Generator().manual_seed(N + H)
    a, c = torch.randn(N, 4 * H, generator=g) * 3, torch.randn(N, H, generator=g)
    extra = {}
    if form != "gates":  # b and the gate logit as the decoder hands them: strided columns of one matmul's output
        from_h = torch.randn(N, 4 * H + 9, generator=g) * 3
        extra = dict(b=from_h[:, :4 * H], z=torch.randn(N, 4 * H + E, generator=g) * 3)
        if form == "sums and gate":
            extra["gate_logit"] = from_h[:, -1:]
    h, c_new, zl = kernels.lstm_cell(a, c, **extra)
    ref = _cell_reference(a, c, **extra)
    torch.testing.assert_close(h, ref[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c_new, ref[1], atol=1e-6, rtol=1e-5)
    assert (zl is None) == (ref[2] is None)
    if zl is not None:
        torch.testing.assert_close(zl, ref[2], atol=1e-6, rtol=1e-6)


def test_lstm_cell_mismatch_is_a_clear_error():
    a, c = torch.randn(4, 8), torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"gates \(4, 8\) and cell state \(4, 3\) do not fit"):
        kernels.lstm_cell(a, torch.randn(4, 3))
    with pytest.raises(ValueError, match="come together"):
        kernels.lstm_cell(a, c, b=a)
    with pytest.raises(ValueError, match=r"b \(4, 8\) and z \(4, 5\) do not fit"):
        kernels.lstm_cell(a, c, b=a, z=torch.randn(4, 5))
    with pytest.raises(ValueError, match="gate_logit must be"):
        kernels.lstm_cell(a, c, b=a, z=a, gate_logit=torch.randn(4, 2))
    with pytest.raises(ValueError, match="float32 CPU"):
        kernels.lstm_cell(a.double(), c.double())


@pytest.mark.parametrize("beams", [1, 5])
def test_decoder_step_uses_the_fused_cell_only_without_autograd(beams, monkeypatch):
    torch.manual_seed(2)
    dec = FastShowAttendTellDecoder(300, 24, embed_dim=16, hidden_dim=16, attention_dim=12).eval()
    grid, tokens = torch.randn(3, 16, 24), torch.tensor([1, 5, 7]).repeat_interleave(beams)
    calls = []
    real = kernels.lstm_cell
    monkeypatch.setattr(kernels, "lstm_cell", lambda *a, **k: calls.append(len(a) + len(k)) or real(*a, **k))

    def step(fused):
        FastShowAttendTellDecoder.fused_cell = fused
        try:
            with torch.inference_mode():
                state = dec.expand_state(dec.init_state(grid), beams)  # 5 beams on 16 cells: projected values
                lp, alpha, _, (h, c, *_) = dec.step_with_location(tokens, state)
                return lp, h, c
        finally:
            FastShowAttendTellDecoder.fused_cell = True

    fast, plain = step(True), step(False)
    assert calls == [5 if beams > 1 else 2]  # the projected step hands over the gate sums, the plain one its gates
    for x, y in zip(fast, plain):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    calls.clear()
    dec.step_with_location(tokens, dec.expand_state(dec.init_state(grid), beams))  # under autograd: the PyTorch ops
    assert not calls


def test_beam_search_gives_the_same_captions_with_and_without_the_kernels():
    torch.manual_seed(0)
    dec = FastShowAttendTellDecoder(400, 24, embed_dim=16, hidden_dim=16, attention_dim=12).eval()
    grid = torch.randn(6, 9, 24)

    def decode(fused):
        AdditiveScorer.fused = Logits.fused = FastShowAttendTellDecoder.fused_cell = fused
        try:
            with torch.inference_mode():
                def step(tokens, state):
                    lp, alpha, loc, st = dec.step_with_location(tokens, state, dense=False)
                    return lp, (alpha, loc), st
                return beam_search(step, dec.init_state(grid), DecodeOptions(beam=4, max_length=8), batch_size=6,
                                   start_id=1, end_id=2, forbid_ids=(0, 1), expand=dec.expand_state)
        finally:
            AdditiveScorer.fused = Logits.fused = FastShowAttendTellDecoder.fused_cell = True

    fast, plain = decode(True), decode(False)
    assert [[h.tokens for h in image] for image in fast] == [[h.tokens for h in image] for image in plain]
    for a, b in zip(sum(fast, []), sum(plain, [])):
        assert abs(a.score - b.score) < 1e-4


def test_shape_dtype_or_device_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"queries \(5, 4\) and v \(4,\) do not fit keys \(2, 3, 4\)"):
        kernels.additive_scores(torch.randn(5, 4), torch.randn(2, 3, 4), torch.randn(4))
    with pytest.raises(ValueError, match=r"v \(3,\) do not fit"):  # too few values of v: never read past them
        kernels.additive_scores(torch.randn(4, 4), torch.randn(2, 3, 4), torch.randn(3))
    with pytest.raises(ValueError, match="float32 CPU tensors"):
        kernels.additive_scores(torch.randn(4, 4).double(), torch.randn(2, 3, 4).double(), torch.randn(4).double())


@pytest.fixture
def fresh_load(tmp_path, monkeypatch):
    """kernels._library() and available() recomputed from scratch with the cache in tmp_path/cache (the
    process's real library is loaded again by the next test that needs it)."""
    monkeypatch.setenv("CAPTIONER_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CAPTIONER_REQUIRE_KERNELS", raising=False)
    kernels._library.cache_clear()
    kernels.available.cache_clear()
    yield tmp_path / "cache"
    kernels._library.cache_clear()
    kernels.available.cache_clear()


def _compiler() -> str:
    return build.find_compiler()


def _cached_path(cache) -> "Path":
    return build.library_path(cache, _compiler(), build.compiler_version(_compiler()))


def _shared_library(tmp_path, name: str, source: str) -> "Path":
    """Compile ``source`` (C) into tmp_path/name.so."""
    c_file, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    c_file.write_text(source)
    subprocess.run([_compiler(), "-shared", "-fPIC", str(c_file), "-o", str(so)], check=True)
    return so


def _planted(tmp_path, marker) -> "Path":
    """A library whose constructor writes ``marker`` when it is loaded: what an attacker would plant."""
    return _shared_library(tmp_path, "planted", "#include <stdio.h>\n"
                           "__attribute__((constructor)) static void run(void) {\n"
                           f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n'
                           "}\nvoid additive_scores(void) {}\n")


def test_library_is_built_once_and_keyed_by_the_compiler_version(fresh_load, monkeypatch):
    assert kernels.available()
    cached = _cached_path(fresh_load)
    assert [p.name for p in fresh_load.iterdir()] == [cached.name]  # no temporary files left behind
    assert build.untrusted(fresh_load, directory=True) is None and build.untrusted(cached, directory=False) is None
    version = build.compiler_version(_compiler())
    assert version and build.library_path(fresh_load, _compiler(), version + " (upgraded)") != cached
    calls = []

    def no_build(cmd, timeout):
        calls.append(cmd)
        if cmd[1:] == ["--version"]:
            return subprocess.CompletedProcess(cmd, 0, version + "\n", "")
        raise AssertionError("rebuilt although the library is cached")

    monkeypatch.setattr(build, "run_compiler", no_build)
    kernels._library.cache_clear()
    kernels._library()
    assert calls == [[_compiler(), "--version"]]


@pytest.mark.parametrize("where", ["directory", "file", "owner"])
def test_a_library_planted_where_others_can_write_is_never_loaded(fresh_load, tmp_path, where):
    """A file at the predictable cache path is not loaded (nor its constructor run) whoever put it there: a
    cache directory or file writable by group or others, or owned by another user, is not used."""
    if where == "owner" and os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    marker = tmp_path / "constructor-ran"
    fresh_load.mkdir(mode=0o700)
    target = _cached_path(fresh_load)
    shutil.copy(_planted(tmp_path, marker), target)
    if where == "owner":
        os.chown(target, 65534, -1)  # nobody
    else:
        (fresh_load if where == "directory" else target).chmod(0o777)
    reason = "belongs to uid 65534" if where == "owner" else "writable by group or others"
    with pytest.warns(RuntimeWarning, match=reason):
        assert kernels.available()  # built elsewhere (a private directory) or afresh
    assert not marker.exists(), "the planted library was loaded"
    if where != "directory":  # the directory is ours: the rebuilt library replaced the planted one
        assert build.untrusted(target, directory=False) is None and not target.read_bytes().count(b"constructor-ran")


@pytest.mark.parametrize("damage", ["garbage", "missing-symbol"])
def test_a_cached_library_that_does_not_load_or_bind_is_rebuilt_once(fresh_load, tmp_path, damage):
    """A corrupt cached file does not mean the PyTorch path forever, nor does one that loads but lacks a
    function raise AttributeError out of available(): either is rebuilt, and the rebuilt file is cached."""
    fresh_load.mkdir(mode=0o700)
    target = _cached_path(fresh_load)
    if damage == "garbage":
        target.write_bytes(b"\x7fELF" + os.urandom(4000))
    else:
        shutil.copy(_shared_library(tmp_path, "partial", "void additive_scores(void) {}\n"), target)
    target.chmod(0o755)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: the rebuild just works
        assert kernels.available()
    fresh = tmp_path / "copy.so"  # another name: dlopen hands back an already loaded library of the same path
    shutil.copy(target, fresh)
    assert hasattr(build._load(fresh, kernels._bind), "lstm_cell")  # the cache now holds a working library


def test_a_rebuild_that_fails_too_falls_back_with_one_warning(fresh_load, monkeypatch):
    def broken_compile(compiler, out_dir):
        out = out_dir / "fused.so"
        out.write_bytes(b"not a shared library")
        return out

    monkeypatch.setattr(build, "_compile", broken_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernels.available() is False
        assert kernels.available() is False
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "fused CPU kernels are not used" in messages[0] and "does not load" in messages[0]
    assert kernels.row_best_log_probs(torch.randn(3, 300), 2, []) is None  # callers take the PyTorch path


def test_a_hanging_compiler_times_out(fresh_load, tmp_path, monkeypatch):
    fake = tmp_path / "slow-cc"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo slow-cc 1.0; exit 0; fi\nsleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv(build.BUILD_TIMEOUT_ENV, "1")
    start = time.monotonic()
    with pytest.raises(kernels.KernelUnavailable, match="timed out after 1 s"):
        kernels._library()
    assert time.monotonic() - start < 20


def _fallback(env: dict) -> subprocess.CompletedProcess:
    code = ("import warnings, torch\n"
            "from captioner.models.scorers import AdditiveScorer\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    s = AdditiveScorer(6, 4, 8)\n"
            "    e = s(torch.randn(2, 4), s.prepare(torch.randn(2, 3, 6)))\n"
            "assert e.shape == (2, 3)\n"
            "print('WARN:' + ' | '.join(str(x.message) for x in w))\n")
    full = {k: v for k, v in os.environ.items() if k != "CAPTIONER_REQUIRE_KERNELS"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def test_without_a_compiler_the_pytorch_path_runs_and_says_why(tmp_path):
    proc = _fallback({"CC": str(tmp_path / "no-such-cc"), "CAPTIONER_KERNEL_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert "fused CPU kernels are not used" in proc.stdout and "no-such-cc" in proc.stdout


def test_kernels_can_be_turned_off_silently_or_required(tmp_path):
    off = _fallback({"CAPTIONER_KERNELS": "0"})
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "WARN:"
    required = _fallback({"CC": str(tmp_path / "no-such-cc"), "CAPTIONER_KERNEL_CACHE": str(tmp_path / "c"),
                          "CAPTIONER_REQUIRE_KERNELS": "1"})
    assert required.returncode != 0 and "KernelUnavailable" in required.stderr
