"""The training fast paths against plain implementations, so a hand-written backward cannot drift.

- fast/token_nll.token_nll (one-pass backward) and linear_token_nll (output layer fused with it) against
  F.linear + F.cross_entropy;
- fast/deferred.StepWeight (weight gradients formed once per sequence) against per-step autograd;
- the fast decoder's whole training loss (sorted, shrinking batch, packed output layer, deferred LSTM weight
  gradients, token_nll) against the reference decoder module (models/decoders/show_attend_tell.py, the paper's
  equations step by step over the padded batch) with the same weights and F.cross_entropy: every gradient equal;
- decoding's fast paths (projected values, cached weights) against the plain step.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from captioner import fast as fast_paths
from captioner.fast.deferred import step_weights
from captioner.fast.token_nll import linear_token_nll, token_nll
from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder, ProjectedState
from captioner.training.losses import hard_attention_loss, soft_attention_loss


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_token_nll_equals_cross_entropy(dtype, smoothing):
    """Label smoothing ε included: F.cross_entropy's label_smoothing, values and gradients."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(37, 53, generator=g) * 6).to(dtype)  # large logits: log-sum-exp must be stable
    logits[0, :] = 80.0  # a row of equal, large logits
    targets = torch.randint(0, 53, (37,), generator=g)
    weights = torch.rand(37, generator=g, dtype=torch.float64)
    x_fast = logits.clone().requires_grad_()
    x_ref = logits.clone().requires_grad_()
    fast = token_nll(x_fast, targets, smoothing)
    ref = F.cross_entropy(x_ref.double() if dtype == torch.float64 else x_ref.float(), targets, reduction="none",
                          label_smoothing=smoothing)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert fast.dtype == ref.dtype
    torch.testing.assert_close(fast, ref, atol=tol, rtol=tol)
    (fast * weights.to(fast.dtype)).sum().backward()
    (ref * weights.to(ref.dtype)).sum().backward()
    assert x_fast.grad.dtype == dtype
    torch.testing.assert_close(x_fast.grad, x_ref.grad, atol=tol if dtype != torch.bfloat16 else 1e-2, rtol=tol)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("dtype,bias", [(torch.float32, True), (torch.float64, True), (torch.float64, False)])
def test_linear_token_nll_equals_linear_then_cross_entropy(dtype, bias, smoothing):
    """Label smoothing ε included: F.cross_entropy's label_smoothing, values and gradients."""
    g = torch.Generator().manual_seed(1)
    R, E, V = 29, 11, 47
    x = (torch.randn(R, E, generator=g) * 2).to(dtype)
    W = torch.randn(V, E, generator=g).to(dtype)
    b = torch.randn(V, generator=g).to(dtype) if bias else None
    targets = torch.randint(0, V, (R,), generator=g)
    targets[:5] = targets[0]  # repeated targets: their onehot gradients add up in W and b
    weights = torch.rand(R, generator=g, dtype=dtype)
    leaves = [x, W] + ([b] if bias else [])
    fast_in = [t.clone().requires_grad_() for t in leaves]
    ref_in = [t.clone().requires_grad_() for t in leaves]
    fast = linear_token_nll(fast_in[0], fast_in[1], fast_in[2] if bias else None, targets, smoothing)
    ref = F.cross_entropy(F.linear(ref_in[0], ref_in[1], ref_in[2] if bias else None), targets, reduction="none",
                          label_smoothing=smoothing)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(fast, ref, atol=tol, rtol=tol)
    (fast * weights).sum().backward(retain_graph=True)
    (ref * weights).sum().backward()
    for a, r in zip(fast_in, ref_in):
        torch.testing.assert_close(a.grad, r.grad, atol=tol, rtol=tol)
    first = [a.grad.clone() for a in fast_in]
    (fast * weights).sum().backward()  # the saved buffer is not consumed: a second backward is exact
    for a, once in zip(fast_in, first):
        torch.testing.assert_close(a.grad, 2 * once, atol=tol, rtol=tol)


