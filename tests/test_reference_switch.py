"""The one reference switch (captioner/fast): a few training steps and a decode, once with the fast paths
and once with every one of them off, give the same losses, gradients, weights and captions; the switch really
reaches the fast code (spied on), and the environment and the training config turn it on."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import captioner.fast.token_nll as token_nll_mod
from captioner import fast as fast_paths
from captioner.api import build_model
from captioner.config import load_config
from captioner.data.vocab import Vocab
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.training.losses import hard_attention_loss, soft_attention_loss
from captioner.training.optim import build_optimizer

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
SMOKE_TRANSFORMER = SMOKE.with_name("smoke_transformer.yaml")
SENTENCES = [s.split() for s in ("a red circle above a blue square", "a green triangle left of a red circle",
                                 "two blue squares", "a small red triangle below a big green circle")]
STEPS = 3


def _batch(vocab: Vocab, D: int, L: int):
    g = torch.Generator().manual_seed(0)
    ids = [vocab.encode(words) for words in SENTENCES]  # <start> .. <end>
    T = max(map(len, ids))
    captions = torch.full((len(ids), T), vocab.pad_id)
    for i, row in enumerate(ids):
        captions[i, :len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in ids])
    return torch.randn(len(ids), L, D, generator=g), captions, lengths


def _train_and_decode(model, grid, captions, lengths, hard: bool) -> dict:
    """STEPS optimizer steps on one batch (losses and every gradient kept), then beam and greedy decoding.

    Plain SGD: Adam divides by each gradient's running scale, so where a gradient is rounding noise (a key
    projection's bias, which the softmax cancels) its steps are noise of the size of lr, and the two runs'
    weights would part for no fault of either. The optimizer's own switch is test_adam_under_the_switch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    model.train()
    for _ in range(STEPS):
        if hard:  # argmax: the cells read are deterministic, so both paths read the same ones
            out = model(grid, captions, lengths, attention_mode="argmax")
            loss = hard_attention_loss(out, captions[:, 1:], baseline=-3.0, alpha_c=0.1, reinforce_weight=0.5,
                                       entropy_weight=0.01).loss
        else:
            loss = soft_attention_loss(model(grid, captions, lengths), captions[:, 1:], alpha_c=0.1,
                                       alpha_entropy=0.1).loss
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
    model.eval()
    mode = "argmax" if hard else None
    beams = model.generate(grid, model.decode_options.replace_given(beam=3, n_best=2, attention_mode=mode))
    greedy = model.generate(grid, model.decode_options.replace_given(beam=1, attention_mode=mode))
    return {"losses": torch.stack(losses), "grads": grads, "weights": dict(model.named_parameters()),
            "captions": [[h.tokens for h in hyps] for hyps in beams + greedy],
            "scores": [h.score for hyps in beams + greedy for h in hyps]}


@pytest.mark.parametrize("kind,attention", [("lstm", "soft"), ("lstm", "hard"), ("transformer", "soft")])
def test_training_and_decoding_agree_with_every_fast_path_off(kind, attention, monkeypatch):
    sizes = ["model.decoder.hidden_dim=48", "model.decoder.dropout=0.0"]
    if kind == "lstm":
        cfg = load_config(SMOKE, [*sizes, "model.attention.attention_dim=24", f"model.attention.attention={attention}",
                                  *(["train.objective.kind=reinforce"] if attention == "hard" else [])])
    else:
        cfg = load_config(SMOKE_TRANSFORMER, sizes)
    vocab = Vocab.build(SENTENCES)
    fused_losses, fast_steps = [], []  # the fused output layer + loss, and the LSTM's fast step, when they run
    real_loss = token_nll_mod._LinearTokenNLL.apply
    monkeypatch.setattr(token_nll_mod._LinearTokenNLL, "apply", lambda *a: fused_losses.append(1) or real_loss(*a))
    real_step = FastShowAttendTellDecoder._recur_fast
    monkeypatch.setattr(FastShowAttendTellDecoder, "_recur_fast", lambda *a, **k: fast_steps.append(1) or
                        real_step(*a, **k))
    runs = {}
    for reference in (False, True):
        fused_losses.clear(), fast_steps.clear()
        torch.manual_seed(0)
        model = build_model(cfg, vocab)  # the same initial weights both times
        grid, captions, lengths = _batch(vocab, model.encoder.out_dim, 16)
        with fast_paths.reference(reference):
            assert fast_paths.enabled() is not reference
            runs[reference] = _train_and_decode(model, grid, captions, lengths, attention == "hard")
        assert bool(fused_losses) is not reference
        assert bool(fast_steps) is (kind == "lstm" and not reference)
    fast, ref = runs[False], runs[True]
    torch.testing.assert_close(fast["losses"], ref["losses"], atol=1e-5, rtol=1e-5)
    for step, (a, b) in enumerate(zip(fast["grads"], ref["grads"])):
        assert a.keys() == b.keys()
        for name in a:
            scale = max(float(b[name].abs().max()), 1e-3)
            assert float((a[name] - b[name]).abs().max()) <= 1e-4 * scale, f"step {step}: gradient of {name}"
    for name, weight in fast["weights"].items():
        torch.testing.assert_close(weight, ref["weights"][name], atol=1e-5, rtol=1e-4, msg=name)
    assert fast["captions"] == ref["captions"]
    assert fast["scores"] == pytest.approx(ref["scores"], abs=1e-4)


def test_adam_under_the_switch():
    """build_optimizer's Adam: fused where PyTorch has it, the single-tensor loop under the reference switch."""
    params = [torch.zeros(3, requires_grad=True)]
    with fast_paths.reference():
        plain = build_optimizer("adam", params, lr=1e-2)
    assert not plain.defaults["fused"] and plain.defaults["foreach"] is False
    fast = build_optimizer("adam", params, lr=1e-2)
    assert fast.defaults["fused"] or fast.defaults["foreach"] is not False  # fused, or PyTorch's default


def test_the_environment_and_nesting_turn_the_switch():
    assert fast_paths.enabled()
    with fast_paths.reference():
        with fast_paths.reference(False):  # changes nothing: still inside the outer block
            assert not fast_paths.enabled()
        assert not fast_paths.enabled()
    assert fast_paths.enabled()


def test_the_environment_turns_the_switch(monkeypatch):
    monkeypatch.setenv(fast_paths.ENV, "1")
    assert not fast_paths.enabled()
    monkeypatch.setenv(fast_paths.ENV, "0")
    assert fast_paths.enabled()


def test_train_fast_paths_false_trains_on_the_reference_code(tmp_path, monkeypatch, wrap_objective_loss):
    import captioner.training.loop as train_mod
    import captioner.training.validation as validation_mod

    seen = []
    wrap_objective_loss(lambda loss, forward, batch: seen.append(fast_paths.enabled()) or loss(forward, batch))
    monkeypatch.setattr(validation_mod, "caption_scores",
                        lambda predictions, references, meteor=False: {"CIDEr-D": 1.0})
    cfg = load_config(SMOKE, [f"data.root={tmp_path / 'data'}", f"train.run_dir={tmp_path / 'run'}",
                              "train.epochs=1", "train.num_threads=1", "train.fast_paths=false",
                              "train.tensorboard=off", "model.decoder.embed_dim=32", "model.decoder.hidden_dim=32",
                              "model.attention.attention_dim=32"])
    train_mod.train(cfg)
    assert seen and not any(seen)
    assert fast_paths.enabled()  # the switch is off again after the run
