"""The straight-through Gumbel-softmax estimator of hard attention (train.objective.kind: gumbel; Jang et al.
2017, Maddison et al. 2017): the read (models/attention.py, mode "gumbel") takes one cell, a sample of alpha, and
carries the relaxed sample's gradient; the fast decoder computes what the reference does; a tiny run on the
shapes data trains its scorer through the read alone; the temperature schedule; the config's keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import captioner.models.attention as attention_mod
import captioner.training.validation as validation_mod
from captioner import fast as fast_paths
from captioner.api import build_model
from captioner.config import ConfigError, get_path, load_config
from captioner.data.vocab import Vocab
from captioner.models.attention import HardAttention, gumbel_noise, read_context
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.names import DECODING_MODES
from captioner.store.checkpoint import load_checkpoint
from captioner.training.distributed import seed_everything
from captioner.training.loop import train
from captioner.training.losses import gumbel_attention_loss, gumbel_temperature

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
GUMBEL = ["model.attention.attention=hard", "train.objective.kind=gumbel"]


# --------------------------------------------------------------------------- the forward read


@pytest.mark.parametrize("group", [1, 3])
def test_the_forward_pass_reads_exactly_the_chosen_cell(group):
    """z = a_s bit for bit, under autograd too (the straight-through term adds an exact zero), with s =
    argmax(log alpha + g); with G queries per values row (beam search's layout) row n reads values row n // G.
    The temperature changes nothing in the forward pass."""
    g = torch.Generator().manual_seed(0)
    N, L, D = 12, 7, 5
    scores = torch.randn(N, L, generator=g).requires_grad_()
    values = torch.randn(N // group, L, D, generator=g).requires_grad_()
    reads = [read_context(scores, values, "gumbel", generator=torch.Generator().manual_seed(1), temperature=tau)
             for tau in (0.1, 1.0, 50.0)]
    noise = gumbel_noise(scores, torch.Generator().manual_seed(1))  # the same draws
    log_alpha = F.log_softmax(scores, -1)
    expected = (log_alpha + noise).argmax(-1)
    rows = torch.arange(N) // group
    for read in reads:
        assert torch.equal(read.index, expected)
        assert torch.equal(read.context, values[rows, expected])  # exactly one cell, no mixture
        assert torch.equal(read.log_prob, log_alpha.gather(1, expected.unsqueeze(1)).squeeze(1))
        assert torch.allclose(read.alpha, log_alpha.exp())


def test_the_chosen_cell_is_a_sample_of_alpha():
    """Over many draws the cells' frequencies are alpha's (the Gumbel-max trick), within 5 standard errors;
    a dominant alpha is read every time; and a row under expectation_mask reads the expectation, as the
    other one-cell modes do (§4.1's trick)."""
    n, L = 40000, 5
    alpha = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05])
    scores = alpha.log().expand(n, L)
    values = torch.eye(L).expand(1, L, L)  # one-hot cells: the context says which cell was read
    read = read_context(scores, values, "gumbel", generator=torch.Generator().manual_seed(2), temperature=0.5)
    freq = read.context.mean(0)
    se = (alpha * (1 - alpha) / n).sqrt()
    assert torch.all((freq - alpha).abs() < 5 * se), (freq, alpha)
    assert torch.equal(torch.bincount(read.index, minlength=L).float() / n, freq)
    dominant = torch.tensor([0.0, 12.0, 0.0, 0.0, 0.0]).expand(1000, L)  # alpha_1 > 0.9999
    assert torch.all(read_context(dominant, values, "gumbel", generator=torch.Generator().manual_seed(3)).index == 1)
    masked = torch.tensor([True, False]).repeat(n // 2)
    mixed = read_context(scores, values, "gumbel", masked, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(mixed.context[masked], alpha.expand(n // 2, L))
    assert torch.all(mixed.index[masked] == -1) and torch.all(mixed.log_prob[masked] == 0)
    assert torch.equal(mixed.context[~masked], read.context[~masked])


# --------------------------------------------------------------------------- the backward pass


def test_the_gradient_is_the_straight_through_relaxed_sample():
    """Against the formula written out: y = onehot(s) - stopgrad(y~) + y~, y~ = softmax((log alpha + g) / τ),
    z = Σ_i y_i a_i, with the same noise: the gradients reaching the scores and the values agree."""
    g = torch.Generator().manual_seed(4)
    N, L, D, tau = 6, 5, 3, 0.7
    scores = torch.randn(N, L, generator=g, dtype=torch.float64, requires_grad=True)
    values = torch.randn(N, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(N, D, generator=g, dtype=torch.float64)
    read = read_context(scores, values, "gumbel", generator=torch.Generator().manual_seed(5), temperature=tau)
    got = torch.autograd.grad((read.context * weight).sum(), (scores, values))
    perturbed = F.log_softmax(scores, -1) + gumbel_noise(scores, torch.Generator().manual_seed(5))
    soft = F.softmax(perturbed / tau, -1)
    y = F.one_hot(perturbed.argmax(-1), L).to(soft.dtype) - soft.detach() + soft
    context = torch.bmm(y.unsqueeze(1), values).squeeze(1)
    want = torch.autograd.grad((context * weight).sum(), (scores, values))
    assert torch.allclose(read.context, context)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert got[0].abs().max() > 1e-3  # the scores do get a gradient through the context
    # ... which "sample" (REINFORCE's read) does not give them: there only log p(s) reaches the scorer
    sampled = read_context(scores, values, "sample", generator=torch.Generator().manual_seed(5))
    (grad,) = torch.autograd.grad((sampled.context * weight).sum(), scores, allow_unused=True)
    assert grad is None or grad.abs().max() == 0


def _mean_gradient(scores: torch.Tensor, values: torch.Tensor, w: torch.Tensor, tau: float, n: int = 4000):
    """The straight-through gradient of f(z) = w·z w.r.t. the scores (L,), averaged over n draws."""
    s = scores.clone().requires_grad_()
    read = read_context(s.expand(n, -1), values.unsqueeze(0), "gumbel",
                        generator=torch.Generator().manual_seed(6), temperature=tau)
    (grad,) = torch.autograd.grad((read.context @ w).sum() / n, s)
    return grad


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform-alpha", "peaked-alpha"])
def test_at_high_temperature_the_mean_gradient_points_like_the_soft_gradient(uniform):
    """For a linear f(z) = w·z the true gradient of E_{s~alpha} f(a_s) = Σ_i alpha_i f(a_i) is soft attention's,
    alpha ⊙ (u - alpha·u) with u_i = w·a_i. The relaxed sample y~ = softmax((log alpha + g)/τ) is not unbiased
    (its mean is not alpha at τ = 1), but as τ -> ∞, y~ -> 1/L + (log alpha + g - mean)/(L τ), so the
    straight-through gradient w.r.t. the scores tends to (u - mean(u)) / (L τ), whatever the noise:

    - at uniform alpha that is the soft gradient divided by τ (τ · estimate == soft gradient);
    - at any alpha its inner product with the soft gradient is Var_alpha(u) / (L τ) > 0 (Σ_i alpha_i (u_i - ū)
      (u_i - alpha·u) = Var_alpha(u)): the estimate points uphill.

    The check fails if the read ignored τ (a factor τ off), gave the scores no gradient (zero), or read
    the relaxed sample's gradient through a softmax of the wrong logits (the shape of u - mean(u) breaks)."""
    g = torch.Generator().manual_seed(7)
    L, D, tau = 6, 4, 1000.0
    scores = torch.zeros(L, dtype=torch.float64) if uniform else torch.randn(L, generator=g, dtype=torch.float64) * 1.5
    values = torch.randn(L, D, generator=g, dtype=torch.float64)
    w = torch.randn(D, generator=g, dtype=torch.float64)
    alpha, u = F.softmax(scores, -1), values @ w  # (L,), (L,)
    soft = alpha * (u - alpha @ u)  # d/dscores of Σ_i alpha_i u_i
    estimate = _mean_gradient(scores, values, w, tau)
    torch.testing.assert_close(L * tau * estimate, u - u.mean(), rtol=2e-2, atol=2e-2 * float(u.abs().max()))
    if uniform:
        torch.testing.assert_close(tau * estimate, soft, rtol=2e-2, atol=2e-2 * float(soft.abs().max()))
    variance = alpha @ (u - alpha @ u) ** 2
    assert float(estimate @ soft) == pytest.approx(float(variance) / (L * tau), rel=2e-2)
    assert float(estimate @ soft) > 0


# --------------------------------------------------------------------------- the decoder, fast and reference

SENTENCES = [s.split() for s in ("a red circle above a blue square", "a green triangle left of a red circle",
                                 "two blue squares", "a small red triangle below a big green circle")]


def _model_and_batch(seed: int = 0):
    cfg = load_config(SMOKE, [*GUMBEL, "model.decoder.dropout=0.0",
                              "model.decoder.hidden_dim=48", "model.attention.attention_dim=24"])
    vocab = Vocab.build(SENTENCES)
    torch.manual_seed(seed)
    model = build_model(cfg, vocab)
    ids = [vocab.encode(words) for words in SENTENCES]
    captions = torch.full((len(ids), max(map(len, ids))), vocab.pad_id)
    for i, row in enumerate(ids):
        captions[i, :len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in ids])
    grid = torch.randn(len(ids), 16, model.encoder.out_dim, generator=torch.Generator().manual_seed(seed))
    return model, grid, captions, lengths


def _loss_and_grads(model, grid, captions, lengths, mode: str, expectation=None, temperature: float = 1.0):
    model.zero_grad(set_to_none=True)
    out = model(grid, captions, lengths, attention_mode=mode, expectation_mask=expectation, temperature=temperature)
    res = gumbel_attention_loss(out, captions[:, 1:], alpha_c=0.0)
    res.loss.backward()
    return res.loss.detach(), out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fast_and_reference_decoders_read_and_differentiate_alike(monkeypatch):
    """The fast decoder (sorted, shrinking batch, stacked and deferred weights) runs the gumbel read itself, not
    the reference: with the same noise for every row (the two paths visit rows in different orders, so they
    cannot share seeded draws) both give the same loss, alphas, log p(s) and every parameter's gradient, with
    and without expectation rows."""
    fixed = torch.randn(16, generator=torch.Generator().manual_seed(8)) * 2.0  # one Gumbel-like draw per cell
    monkeypatch.setattr(attention_mod, "gumbel_noise",
                        lambda like, generator=None: fixed.to(like.dtype).expand(like.shape))
    fast_steps = []
    real_step = FastShowAttendTellDecoder._recur_fast
    monkeypatch.setattr(FastShowAttendTellDecoder, "_recur_fast",
                        lambda *a, **k: fast_steps.append(1) or real_step(*a, **k))
    model, grid, captions, lengths = _model_and_batch()
    model.train()
    for expectation in (None, torch.tensor([True, False, False, True])):
        runs = {}
        for reference in (False, True):
            fast_steps.clear()
            with fast_paths.reference(reference):
                runs[reference] = _loss_and_grads(model, grid, captions, lengths, "gumbel", expectation, 0.5)
            assert bool(fast_steps) is not reference
        (loss_f, out_f, grads_f), (loss_r, out_r, grads_r) = runs[False], runs[True]
        torch.testing.assert_close(loss_f, loss_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out_f.alphas, out_r.alphas, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out_f.log_probs, out_r.log_probs, atol=1e-5, rtol=1e-5)
        assert grads_f.keys() == grads_r.keys()
        for name in grads_f:
            scale = max(float(grads_r[name].abs().max()), 1e-3)
            assert float((grads_f[name] - grads_r[name]).abs().max()) <= 1e-4 * scale, name


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_the_scorer_learns_through_the_gumbel_read_and_not_through_sample(reference):
    """With cross-entropy alone (no λ, γ, no REINFORCE term), the relaxed read gives every scorer weight a
    gradient; the same loss on the "sample" read gives the scorer none (only REINFORCE's log p(s) could)."""
    model, grid, captions, lengths = _model_and_batch()
    model.train()
    with fast_paths.reference(reference):
        _, _, grads = _loss_and_grads(model, grid, captions, lengths, "gumbel")
        _, _, sampled = _loss_and_grads(model, grid, captions, lengths, "sample")
    scorer = [n for n, _ in model.named_parameters() if ".attention.scorer." in n]
    assert {n.rsplit(".", 2)[-2] for n in scorer} == {"key_proj", "query_proj", "v"}
    for name in scorer:
        assert name in grads and grads[name].abs().max() > 1e-6, name
        assert name not in sampled or sampled[name].abs().max() < 1e-7, name


def test_decoding_refuses_the_training_read():
    model, grid, _, _ = _model_and_batch()
    model.eval()
    with pytest.raises(ValueError, match="attention_mode must be one of expectation, argmax, sample, got 'gumbel'"):
        model.generate(grid, model.decode_options.replace_given(beam=1, attention_mode="gumbel"))
    assert "gumbel" not in DECODING_MODES
    with pytest.raises(ConfigError, match="eval.attention_mode"):
        load_config(None, ["eval.attention_mode=gumbel"])
    assert "temperature" not in vars(HardAttention)  # τ is an argument of the read, never a module's attribute


# --------------------------------------------------------------------------- the schedule and a tiny run


def test_the_temperature_anneals_geometrically_from_start_to_end():
    taus = [gumbel_temperature(e, 5, 2.0, 0.125) for e in range(5)]
    assert taus == pytest.approx([2.0, 1.0, 0.5, 0.25, 0.125])  # ratio (1/16)^(1/4) = 1/2 per epoch
    assert gumbel_temperature(0, 1, 2.0, 0.5) == 2.0  # a one-epoch run keeps its start
    assert gumbel_temperature(9, 3, 1.0, 0.5) == 0.5  # past the end (a resume beyond epochs): the end
    assert [gumbel_temperature(e, 4, 0.7, 0.7) for e in range(4)] == pytest.approx([0.7] * 4)  # constant


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gumbel_shapes")


@pytest.fixture
def no_metrics(monkeypatch):
    """No Java, no metric cost: the training loop is under test, not the captions."""
    monkeypatch.setattr(validation_mod, "caption_scores", lambda predictions, references, meteor=False:
                        {"BLEU-4": 1.0, "CIDEr-D": 1.0})


def _tiny_cfg(data_root: Path, run_dir: Path, *overrides: str):
    return load_config(SMOKE, [f"data.root={data_root}", f"train.run_dir={run_dir}", "train.num_threads=1",
                               "train.tensorboard_images=0", "train.tensorboard=off", *GUMBEL, *overrides])


def test_a_tiny_gumbel_run_on_shapes_lowers_the_loss_and_trains_the_scorer(data_root, tmp_path, no_metrics):
    """Three epochs of the smoke model with hard attention and the gumbel estimator on the shapes data: the
    cross-entropy falls, each epoch trains at its scheduled τ, no baseline is kept, and with λ = γ = 0 and no
    expectation captions the scorer's weights still moved (Adam leaves a weight with zero gradient where it
    is): the relaxed read is their only gradient."""
    cfg = _tiny_cfg(data_root, tmp_path / "run", "train.epochs=3", "train.objective.alpha_c=0",
                    "train.objective.expectation_prob=0", "train.objective.temperature=2.0",
                    "train.objective.temperature_min=0.5")
    run = train(cfg)
    log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["train_temperature"] for e in log] == pytest.approx([2.0, 1.0, 0.5])
    assert log[-1]["train_xe"] < log[0]["train_xe"] - 0.2
    assert all("baseline" not in e for e in log) and "train_reinforce" not in log[0]
    trained = load_checkpoint(run / "last.pt")["model"]
    seed_everything(cfg.train.seed)  # the run's initial weights (train._set_up builds them right after this)
    initial = build_model(cfg, Vocab.load(run / "vocab.json")).state_dict()
    frozen = [k for k in initial if k.startswith("encoder.backbone") and initial[k].is_floating_point()]
    assert frozen and all(torch.equal(initial[k], trained[k]) for k in frozen)  # the same start, reproduced
    for key in ("decoder.attention.scorer.v.weight", "decoder.attention.scorer.query_proj.weight",
                "decoder.attention.scorer.key_proj.weight"):
        assert (trained[key] - initial[key]).abs().max() > 1e-4, key


def test_a_resumed_gumbel_run_continues_exactly(data_root, tmp_path, no_metrics, capsys):
    """τ depends on the epoch and the config only, and the noise on the RNG states the checkpoint keeps: a run of
    two epochs stopped after one (its time budget), then resumed without a budget, ends on the very weights of two
    epochs straight. A resume that changes train.epochs is refused (issue 45): τ anneals over train.epochs, so a
    longer run would read at a higher τ again after a lower one (2, 0.5, then 0.79 resuming 2 epochs to 4). Before,
    this test resumed a one-epoch run to two epochs; that is what is refused now."""
    from captioner.commands.train import main

    sets = ("train.objective.temperature=2.0", "train.objective.temperature_min=0.5", "train.epochs=2")
    straight = train(_tiny_cfg(data_root, tmp_path / "straight", *sets))
    first = train(_tiny_cfg(data_root, tmp_path / "resumed", *sets, "train.time_budget_s=0.001"))
    assert load_checkpoint(first / "last.pt")["stop"] == "time budget"
    assert main(["--resume", str(first), "--set", "train.epochs=4", "--set", "train.time_budget_s=0"]) == 1
    err = capsys.readouterr().err
    assert "train.epochs is 4 but the run was trained with 2" in err and "Gumbel-softmax temperature" in err
    assert main(["--resume", str(first)]) == 0  # the same budget: the run had stopped, and stops there again
    assert load_checkpoint(first / "last.pt")["epoch"] == 1
    assert main(["--resume", str(first), "--set", "train.time_budget_s=0"]) == 0
    a, b = load_checkpoint(straight / "last.pt")["model"], load_checkpoint(first / "last.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    taus = [json.loads(line)["train_temperature"] for line in (first / "metrics.jsonl").read_text().splitlines()]
    assert taus == pytest.approx([2.0, 0.5])


# --------------------------------------------------------------------------- the config


def test_the_gumbel_objective_reads_its_keys_and_refuses_the_others():
    cfg = load_config(None, [*GUMBEL, "train.objective.temperature=2", "train.objective.temperature_min=0.1",
                             "train.objective.expectation_prob=0", "train.objective.alpha_c=0.5",
                             "train.objective.alpha_entropy=0.1"])
    assert (cfg.train.objective.temperature, cfg.train.objective.temperature_min) == (2.0, 0.1)
    for key in ("reinforce_weight", "entropy_weight", "baseline_decay", "samples", "reward_discount"):
        with pytest.raises(ConfigError, match=f"unknown config key 'train.objective.{key}' .*for kind gumbel"):
            load_config(None, [*GUMBEL, f"train.objective.{key}=0.5"])
    for kind in ("reinforce", "loo"):
        for key in ("temperature=2", "temperature_min=0.1"):
            with pytest.raises(ConfigError, match=f"unknown config key 'train.objective.{key.split('=')[0]}'"):
                load_config(None, ["model.attention.attention=hard", f"train.objective.kind={kind}",
                                   f"train.objective.{key}"])
    with pytest.raises(ConfigError, match="'gumbel' trains hard attention's location policy"):
        load_config(None, ["train.objective.kind=gumbel"])  # a soft model has no location policy


@pytest.mark.parametrize("override, match", [
    ("train.objective.temperature=0", "train.objective.temperature: must be > 0"),
    ("train.objective.temperature_min=-0.5", "train.objective.temperature_min: must be > 0"),
    ("train.objective.temperature_min=2", r"temperature_min \(2.0\) must be <= train.objective.temperature \(1.0\)"),
])
def test_temperatures_are_validated(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*GUMBEL, override])
    cfg = load_config(None, [*GUMBEL, "train.objective.temperature_min=1"])
    assert get_path(cfg, "train.objective.temperature_min") == 1.0
