"""Up-Down's fast path (models/decoders/updown_fast.py) against its reference (updown.py), and the reference
against the paper's form (an LSTM cell on the concatenated input [h2; mean feature; word])."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from captioner import fast as fast_paths
from captioner.models.decoders.updown import UpDownDecoder
from captioner.models.decoders.updown_fast import FastUpDownDecoder
from captioner.training.losses import hard_attention_loss, soft_attention_loss

_ARGS = dict(vocab_size=23, feature_dim=10, embed_dim=8, hidden_dim=9, attention_dim=7, dropout=0.0)


def _batch(dtype=torch.float64):
    g = torch.Generator().manual_seed(2)
    grid = torch.randn(5, 6, _ARGS["feature_dim"], generator=g, dtype=dtype, requires_grad=True)
    lengths = torch.tensor([7, 3, 7, 5, 2])  # unsorted, with ties and a one-word caption
    captions = torch.randint(4, _ARGS["vocab_size"], (5, 7), generator=g)
    captions[:, 0] = 1
    captions[torch.arange(5), lengths - 1] = 2
    captions[torch.arange(7)[None] >= lengths[:, None]] = 0
    return grid, captions, lengths


def _pair(attention: str, dtype=torch.float64, **args):
    torch.manual_seed(0)
    fast = FastUpDownDecoder(**{**_ARGS, **args}, attention=attention).to(dtype).eval()
    ref = UpDownDecoder(**{**_ARGS, **args}, attention=attention).to(dtype).eval()
    ref.load_state_dict(fast.state_dict())  # one set of weights, two implementations
    return fast, ref


def test_the_reference_step_is_an_lstm_cell_on_the_concatenated_input():
    """Eq. (2) as the paper writes it, nn.LSTMCell on [h2; mean_i v_i; W_e y]: the reference keeps the mean
    feature's share of the gates in its state and sums the parts, which is the same function."""
    _, ref = _pair("soft")
    grid, _, _ = _batch()
    state = ref.init_state(grid)
    h2, c2 = torch.randn(5, 9, dtype=grid.dtype), torch.randn(5, 9, dtype=grid.dtype)
    h1, c1 = torch.randn(5, 9, dtype=grid.dtype), torch.randn(5, 9, dtype=grid.dtype)
    emb = ref.embedding(torch.tensor([4, 5, 6, 7, 8]))
    (nh2, nc2, nh1, nc1, *_), read = ref.recur(emb, (h2, c2, h1, c1, *state[4:]), "expectation")
    want_h1, want_c1 = ref.attention_lstm(torch.cat([h2, grid.mean(dim=1), emb], dim=1), (h1, c1))
    torch.testing.assert_close((nh1, nc1), (want_h1, want_c1), atol=1e-12, rtol=1e-12)
    want_h2, want_c2 = ref.language_lstm(torch.cat([read.context, want_h1], dim=1), (h2, c2))
    torch.testing.assert_close((nh2, nc2), (want_h2, want_c2), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("attention,mode", [("soft", "expectation"), ("hard", "argmax")])
def test_the_fast_training_loss_and_every_gradient_equal_the_reference(attention, mode):
    """Sorted, shrinking batch, packed output layer, one matmul per LSTM: the same loss and gradients as the
    reference module over the padded batch (float64), hard attention's REINFORCE terms and expected-context
    rows included."""
    fast, ref = _pair(attention)
    grid, captions, lengths = _batch()
    targets = captions[:, 1:]
    keep = torch.tensor([False, True, False, False, True]) if attention == "hard" else None

    def loss(decoder):
        out = decoder(grid, captions, lengths, attention_mode=mode, expectation_mask=keep)
        if attention == "hard":
            return hard_attention_loss(out, targets, baseline=-4.0, alpha_c=0.3, reinforce_weight=0.5,
                                       entropy_weight=0.1).loss
        return soft_attention_loss(out, targets, alpha_c=0.3, alpha_entropy=0.1).loss

    with fast_paths.reference():
        expected = loss(ref)
    got = loss(fast)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    params = [p for _, p in ref.named_parameters()]
    ref_grads = torch.autograd.grad(expected, params + [grid], allow_unused=True)
    fast_grads = torch.autograd.grad(got, list(fast.parameters()) + [grid], allow_unused=True)
    names = [name for name, _ in fast.named_parameters()] + ["grid"]
    for name, p, a, b in zip(names, params + [grid], fast_grads, ref_grads):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        assert float((a - b).abs().max()) <= 1e-10 * max(float(b.abs().max()), 1e-3), f"gradient of {name} differs"
    assert any(float(g.abs().max()) > 0 for g in fast_grads if g is not None)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_decoding_steps_and_greedy_samples_equal_the_reference(attention):
    """Without autograd the fast step runs its LSTM cells as the fused kernel: each step's log-probabilities and
    map equal the reference's, and so do the greedy captions that SCST's baseline draws."""
    fast, ref = _pair(attention, dtype=torch.float32)
    grid = _batch(torch.float32)[0].detach()
    mode = "argmax" if attention == "hard" else "expectation"
    tokens = torch.tensor([1, 1, 1, 1, 1])
    with torch.no_grad():
        state_f, state_r = fast.init_state(grid), ref.init_state(grid)
        for _ in range(4):
            lp_f, alpha_f, _, state_f = fast.step_with_location(tokens, state_f, mode)
            with fast_paths.reference():
                lp_r, alpha_r, _, state_r = ref.step_with_location(tokens, state_r, mode)
            torch.testing.assert_close((lp_f, alpha_f), (lp_r, alpha_r), atol=1e-5, rtol=1e-5)
            tokens = lp_r.argmax(dim=1)
        greedy_f = fast.sample(grid, 2, 1, 2, 6, attention_mode=mode, greedy=True)
        with fast_paths.reference():
            greedy_r = ref.sample(grid, 2, 1, 2, 6, attention_mode=mode, greedy=True)
    assert torch.equal(greedy_f.tokens, greedy_r.tokens)
    torch.testing.assert_close(greedy_f.word_log_probs, greedy_r.word_log_probs, atol=1e-5, rtol=1e-5)


def test_copies_of_a_caption_share_their_dropout_masks_in_the_packed_forward():
    """dropout_rows: the K copies of one caption (leave-one-out) draw the same masks at every step, on the grid
    and on the language LSTM's output, so their features are equal; other captions' differ."""
    fast, _ = _pair("soft", dtype=torch.float32, dropout=0.5, feature_dropout=0.3)
    fast.train()
    grid, captions, lengths = _batch(torch.float32)
    rows = torch.tensor([0, 0, 1, 1, 2])
    grid = grid.detach()[rows]
    captions = captions[torch.tensor([0, 0, 2, 2, 4])]  # rows 0-1 and 2-3: the same caption twice
    lengths = lengths[torch.tensor([0, 0, 2, 2, 4])]
    torch.manual_seed(3)
    logits = fast(grid, captions, lengths, dropout_rows=rows).logits  # (5, 6, V)
    torch.testing.assert_close(logits[0], logits[1])
    torch.testing.assert_close(logits[2], logits[3])
    assert not torch.allclose(logits[0], logits[2])
    with pytest.raises(AssertionError):  # without dropout_rows every caption draws its own masks
        torch.manual_seed(3)
        free = fast(grid, captions, lengths).logits
        torch.testing.assert_close(free[0], free[1])


def test_the_family_builds_the_fast_decoder_with_the_references_state_dict():
    from captioner.models.decoders import DECODERS
    from captioner.registration import implementation

    cls = implementation(DECODERS.section("updown"))
    assert cls is FastUpDownDecoder and issubclass(cls, UpDownDecoder)
    fast, ref = _pair("soft")
    assert list(fast.state_dict()) == list(ref.state_dict())
    assert not any(isinstance(m, nn.LSTM) for m in fast.modules())  # the cells are nn.LSTMCell's parameters
