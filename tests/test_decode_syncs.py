"""Decoding without a host sync per word (issue 43, GPU readiness).

On an accelerator every read of a device tensor on the host (``bool(t)``, ``t.item()``, ``t.tolist()``, ``t.cpu()``,
the size of ``t.nonzero()``) waits for all the work queued before it, and every ``torch.tensor(list, device=...)``
is a host-to-device copy. The searches (decoding/search.py) make at most a few of them per step, however many
beams finish; sampling (contract.SampleDraws) builds its banned ids once and asks whether every caption has ended
every few steps on an accelerator; and attention and word sampling (attention.draw_index) draw a valid index from a
row of NaN probabilities (torch.multinomial refuses it; on CUDA with a device-side assert in some versions) while
the log-probability that comes out stays non-finite, so the training loop still skips that step.

On the CPU the reads are counted by wrapping those methods (an upper bound of the syncs a GPU would make: a read of
a tensor that is already on the host counts too); the ``gpu`` test checks the real thing on CUDA. The captions and
scores are pinned against tests/decode_expected.json, recorded with the code before the change (tests/decode_cases.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from pathlib import Path

import decode_cases  # tests/decode_cases.py (pytest puts tests/ on sys.path)
import pytest
import torch

from captioner import fast as fast_paths
from captioner.decoding.options import DecodeOptions
from captioner.decoding.search import Logits, beam_search, greedy_search
from captioner.models.attention import draw_index, read_context
from captioner.models.decoders.contract import SampleDraws
from captioner.training.losses import hard_attention_loss, scst_loss

START, END, PAD = 1, 2, 0
V = 30
FORBID = (PAD, START, V - 1)  # the last id keeps them apart from the kept-images lists (B <= 8) in HostReads.built_data
READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


class HostReads:
    """Counts, per step call of a search, the search's host reads of tensors (READS) and its torch.tensor
    constructions; reads inside the step function (the model's own) are not counted. ``per_step[0]`` holds what
    happens before the first call, ``per_step[t]`` what happens after call t (its bookkeeping), up to the next."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[int] = [0]
        self.built: list[int] = [0]
        self.built_data: list[list] = []  # what each torch.tensor call was given
        self.in_model = False
        for name in READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original, self.reads))
        monkeypatch.setattr(torch, "tensor", self._counting(torch.tensor, self.built, self.built_data))

    def _counting(self, original, counts: list[int], data: list | None = None):
        def wrapper(*args, **kwargs):
            if not self.in_model:
                counts[-1] += 1
                if data is not None:
                    data.append(list(args[0]) if isinstance(args[0], (list, tuple)) else args[0])
            return original(*args, **kwargs)
        return wrapper

    def wrap(self, step):
        def counted_step(tokens, state):
            self.in_model = True
            try:
                return step(tokens, state)
            finally:
                self.in_model = False
                self.reads.append(0)
                self.built.append(0)
        return counted_step


