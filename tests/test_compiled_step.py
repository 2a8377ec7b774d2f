"""The compiled decoder step (train.compile; models/decoders/show_attend_tell_compiled.py) against the eager paths.

- with torch.compile's inductor on the CPU: the training loss and every gradient equal the eager fast path's
  (float32, to 1e-5 of the largest gradient), over two batches whose row counts are not multiples of the bucket
  (an epoch's last, smaller batch), and with the steps padded as CUDA graphs pad them; greedy and beam captions
  equal the eager decode's on three grids, with beam search keeping retired images' rows;
- the traced step (cheaper backend "aot_eager": one graph per step, fullgraph) for the other soft reads: key-value
  and multi-head attention, the vector gate and none, the other scorers;
- a smoke training run with train.compile (traced by aot_eager) has the eager run's losses and validation captions;
- what the config refuses: a decoder family, hard attention, an objective or a setting under which nothing would
  run compiled, CUDA graphs off CUDA;
- (marker gpu) the same equalities on CAPTIONER_GPU_TEST_DEVICE (default cuda; CUDA graphs there).

Each new shape compiles (inductor: seconds on the CPU); the tests share their sizes so that the graphs compile once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from captioner.config import ConfigError, load_config
from captioner.decoding.options import DecodeOptions
from captioner.decoding.search import search
from captioner.models.decoders import show_attend_tell_compiled as compiled_mod
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.names import COMPILE_MODES
from captioner.training.losses import soft_attention_loss

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
DEVICE = os.environ.get("CAPTIONER_GPU_TEST_DEVICE", "cuda")  # the gpu test's (tests/test_gpu.py's convention)
V, D, L = 23, 10, 6  # vocabulary, annotation size, grid locations: tiny, so that inductor compiles in seconds
ARGS = dict(vocab_size=V, feature_dim=D, embed_dim=8, hidden_dim=9, attention_dim=7, dropout=0.0)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with torch._dynamo's caches empty: its 8 shapes per step function are this test's."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _grid(B: int, seed: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(seed)).to(device)


def _batch(B: int, T: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grid (B, L, D), captions (B, T) = <start> w.. <end> <pad>.. with unsorted lengths, the longest T."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[0] = T
    captions = torch.randint(4, V, (B, T), generator=g)
    captions[:, 0] = 1
    captions[torch.arange(B), lengths - 1] = 2
    captions[torch.arange(T)[None] >= lengths[:, None]] = 0
    grid = torch.randn(B, L, D, generator=g)
    return grid.to(device), captions.to(device), lengths.to(device)


def _loss_and_grads(dec: FastShowAttendTellDecoder, grid, captions, lengths) -> tuple[torch.Tensor, list]:
    grid = grid.clone().requires_grad_()  # the grid learns too (projection, position embedding)
    loss = soft_attention_loss(dec(grid, captions, lengths), captions[:, 1:], alpha_c=0.3).loss
    return loss, torch.autograd.grad(loss, [*dec.parameters(), grid], allow_unused=True)


def _assert_training_equal(dec: FastShowAttendTellDecoder, batches, mode: str = "inductor",
                           backend: str = "inductor", step_bucket: int | None = None, tol: float = 1e-5) -> None:
    """Loss and every gradient of each batch, compiled against eager (the fast path), in training mode."""
    dec.train()
    eager = [_loss_and_grads(dec, *b) for b in batches]
    dec.compile_steps(mode, backend=backend)
    if step_bucket is not None:
        dec._compiled.step_bucket = step_bucket
    try:
        for (loss, grads), batch in zip(eager, batches):
            c_loss, c_grads = _loss_and_grads(dec, *batch)
            torch.testing.assert_close(c_loss, loss, atol=tol, rtol=tol)
            names = [n for n, _ in dec.named_parameters()] + ["grid"]
            for name, a, b in zip(names, c_grads, grads):
                assert (a is None) == (b is None), name
                if a is not None:
                    scale = max(float(b.abs().max()), 1e-3)
                    assert float((a - b).abs().max()) <= tol * scale, f"gradient of {name} differs"
    finally:
        dec.compile_steps("off")


def _decode(dec: FastShowAttendTellDecoder, grid: torch.Tensor, options: DecodeOptions, rows: list[int]):
    """Captions as Captioner.generate decodes them (the decoder's own expand and static_rows): per image its
    hypotheses' words, and all their scores; ``rows`` collects the rows of every step."""
    def step(tokens, state):
        rows.append(tokens.shape[0])
        log_probs, alpha, location, state = dec.step_with_location(tokens, state, "expectation", dense=False)
        return log_probs, (alpha, location), state

    with torch.no_grad():
        hyps = search(step, dec.init_state(grid), options, batch_size=grid.shape[0], start_id=1, end_id=2,
                      forbid_ids=(0, 1), expand=dec.expand_state, static_rows=dec.static_rows)
    return [[h.tokens for h in per_image] for per_image in hyps], [h.score for per_image in hyps for h in per_image]


def _assert_captions_equal(dec: FastShowAttendTellDecoder, grids, mode: str = "inductor",
                           backend: str = "inductor") -> None:
    """Greedy and beam captions (the same words, scores within 1e-3) of each grid, compiled against eager; beam
    search retires images early (its eager rows shrink), which the compiled decode keeps in the batch."""
    dec.eval()
    greedy, beam = DecodeOptions(beam=1, max_length=8), DecodeOptions(beam=3, n_best=2, max_length=8)
    eager_rows: list[int] = []
    eager = [(_decode(dec, grid, greedy, []), _decode(dec, grid, beam, eager_rows)) for grid in grids]
    assert min(eager_rows) < max(eager_rows), "no image retired early: the static rows went untested"
    dec.compile_steps(mode, backend=backend)
    try:
        for grid, expected in zip(grids, eager):
            rows: list[int] = []
            for options, (words, scores) in zip((greedy, beam), expected):
                got_words, got_scores = _decode(dec, grid, options, rows)
                assert got_words == words
                assert got_scores == pytest.approx(scores, abs=1e-3)
            B = grid.shape[0]
            assert set(rows) == {B, 3 * B}  # every step on all rows: none dropped
    finally:
        dec.compile_steps("off")


def _decoder(device: str = "cpu", **kwargs) -> FastShowAttendTellDecoder:
    torch.manual_seed(0)
    dec = FastShowAttendTellDecoder(**{**ARGS, **kwargs}).to(device)
    with torch.no_grad():
        dec.out.bias[2] += 2.0  # <end> likely: captions end at different steps, images retire at different times
    return dec


# Cold (an empty inductor cache, as in CI) each of the two tests below takes about 25 s on 2 cores, most of it the
# process's first compile; warm, 3 s and 1 s.
@pytest.mark.slow
def test_inductor_training_steps_equal_eager_on_last_batches_and_padded_steps():
    """Batches of 13 and 11 captions (both padded to 16 rows: one compiled shape) of different lengths; then the
    steps padded to a multiple of 8 as under CUDA graphs (the step's shape unchanged: no new graph)."""
    dec = _decoder()
    batches = [_batch(13, 7, seed=1), _batch(11, 5, seed=2)]
    _assert_training_equal(dec, batches)
    _assert_training_equal(dec, batches, step_bucket=compiled_mod.STEP_BUCKET)


@pytest.mark.slow
def test_inductor_greedy_and_beam_captions_equal_eager():
    dec = _decoder()
    _assert_captions_equal(dec, [_grid(5, seed=s) for s in (3, 4, 5)])


@pytest.mark.parametrize("kwargs", [dict(attention="key_value", scorer="dot"), dict(gate="vector", scorer="bilinear"),
                                    dict(attention="multi_head", heads=7, gate="none", scorer="scaled_dot")],
                         ids=["key_value-dot", "vector_gate-bilinear", "multi_head-no_gate-scaled_dot"])
def test_the_other_soft_reads_trace_whole_and_equal_eager(kwargs):
    dec = _decoder(**kwargs)
    _assert_training_equal(dec, [_batch(13, 7, seed=1)], backend="aot_eager")
    _assert_captions_equal(dec, [_grid(5, seed=3)], backend="aot_eager")


def test_outside_the_compiled_reads_the_eager_paths_run():
    """The reference switch, another read than the soft one, and autograd in a decoding step: no compiled call."""
    from captioner import fast as fast_paths

    dec = _decoder()
    dec.compile_steps("inductor", backend="aot_eager")
    calls = []
    dec._compiled.forward = dec._compiled.step = lambda *a, **k: calls.append(a)
    grid, captions, lengths = _batch(3, 5, seed=1)
    with fast_paths.reference():
        dec(grid, captions, lengths)
        assert not dec.static_rows
    dec(grid, captions, lengths, attention_mode="argmax")
    dec.step_with_location(captions[:, 0], dec.init_state(grid), "expectation")  # under autograd
    assert not calls
    dec(grid, captions, lengths)
    assert len(calls) == 1 and dec.static_rows


def _smoke(tmp_path: Path, *overrides: str, data_root: Path | None = None, config: Path = SMOKE):
    return load_config(config, [f"data.root={data_root or tmp_path / 'data'}", f"train.run_dir={tmp_path / 'run'}",
                               "train.tensorboard=off", "train.tensorboard_images=0", "train.num_threads=1",
                               *overrides])


@pytest.mark.parametrize("config,overrides,refusal", [
    ("smoke_transformer", [], "the transformer decoder has no compiled step"),
    ("smoke", ["model.attention.attention=hard", "train.objective.kind=reinforce"], "only soft reads are compiled"),
    ("smoke", ["train.objective.kind=scst"], "only the teacher-forced xe read is compiled"),
    ("smoke", ["train.objective.scheduled_sampling_start=0"], "scheduled sampling"),
    ("smoke", ["train.amp=bf16"], "needs train.amp none and train.fast_paths true"),
    ("smoke", ["train.fast_paths=false"], "needs train.amp none and train.fast_paths true"),
])
def test_the_config_refuses_train_compile_where_nothing_would_run_compiled(tmp_path, config, overrides, refusal):
    config = SMOKE.with_name(f"{config}.yaml")
    _smoke(tmp_path, *overrides, config=config)  # loads without it
    with pytest.raises(ConfigError, match=f"train.compile: set to 'inductor', but this run would ignore it.*{refusal}"):
        _smoke(tmp_path, *overrides, "train.compile=inductor", config=config)


def test_unknown_compile_modes_and_cuda_graphs_off_cuda_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="train.compile: 'yes' is not one of off, inductor, cudagraphs"):
        _smoke(tmp_path, "train.compile=yes")
    assert _smoke(tmp_path, "train.compile=cudagraphs").train.compile == "cudagraphs"  # the device decides, later
    dec = _decoder()
    with pytest.raises(ValueError, match="train.compile=cudagraphs: CUDA graphs need a CUDA device"):
        dec.compile_steps("cudagraphs", setting="train.compile")
    with pytest.raises(ValueError, match="hard attention samples where it reads"):
        _decoder(attention="hard").compile_steps("inductor")
    assert compiled_mod.TORCH_MODES.keys() | {"off"} == set(COMPILE_MODES)