def test_label_smoothing_changes_the_loss_and_is_refused_outside_0_to_1():
    g = torch.Generator().manual_seed(3)
    x, W = torch.randn(5, 4, generator=g), torch.randn(9, 4, generator=g)
    targets = torch.randint(0, 9, (5,), generator=g)
    assert not torch.allclose(linear_token_nll(x, W, None, targets, 0.1), linear_token_nll(x, W, None, targets))
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="label smoothing must be in \\[0, 1\\)"):
            linear_token_nll(x, W, None, targets, bad)


def test_linear_token_nll_under_autocast_falls_back_to_the_plain_layer():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(13, 8, generator=g, requires_grad=True)
    W = torch.randn(21, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 21, (13,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nll = linear_token_nll(x, W, None, targets)
    ref = F.cross_entropy(F.linear(x, W), targets, reduction="none")
    torch.testing.assert_close(nll, ref.detach(), atol=0.1, rtol=0.05)  # bf16 matmul
    nll.sum().backward()
    assert x.grad is not None and W.grad is not None and W.grad.dtype == torch.float32


def _toy_recurrence(weight: torch.Tensor, recur: torch.Tensor, xs: list[torch.Tensor], defer: bool,
                    skip_last: bool = False) -> torch.Tensor:
    """h_t = tanh(b + x_t @ W_x^T + h_{t-1} @ W_h^T + h_{t-1} @ U^T) with weight = [W_x | W_h] split in two
    column blocks (as the LSTM's weight_ih), on a batch that shrinks like the decoder's; returns a loss."""
    H = recur.shape[0]
    w_x, w_h = step_weights(weight, (weight.shape[1] - H, H), defer)
    (u,) = step_weights(recur, None, defer)
    bias = torch.linspace(-1, 1, H, dtype=weight.dtype)
    h = torch.zeros(xs[0].shape[0], H, dtype=weight.dtype)
    loss = 0.0
    for t, x in enumerate(xs):
        n = x.shape[0]
        h = torch.tanh(u.addmm(w_h.addmm(w_x.addmm(bias, x), h[:n]), h[:n]))
        if not (skip_last and t == len(xs) - 1):
            loss = loss + (h ** 2).sum() * (t + 1)
    return loss


@pytest.mark.parametrize("skip_last", [False, True])
def test_step_weight_gradients_equal_per_step_autograd(skip_last):
    """Including a last step whose output never reaches the loss (its backward never runs)."""
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(5, 6 + 5, generator=g, dtype=torch.float64, requires_grad=True)
    recur = torch.randn(5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    xs = [torch.randn(n, 6, generator=g, dtype=torch.float64, requires_grad=True) for n in (4, 4, 3, 1)]
    grads = {}
    for defer in (False, True):
        loss = _toy_recurrence(weight, recur, xs, defer, skip_last)
        grads[defer] = torch.autograd.grad(loss, [weight, recur, *xs], allow_unused=True)
    for plain, fast in zip(grads[False], grads[True]):
        assert (plain is None) == (fast is None)
        if plain is not None:
            torch.testing.assert_close(fast, plain, atol=1e-12, rtol=1e-12)
    # a second backward through a retained graph gives the same gradient again
    loss = _toy_recurrence(weight, recur, xs, True, skip_last)
    first = torch.autograd.grad(loss, [weight], retain_graph=True)[0]
    second = torch.autograd.grad(loss, [weight])[0]
    torch.testing.assert_close(first, second, atol=0, rtol=0)


def test_step_weights_are_plain_without_autograd_and_check_splits():
    weight = torch.randn(2, 3, requires_grad=True)
    with torch.no_grad():
        (step,) = step_weights(weight, defer=True)
        assert step.block.data_ptr() == weight.data_ptr() and step._record is None  # a plain view
        # (MKL's packed matmul may round differently from the plain one)
        torch.testing.assert_close(step.addmm(torch.zeros(4, 2), torch.ones(4, 3)), torch.ones(4, 3) @ weight.t())
    with pytest.raises(ValueError, match="do not add up"):
        step_weights(weight, (1, 1))


def _reference_outputs(fast: FastShowAttendTellDecoder, grid, captions, lengths, hard: bool, scene: str = "none"):
    """The reference decoder module (the paper's equations step by step over the padded batch, nothing sorted,
    packed, cached or fused) with the fast decoder's weights, every fast path off: (reference module, its
    padded logits, alphas, mask, log p(s_t), entropies)."""
    ref = ShowAttendTellDecoder(**_ARGS, attention="hard" if hard else "soft", scene=scene).to(grid.dtype).eval()
    ref.load_state_dict(fast.state_dict())  # the same state_dict keys: one set of weights, two implementations
    with fast_paths.reference():
        out = ref(grid, captions, lengths, attention_mode="argmax" if hard else "expectation")  # argmax: deterministic
    return ref, out.logits, out.alphas, out.mask, out.log_probs, out.entropies


_ARGS = dict(vocab_size=23, feature_dim=10, embed_dim=8, hidden_dim=9, attention_dim=7, dropout=0.0)


@pytest.mark.parametrize("scene", ["none", "mean"])
@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard-argmax"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_training_gradients_equal_the_reference_decoder(hard, dtype, scene):
    """The fast decoder's loss (sorted shrinking batch, packed output layer fused with token_nll, deferred LSTM
    weight gradients) against the reference module's padded logits and F.cross_entropy: every gradient equal, with
    and without the scene beside the read (model.decoder.scene)."""
    torch.manual_seed(0)
    V, D, L = _ARGS["vocab_size"], _ARGS["feature_dim"], 6
    dec = FastShowAttendTellDecoder(**_ARGS, attention="hard" if hard else "soft", scene=scene).to(dtype).eval()
    g = torch.Generator().manual_seed(2)
    grid = torch.randn(5, L, D, generator=g, dtype=dtype, requires_grad=True)
    lengths = torch.tensor([7, 3, 7, 5, 2])  # unsorted, with ties and a one-word caption
    captions = torch.randint(4, V, (5, 7), generator=g)
    captions[:, 0] = 1
    captions[torch.arange(5), lengths - 1] = 2
    captions[torch.arange(7)[None] >= lengths[:, None]] = 0
    targets = captions[:, 1:]

    ref, logits, alphas, mask, log_probs, entropies = _reference_outputs(dec, grid, captions, lengths, hard, scene)
    n = mask.sum()
    nll = F.cross_entropy(logits[mask], targets[mask], reduction="sum")
    penalty = ((1 - alphas.sum(1)) ** 2).sum()  # Eq. (14), summed over captions
    if hard:  # Eq. (10)-(12) with λ_r = 0.5, λ_e = 0.1, b = -4
        reward = -F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(mask.shape)
        reward = (reward * mask).sum(1).detach()
        expected = (nll - 0.5 * ((reward + 4.0) * log_probs.sum(1)).sum() - 0.1 * entropies.sum() + 0.3 * penalty) / n
        fast = hard_attention_loss(dec(grid, captions, lengths, attention_mode="argmax"), targets, baseline=-4.0,
                                   alpha_c=0.3, reinforce_weight=0.5, entropy_weight=0.1).loss
    else:
        expected = (nll + 0.3 * penalty) / n
        fast = soft_attention_loss(dec(grid, captions, lengths), targets, alpha_c=0.3).loss
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(fast, expected, atol=tol, rtol=tol)
    ref_grads = torch.autograd.grad(expected, list(ref.parameters()) + [grid], allow_unused=True)
    fast_grads = torch.autograd.grad(fast, list(dec.parameters()) + [grid], allow_unused=True)
    names = [name for name, _ in dec.named_parameters()] + ["grid"]  # the grid learns too (position embedding)
    assert names[:-1] == [name for name, _ in ref.named_parameters()]
    for name, p, a, b in zip(names, list(dec.parameters()) + [grid], fast_grads, ref_grads):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        scale = max(float(b.abs().max()), 1e-3)
        assert float((a - b).abs().max()) <= tol * scale, f"gradient of {name} differs"


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_under_the_reference_switch_the_fast_decoder_runs_the_reference_code(attention):
    """Same weights: inside fast_paths.reference() the fast decoder's forward, step and sample are the
    reference module's, bit for bit (the same code runs)."""
    torch.manual_seed(1)
    fast = FastShowAttendTellDecoder(**_ARGS, attention=attention).eval()
    ref = ShowAttendTellDecoder(**_ARGS, attention=attention).eval()
    ref.load_state_dict(fast.state_dict())
    grid = torch.randn(3, 5, _ARGS["feature_dim"])
    captions = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0], [1, 4, 9, 2]])
    lengths = torch.tensor([4, 3, 4])
    mode = "argmax" if attention == "hard" else "expectation"
    with fast_paths.reference():
        a, b = fast(grid, captions, lengths, mode), ref(grid, captions, lengths, mode)
        assert torch.equal(a.packed_features, b.packed_features) and torch.equal(a.rows, b.rows)
        assert torch.equal(a.alphas, b.alphas)
        step_a = fast.step_with_location(captions[:, 0], fast.init_state(grid), mode)
        step_b = ref.step_with_location(captions[:, 0], ref.init_state(grid), mode)
        assert torch.equal(step_a[0], step_b[0]) and torch.equal(step_a[1], step_b[1])
        torch.manual_seed(2)
        sa = fast.sample(grid, 2, 1, 2, 5, attention_mode="sample" if attention == "hard" else "expectation")
        torch.manual_seed(2)
        sb = ref.sample(grid, 2, 1, 2, 5, attention_mode="sample" if attention == "hard" else "expectation")
        assert torch.equal(sa.tokens, sb.tokens) and torch.equal(sa.word_log_probs, sb.word_log_probs)
    fast_out = fast(grid, captions, lengths, mode)  # switch off again: the fast path, equal to rounding
    assert not torch.equal(fast_out.rows, a.rows)  # packed time-major, not row-major: the other code ran
    torch.testing.assert_close(fast_out.logits, a.logits, atol=1e-5, rtol=1e-5)