class Model:
    """A fixed random language model over V words that depends on the last word and a float state; it returns an
    alpha (N, L) and a read cell (N,) per word, Logits or dense log-probs, and makes no host read itself. ``end``
    shifts <end>'s logit (high: beams finish at every step)."""

    def __init__(self, L: int = 5, end: float = 0.0, logits: bool = True, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(V, V, generator=g) * 2  # (V, V)
        self.mix = torch.randn(V, 8, generator=g)  # (V, S)
        self.out = torch.randn(8, V, generator=g)  # (S, V)
        self.where = torch.randn(8, L, generator=g)  # (S, L)
        self.end, self.logits = end, logits

    def init_state(self, B: int) -> torch.Tensor:
        return torch.randn(B, 8, generator=torch.Generator().manual_seed(1))  # (B, S)

    def __call__(self, tokens, h):
        h = torch.tanh(h + self.mix[tokens])  # (N, S)
        logits = self.table[tokens] + h @ self.out  # (N, V)
        logits[:, END] += self.end
        alpha = torch.softmax(h @ self.where, dim=1)  # (N, L)
        scores = Logits(logits) if self.logits else torch.log_softmax(logits, dim=1)
        return scores, (alpha, alpha.argmax(dim=1)), h


def run(search, monkeypatch, model: Model, B: int, length: int, min_length: int, **settings):
    reads = HostReads(monkeypatch)
    hyps = search(reads.wrap(model), model.init_state(B), DecodeOptions(max_length=length, **settings), batch_size=B,
                  start_id=START, end_id=END, min_length=min_length, forbid_ids=FORBID)
    monkeypatch.undo()
    return hyps, reads


SEARCHES = [("greedy", greedy_search, dict(beam=1)), ("beam3", beam_search, dict(beam=3)),
            ("beam3_nbest2", beam_search, dict(beam=3, n_best=2)),
            ("beam5_nbest3", beam_search, dict(beam=5, n_best=3))]
# The most host reads the search makes after one step call: the step's one copy of its scores and flags, and on a
# step where beams finish one copy of their words, maps and cells (words and cells read as lists).
MOST_READS_PER_STEP = 3
# After the last step call: that step's (up to 3), then one copy of the unfinished captions' words, maps and cells
# (2 reads: the words and the cells as lists); greedy: its step's 1, its scores and lengths 1, the copy 2.
MOST_READS_AT_THE_END = 5


@pytest.mark.parametrize("name,search,kwargs", SEARCHES, ids=[s[0] for s in SEARCHES])
@pytest.mark.parametrize("length", [10, 20])
@pytest.mark.parametrize("logits", [True, False])
def test_searches_read_the_host_a_few_times_per_step_not_per_hypothesis(name, search, kwargs, length, logits,
                                                                        monkeypatch):
    """<end> masked (min_length = max_length: every caption runs the whole length), and <end> likely (beams finish
    at every step, up to 8 images x 5 beams): the reads per step stay under a constant, whatever the beam width, the
    number of images and the number of hypotheses; the banned ids are built once per search, not per step."""
    for B, end, min_length in ((2, 0.0, length), (8, 0.0, length), (8, 3.0, 0)):
        model = Model(end=end, logits=logits)
        hyps, reads = run(search, monkeypatch, model, B, length, min_length, **kwargs)
        steps = len(reads.reads) - 1
        assert steps == length or min_length == 0
        if min_length == length:
            assert all(len(h.tokens) == length and not h.finished for image in hyps for h in image)
        else:
            assert sum(h.finished for image in hyps for h in image) >= B // 2  # the pool path ran
        assert reads.reads[0] == 0, "a host read before the first step"
        assert max(reads.reads[1:-1], default=0) <= MOST_READS_PER_STEP, (B, end, reads.reads)
        assert reads.reads[-1] <= MOST_READS_AT_THE_END, (B, end, reads.reads)
        # the banned ids (FORBID, with <end> while fewer than min_length words): built once per search
        banned = [d for d in reads.built_data if d in (list(FORBID), [*FORBID, END])]
        assert len(banned) == 1 and len(reads.built_data) - len(banned) <= B, reads.built_data
        assert max(reads.built[1:], default=0) <= 1, reads.built  # else: images retired (a kept-rows index)


@pytest.mark.recorded
@pytest.mark.parametrize("name", list(decode_cases.MODELS))
def test_captions_scores_and_maps_equal_the_ones_recorded_before_the_change(name):
    """Beam 1, 3 and 5 (n_best up to 5, trigram blocking, <end> masked to the full length) on fixed small decoders
    give the captions, finished flags, read cells and per-word maps recorded before the host syncs were taken out,
    and the scores to float32 rounding.

    Exact equality is the point for the words, flags and read cells (the change must decode the same captions), and
    they are exact on every CPU kernel set (ATEN_CPU_CAPABILITY default, avx2, avx512: .ci/run runs this file under
    each). A score is a sum of about ten float32 log-probabilities whose last bits differ between kernel sets
    (6e-6 relative seen under "default" against the avx512 recording), so scores compare to a relative 3e-5, and
    each word's mean cell under alpha (recorded to 4 decimals) to 1e-3."""
    expected = json.loads((Path(__file__).with_name("decode_expected.json")).read_text())
    for args in decode_cases.DECODES:
        key = f"{name} {args}"
        got = decode_cases.decode(name, *args)
        want = expected[key]
        assert [[h[0] for h in image] for image in got] == [[h[0] for h in image] for image in want], key
        assert [[(h[2], h[3]) for h in image] for image in got] == [[(h[2], h[3]) for h in image]
                                                                     for image in want], key
        for image, image_want in zip(got, want):
            for h, w in zip(image, image_want):
                assert h[1] == pytest.approx(w[1], rel=3e-5), key
                assert h[4] == pytest.approx(w[4], abs=1e-3), key


# ---------------------------------------------------------------------------------------
# sampling: NaN-safe draws, banned ids built once, the "every caption ended" read every few steps


def test_draw_index_draws_a_valid_index_from_any_row_and_what_multinomial_draws_from_a_distribution():
    nan, inf = math.nan, math.inf
    probs = torch.tensor([[0.1, 0.2, 0.7, 0.0], [nan] * 4, [0.0] * 4, [nan, 0.0, 0.0, 0.0], [inf, 0.0, 0.0, 0.0],
                          [-1.0, 0.0, 0.0, 0.0], [0.5, nan, 0.5, -1.0]])
    for seed in range(20):
        index = draw_index(probs, torch.Generator().manual_seed(seed))
        assert index.shape == (7,) and bool(((index >= 0) & (index < 4)).all())
        assert index[6] in (0, 2)  # the non-finite and negative entries count as 0; the rest still draws
        good = torch.softmax(torch.randn(5, 9, generator=torch.Generator().manual_seed(seed)), dim=1)  # (5, 9)
        assert torch.equal(draw_index(good, torch.Generator().manual_seed(seed)),
                           torch.multinomial(good, 1, generator=torch.Generator().manual_seed(seed)).squeeze(1))
    draws = torch.stack([draw_index(probs[1:3], torch.Generator().manual_seed(s)) for s in range(200)])  # (200, 2)
    assert set(draws.flatten().tolist()) == {0, 1, 2, 3}  # a row without mass: uniform over its entries


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_row_of_nan_alphas_samples_a_cell_and_keeps_a_non_finite_log_prob(bad):
    """read_context's "sample" mode with one row's scores NaN (or +inf: fp16 overflow) draws a valid cell for every
    row (torch.multinomial raised here), and that row's log p(s) is not finite, so the loss is not either and the
    training loop skips the step (train.max_nonfinite_steps) instead of stopping."""
    g = torch.Generator().manual_seed(0)
    scores, values = torch.randn(3, 6, generator=g), torch.randn(3, 6, 4, generator=g)
    scores[1, 2] = bad
    scores.requires_grad_(True)
    read = read_context(scores, values, "sample", generator=g)
    assert bool(((read.index >= 0) & (read.index < 6)).all())
    assert torch.isfinite(read.log_prob[[0, 2]]).all() and not torch.isfinite(read.log_prob[1])
    assert not torch.isfinite(read.log_prob.sum() + read.entropy.sum())
    read.log_prob.sum().backward()  # the gradient path is intact (non-finite in the bad row, as the loss is)
    assert torch.isfinite(scores.grad[[0, 2]]).all()


@pytest.mark.parametrize("name,mode", [("lstm_soft_v19", "expectation"), ("lstm_hard_v19", "sample"),
                                       ("transformer_v19", "expectation")])
@pytest.mark.parametrize("reference", [False, True])
def test_a_nan_image_samples_words_and_keeps_non_finite_log_probs(name, mode, reference):
    """Word sampling (SCST) from an image whose features are NaN: every row draws valid words, and that image's
    word log-probabilities (and, for hard attention, its cells') are not finite; the other images' are."""
    dec = decode_cases.fixed_decoder(name)
    grid = decode_cases.fixed_grid()
    grid[1] = math.nan
    V = decode_cases.MODELS[name][2]
    with fast_paths.reference(reference):
        out = dec.sample(grid, 2, START, END, max_length=6, attention_mode=mode,
                         generator=torch.Generator().manual_seed(0))
    assert bool(((out.tokens >= 0) & (out.tokens < V)).all())
    rows = torch.arange(grid.shape[0]).repeat_interleave(2) == 1  # (N,): the NaN image's two samples
    total = out.word_log_probs.sum(dim=1)  # (N,)
    assert not torch.isfinite(total[rows]).any() and torch.isfinite(total[~rows]).all()
    if mode == "sample":
        cells = out.location_log_probs.sum(dim=1)  # (N,)
        assert not torch.isfinite(cells[rows]).any() and torch.isfinite(cells[~rows]).all()
    N = rows.numel()
    assert not torch.isfinite(scst_loss(out, torch.rand(N), torch.rand(N)).loss)  # what the loop sees and skips


def test_a_nan_image_under_hard_attention_training_gives_a_non_finite_loss_not_an_error():
    """Teacher forcing in "sample" mode (hard attention's training, Eq. (10)-(12)) over a batch with one NaN image:
    the cells are drawn, and the loss is non-finite (the training loop skips the step) rather than an exception."""
    dec = decode_cases.fixed_decoder("lstm_hard_v19").train()
    grid = decode_cases.fixed_grid()
    grid[2] = math.nan
    g = torch.Generator().manual_seed(0)
    captions = torch.randint(4, 19, (grid.shape[0], 6), generator=g)  # (B, T): <start> w w w w <end>
    captions[:, 0], captions[:, -1] = START, END
    lengths = torch.full((grid.shape[0],), 6)
    out = dec(grid, captions, lengths, attention_mode="sample")
    assert not torch.isfinite(out.log_probs[2]).all() and torch.isfinite(out.log_probs[[0, 1, 3]]).all()
    loss = hard_attention_loss(out, captions[:, 1:], baseline=-3.0).loss
    assert not torch.isfinite(loss)


@pytest.mark.parametrize("name,mode,end_bias", [("lstm_soft_v300", "expectation", 10.0),
                                                ("lstm_hard_v19", "sample", 3.0)])
@pytest.mark.parametrize("reference", [False, True])
def test_sampling_reads_every_few_steps_gives_the_same_captions_and_builds_banned_ids_once(name, mode, end_bias,
                                                                                          reference, monkeypatch):
    """SampleDraws asks whether every caption has ended every CHECK_EVERY steps (4 on an accelerator); the steps it
    drew past the end are dropped, so the output equals asking at every step (the CPU's default). The banned ids
    are copied once per sample, not per step."""
    dec = decode_cases.fixed_decoder(name)
    with torch.no_grad():
        dec.out.bias[END] = end_bias  # captions that end, at different steps
    grid = decode_cases.fixed_grid()
    outputs, reads = {}, {}
    for every in (1, 3, 4):
        monkeypatch.setattr(SampleDraws, "CHECK_EVERY", {"cpu": every})
        counter = HostReads(monkeypatch)
        torch.manual_seed(0)  # hard attention draws its cells from the global generator
        with fast_paths.reference(reference):
            outputs[every] = dec.sample(grid, 3, START, END, max_length=20, attention_mode=mode,
                                        forbid_ids=(decode_cases.UNK,), generator=torch.Generator().manual_seed(5))
        monkeypatch.undo()
        reads[every] = counter
    steps = outputs[1].tokens.shape[1]
    assert 3 < steps < 20 and bool((outputs[1].tokens == END).any(dim=1).all())  # ended early: the check mattered
    assert len(set(outputs[1].lengths.tolist())) > 1
    for every in (3, 4):
        for field in ("tokens", "lengths", "word_log_probs", "location_log_probs", "alphas", "location_entropies"):
            a, b = getattr(outputs[1], field), getattr(outputs[every], field)
            assert (a is None) == (b is None), field
            if a is not None:
                assert torch.equal(a, b), (every, field)
        assert len(reads[every].built_data) == 1, reads[every].built_data  # the banned ids, once
    # asked at every step: one read per step; every 3 or 4 steps: a third or a quarter of them, plus the trim's one
    assert sum(reads[1].reads) <= steps + 1
    for every in (3, 4):
        assert sum(reads[every].reads) <= math.ceil(steps / every) + 2


# ---------------------------------------------------------------------------------------
# on a GPU: the real syncs, and the same captions as on the CPU


# CAPTIONER_GPU_TEST_DEVICE=cpu runs the test below on the CPU (conftest then does not skip it): a dry run of its
# logic (no sync is counted there), which proves nothing about CUDA
GPU_TEST_DEVICE = os.environ.get("CAPTIONER_GPU_TEST_DEVICE", "cuda")


def _same_top(device_image: list, cpu_image: list) -> bool:
    """The device's best hypothesis is the CPU's, or the CPU's best two tie (to 1e-4 in score, each another
    device's float rounding away) and the device's best is one of them."""
    if device_image[0][0] == cpu_image[0][0]:
        return True
    tie = len(cpu_image) > 1 and abs(cpu_image[0][1] - cpu_image[1][1]) < 1e-4
    return tie and device_image[0][0] in (cpu_image[0][0], cpu_image[1][0])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lstm_soft_v19", "lstm_soft_v300", "lstm_hard_v19", "transformer_v19"])
def test_cuda_search_syncs_a_few_times_per_step_and_decodes_what_the_cpu_does(name):
    """Under torch.cuda.set_sync_debug_mode("warn") every implicit sync warns; the model's step calls are not
    counted (their syncs are the model's, not the search's). Per step call the search syncs at most twice: its
    report, and the copy of the beams that finished; greedy once; then the result's copies, and at most one index
    per retired image (copied without a wait, counted in case it warns). With TF32 off on both sides, the best
    hypothesis equals the CPU's (a tie of the CPU's best two allowed), its score to 1e-4 and its maps' cells to
    1e-3. (The CPU side runs the fused C kernels, CUDA PyTorch's ops: the n-best below the top may reorder.)"""
    from captioner.runtime import enable_tf32

    cuda = GPU_TEST_DEVICE == "cuda"

    @contextlib.contextmanager
    def around_search():
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")

    @contextlib.contextmanager
    def around_step():
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        try:
            yield
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")

    enable_tf32(False)
    try:
        for args in [(1, 1, False, 0, 10), (3, 2, False, 0, 10), (5, 3, False, 0, 12), (5, 2, False, 8, 8)]:
            cpu = decode_cases.decode(name, *args)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                device = decode_cases.decode(name, *args, device=GPU_TEST_DEVICE, around_search=around_search,
                                             around_step=around_step)
            syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
            steps = args[4]
            most = 2 * steps + 2 + decode_cases.B
            assert len(syncs) <= most, (name, args, len(syncs), [str(w.message)[:80] for w in syncs[:3]])
            for image, image_cpu in zip(device, cpu):
                assert _same_top(image, image_cpu), (name, args, image[0][0], [h[0] for h in image_cpu])
                if image[0][0] == image_cpu[0][0]:
                    h, c = image[0], image_cpu[0]
                    assert h[2:4] == c[2:4] and h[1] == pytest.approx(c[1], abs=1e-4)
                    assert h[4] == pytest.approx(c[4], abs=1e-3)
    finally:
        enable_tf32(True)