def test_a_smoke_run_compiled_has_the_eager_runs_losses_and_captions(tmp_path, monkeypatch):
    """Training, the validation loss and the validation decode through the compiled step (traced by aot_eager
    here: the tests above hold inductor to eager), dropout off so that both runs draw nothing."""
    import captioner.training.validation as validation_mod
    from captioner.training.loop import train

    predictions = []
    monkeypatch.setattr(validation_mod, "caption_scores",
                        lambda p, r, meteor=False: predictions.append(p) or {"BLEU-4": 0.0, "CIDEr-D": 0.0})
    compile_steps = FastShowAttendTellDecoder.compile_steps
    compiled = []

    def traced(self, mode, setting="compile", backend="inductor"):
        compiled.append(mode)
        compile_steps(self, mode, setting, backend="aot_eager")

    monkeypatch.setattr(FastShowAttendTellDecoder, "compile_steps", traced)
    calls = {"forward": 0, "step": 0}

    def counting(name: str):
        run = getattr(compiled_mod.StaticSteps, name)

        def counted(self, *args, **kwargs):
            calls[name] += 1
            return run(self, *args, **kwargs)
        return counted

    for name in calls:
        monkeypatch.setattr(compiled_mod.StaticSteps, name, counting(name))
    logs = []
    for mode in ("off", "inductor"):
        run = train(_smoke(tmp_path / mode, "train.epochs=1", "model.decoder.dropout=0.0", f"train.compile={mode}",
                           data_root=tmp_path / "data"))
        logs.append(json.loads((run / "metrics.jsonl").read_text().splitlines()[-1]))
    # the training and validation batches' forwards and the validation decode's steps ran compiled
    assert compiled == ["inductor"] and calls["forward"] > 1 and calls["step"] > 1
    eager, comp = logs
    for key in ("train_xe", "train_alpha_penalty", "val_loss"):
        assert comp[key] == pytest.approx(eager[key], rel=1e-5, abs=1e-6), key
    assert predictions[0] == predictions[1] and predictions[0]


@pytest.mark.gpu
def test_compiled_steps_on_the_gpu_equal_eager_there():
    """On CAPTIONER_GPU_TEST_DEVICE: CUDA graphs ("cudagraphs") on CUDA, inductor on the CPU (the dry run). TF32
    off: the eager and compiled matmuls then round alike enough for 1e-4."""
    from captioner.runtime import enable_tf32

    mode = "cudagraphs" if DEVICE.startswith("cuda") else "inductor"
    dec = _decoder(DEVICE)
    enable_tf32(False)
    try:
        _assert_training_equal(dec, [_batch(13, 7, seed=1, device=DEVICE), _batch(11, 5, seed=2, device=DEVICE)],
                               mode=mode, tol=1e-4)
        _assert_captions_equal(dec, [_grid(5, seed=s, device=DEVICE) for s in (3, 4, 5)], mode=mode)
    finally:
        enable_tf32(True)