def test_built_adam_matches_the_default_update():
    """build_optimizer's Adam (fused where PyTorch has it) takes the same steps as the default Adam."""
    from captioner.training.optim import build_optimizer

    g = torch.Generator().manual_seed(3)
    start = [torch.randn(40, 30, generator=g), torch.randn(30, generator=g)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(5)]
    result = []
    for build in (lambda ps: build_optimizer("adam", ps, lr=1e-2, weight_decay=1e-3),
                  lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3, foreach=False)):
        params = [p.clone().requires_grad_() for p in start]
        optimizer = build(params)
        for step in grads:
            for p, grad in zip(params, step):
                p.grad = grad.clone()
            optimizer.step()
        result.append(params)
    for fast, plain in zip(*result):
        torch.testing.assert_close(fast, plain, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(result[0][0], start[0])  # the steps did move the parameters


def test_keep_freed_memory_applies_on_glibc_linux():
    import platform
    import sys

    from captioner.runtime import keep_freed_memory

    applied = keep_freed_memory()
    assert keep_freed_memory() is applied  # idempotent
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert applied


@pytest.mark.parametrize("attention,mode,gate,scene", [("soft", "expectation", "scalar", "none"),
                                                       ("hard", "argmax", "scalar", "none"),
                                                       ("hard", "expectation", "none", "none"),
                                                       ("key_value", "expectation", "scalar", "none"),
                                                       ("soft", "expectation", "scalar", "mean"),
                                                       ("hard", "argmax", "scalar", "mean")])
def test_projected_values_decode_like_the_plain_step(attention, mode, gate, scene):
    """Beam search's projected values (expand_state with enough beams for the grid) give the same
    log-probabilities, maps and search results as reading the raw context."""
    from captioner.decoding.options import DecodeOptions
    from captioner.decoding.search import beam_search

    torch.manual_seed(4)
    dec = FastShowAttendTellDecoder(31, 12, embed_dim=10, hidden_dim=11, attention_dim=9, attention=attention,
                                gate=gate, dropout=0.0, scene=scene).eval()
    grid = torch.randn(3, 6, 12)
    K = 4
    assert dec._projects_values(K, 6) and not dec._projects_values(K, 196)  # a 14x14 grid needs 15 beams
    with torch.no_grad():
        fast_state = dec.expand_state(dec.init_state(grid), K)
        dec.project_values_words = 0
        plain_state = dec.expand_state(dec.init_state(grid), K)
        assert isinstance(fast_state, ProjectedState) and not isinstance(plain_state, ProjectedState)
        tokens = torch.randint(4, 31, (3 * K,))
        for _ in range(3):
            fast = dec.step_with_location(tokens, fast_state, mode)
            plain = dec.step_with_location(tokens, plain_state, mode)
            torch.testing.assert_close(fast[0], plain[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(fast[1], plain[1], atol=1e-6, rtol=1e-5)
            fast_state, plain_state = fast[3], plain[3]
            assert isinstance(fast_state, ProjectedState)
            tokens = fast[0].argmax(-1)

        def step(t, s):
            log_probs, alpha, _, state = dec.step_with_location(t, s, mode)
            return log_probs, alpha, state

        results = []
        for words in (20, 0):
            dec.project_values_words = words
            results.append(beam_search(step, dec.init_state(grid), DecodeOptions(beam=K, n_best=2, max_length=8),
                                       batch_size=3, start_id=1, end_id=2, expand=dec.expand_state))
    for fast_hyps, plain_hyps in zip(*results):
        assert [h.tokens for h in fast_hyps] == [h.tokens for h in plain_hyps]
        for a, b in zip(fast_hyps, plain_hyps):
            assert a.score == pytest.approx(b.score, abs=1e-4)


def test_vector_gate_and_multi_head_decode_unprojected():

    for kwargs in (dict(gate="vector"), dict(attention="multi_head", heads=3)):
        dec = FastShowAttendTellDecoder(20, 12, embed_dim=8, hidden_dim=9, attention_dim=9, **kwargs).eval()
        with torch.no_grad():
            state = dec.expand_state(dec.init_state(torch.randn(2, 4, 12)), 8)
        assert not isinstance(state, ProjectedState)


@pytest.mark.parametrize("optimizer", ["sgd", "fused_adam"])
def test_inference_caches_follow_weight_updates(optimizer):
    """step_with_location() without autograd reads cached stacks of weights (the word-gate table, the h_{t-1} stack); an
    optimizer step (fused Adam's kernel leaves the tensors' version counters alone) or load_state_dict must
    invalidate them."""
    from captioner.training.optim import build_optimizer

    torch.manual_seed(5)
    dec = FastShowAttendTellDecoder(17, 8, embed_dim=6, hidden_dim=7, attention_dim=5, dropout=0.0).eval()
    grid = torch.randn(2, 4, 8)
    tokens = torch.tensor([3, 9])

    def step_logp():
        with torch.no_grad():
            return dec.step_with_location(tokens, dec.init_state(grid))[0]

    def reference():  # the autograd path builds no cache
        with torch.enable_grad():
            return dec.step_with_location(tokens, dec.init_state(grid))[0].detach()

    before = step_logp()
    torch.testing.assert_close(before, reference(), atol=1e-6, rtol=1e-6)
    optimizer = (torch.optim.SGD(dec.parameters(), lr=0.5) if optimizer == "sgd"
                 else build_optimizer("adam", dec.parameters(), lr=0.5))
    loss = dec.step_with_location(tokens, dec.init_state(grid))[0].logsumexp(-1).sum() + dec.embedding.weight.sum()
    loss.backward()
    optimizer.step()
    after = step_logp()
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, reference(), atol=1e-6, rtol=1e-6)
    fresh = FastShowAttendTellDecoder(17, 8, embed_dim=6, hidden_dim=7, attention_dim=5, dropout=0.0).eval()
    dec.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(step_logp(), reference(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", ["expectation", "argmax"])  # argmax: a soft model reading one cell of projected values
def test_sample_without_autograd_reads_projected_values_like_the_plain_path(mode):
    """sample() expands its state like beam search; without autograd that may give a ProjectedState."""
    torch.manual_seed(6)
    dec = FastShowAttendTellDecoder(19, 10, embed_dim=8, hidden_dim=9, attention_dim=7, dropout=0.0).eval()
    grid = torch.randn(2, 3, 10)
    outs = []
    for words in (20, 0):  # projected, plain
        dec.project_values_words = words
        with torch.no_grad():
            outs.append(dec.sample(grid, 4, start_id=1, end_id=2, max_length=6, greedy=True, attention_mode=mode))
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    torch.testing.assert_close(outs[0].word_log_probs, outs[1].word_log_probs, atol=1e-5, rtol=1e-5)


def test_step_weight_uses_a_packing_it_holds_at_once_and_mm_leaves_out_the_base():
    from captioner.fast import deferred

    g = torch.Generator().manual_seed(0)
    weight, base = torch.randn(30, 20, generator=g), torch.randn(30, generator=g)
    step = deferred.StepWeight(weight)
    x = torch.randn(6, 20, generator=g)
    with torch.no_grad():
        for _ in range(step.PACK_AFTER + 1):
            step.addmm(base, x)
        if not deferred._mkl_packs(x, weight):
            pytest.skip("no MKL packed GEMM in this build")
        packed = step._packed
        assert packed is not None and packed[0] == 6
        step.addmm(base, torch.randn(2, 20, generator=g))  # another row count: plain, the packing kept
        assert step._packed is packed
        calls = []
        real = torch.ops.mkl._mkl_linear
        try:
            torch.ops.mkl._mkl_linear = lambda *a: calls.append(1) or real(*a)
            torch.testing.assert_close(step.addmm(base, x), torch.addmm(base, x, weight.t()))  # packed at once
            torch.testing.assert_close(step.mm(x), x @ weight.t())
        finally:
            torch.ops.mkl._mkl_linear = real
        assert len(calls) == 2 and step._packed is packed
    with pytest.raises(RuntimeError, match="inference"):
        step.mm(x.requires_grad_())


@pytest.mark.parametrize("rows", [1, 7, 32])
def test_packed_step_weight_equals_addmm_and_repacks_when_rows_change(rows):
    from captioner.fast import deferred

    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(40, 64, generator=g)[:, 8:]  # a column block: a strided view, as the LSTM's context block
    base = torch.randn(40, generator=g)
    step = deferred.StepWeight(weight)
    in_a_row, last = 0, None
    for n in [rows] * 4 + [rows + 5] * 3:
        in_a_row, last = (in_a_row + 1 if n == last else 1), n
        x = torch.randn(n, 56, generator=g)
        with torch.no_grad():
            torch.testing.assert_close(step.addmm(base, x), torch.addmm(base, x, weight.t()), atol=1e-5, rtol=1e-5)
        if deferred._mkl_packs(x, weight):  # an MKL build: packed for n rows from the third call in a row
            assert (step._packed is not None and step._packed[0] == n) == (in_a_row > step.PACK_AFTER)
    x = torch.randn(3, 56, generator=g, requires_grad=True)
    out = step.addmm(base, x)  # with autograd: the plain matmul, gradients flow
    out.sum().backward()
    torch.testing.assert_close(x.grad, weight.sum(0).expand(3, -1))
