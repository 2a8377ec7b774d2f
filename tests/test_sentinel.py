"""The visual sentinel (model.decoder.sentinel, show_attend_tell.py; Lu et al. 2017): the cells' map and the
sentinel's share sum to one, the context by hand, the fast path equals the reference, a model without it
starts one close to itself, the overlay says how much a word looked, and the settings refused. The fast path
reads it as the reference does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from captioner.config import ConfigError, config_to_dict, load_config
from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder

ARGS = dict(vocab_size=17, feature_dim=6, embed_dim=5, hidden_dim=7, attention_dim=4, dropout=0.0)


def test_the_read_by_hand_and_the_maps_share_of_the_photo():
    torch.manual_seed(0)
    dec = ShowAttendTellDecoder(**ARGS, sentinel=True).eval()
    grid = torch.randn(2, 5, 6)
    h, c, *memory = dec.init_state(grid)
    emb = dec.embedding(torch.tensor([1, 1]))
    read = dec.sentinel.read(dec.attention.scorer, emb, h, c, memory)
    s = torch.sigmoid(dec.sentinel.gate(torch.cat([emb, h], 1))) * torch.tanh(c)
    cells = dec.attention.scorer(h, memory[1])
    own = dec.attention.scorer(h, dec.attention.scorer.prepare(dec.sentinel.key(s)[:, None])) + dec.sentinel.offset
    both = torch.softmax(torch.cat([cells, own], 1), 1)
    torch.testing.assert_close(read.alpha, both[:, :5])
    beta = 1 - read.alpha.sum(1)
    assert (beta > 0).all() and (beta < 1).all()
    expected = (both[:, :5, None] * grid).sum(1) + both[:, 5:] * dec.sentinel.value(s)
    torch.testing.assert_close(read.context, expected)


def test_the_fast_path_equals_the_reference_with_the_sentinel_and_refuses_one_cell_reads():
    """Teacher forcing (sorted, shrinking batch, deferred weight gradients): the loss and every gradient; decoding:
    beam search over the fast path's grouped memory (one row per image) against the reference's repeated one."""
    from captioner.decoding.options import DecodeOptions
    from captioner.decoding.search import beam_search

    torch.manual_seed(1)
    fast = FastShowAttendTellDecoder(**ARGS, sentinel=True).double().eval()
    ref = ShowAttendTellDecoder(**ARGS, sentinel=True).double().eval()
    ref.load_state_dict(fast.state_dict())
    grid = torch.randn(3, 5, 6, dtype=torch.float64)
    captions = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 2, 0, 0], [1, 8, 9, 2, 0]])
    lengths = torch.tensor([5, 3, 4])
    a, b = fast(grid, captions, lengths), ref(grid, captions, lengths)
    torch.testing.assert_close(a.logits[a.mask], b.logits[b.mask])
    torch.testing.assert_close(a.alphas[a.mask], b.alphas[b.mask])
    loss_a, loss_b = a.logits[a.mask].logsumexp(-1).sum(), b.logits[b.mask].logsumexp(-1).sum()
    names = [n for n, _ in fast.named_parameters()]
    for name, ga, gb in zip(names, torch.autograd.grad(loss_a, list(fast.parameters())),
                            torch.autograd.grad(loss_b, list(ref.parameters()))):
        torch.testing.assert_close(ga, gb, msg=f"gradient of {name}")
    results = []
    with torch.no_grad():
        for dec in (fast, ref):
            def step(t, s, dec=dec):
                log_probs, alpha, _, state = dec.step_with_location(t, s, "expectation")
                return log_probs, alpha, state

            results.append(beam_search(step, dec.init_state(grid), DecodeOptions(beam=3, n_best=2, max_length=6),
                                       batch_size=3, start_id=1, end_id=2, expand=dec.expand_state))
    for hyps_a, hyps_b in zip(*results):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        assert [h.score for h in hyps_a] == pytest.approx([h.score for h in hyps_b], abs=1e-9)
    assert not fast.one_cell
    with pytest.raises(ValueError, match="argmax"):
        fast._mode("argmax")
    with pytest.raises(ValueError, match="sentinel"):
        fast.compile_steps("inductor")


def test_train_init_adds_the_sentinel_to_a_model_without_it_close_to_what_it_computed():
    from captioner.api import build_model
    from captioner.data.vocab import Vocab
    from captioner.training.resume import init_weights

    vocab = Vocab.build([["a", "red", "circle"]])
    narrow_cfg = load_config("smoke")
    wide_cfg = load_config("smoke", ["model.decoder.sentinel=true", "train.init=runs/x"])
    torch.manual_seed(2)
    narrow = build_model(narrow_cfg, vocab, pretrained=False).eval()
    wide = build_model(wide_cfg, vocab, pretrained=False).eval()
    init_weights(wide_cfg, wide, {"config": config_to_dict(narrow_cfg), "model": narrow.state_dict(), "epoch": 1})
    state = wide.state_dict()
    assert not state["decoder.sentinel.value.weight"].any() and float(state["decoder.sentinel.offset"]) == -2.0
    grid = torch.randn(2, 5, narrow.decoder.init_h[0].in_features)
    captions = torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0]])
    lengths = torch.tensor([4, 3])
    a = narrow.decoder(grid, captions, lengths)
    b = wide.decoder(grid, captions, lengths)
    share = b.alphas.sum(-1)[b.mask]  # each word's weight on the cells: most of it
    assert (share > 0.5).all() and (share < 1).all()
    assert float((a.logits - b.logits)[a.mask].abs().max()) < 5.0  # the same model, its context scaled by the share
    with pytest.raises(ConfigError, match="sentinel"):
        init_weights(load_config("smoke", ["train.init=runs/y"]), narrow,
                     {"config": config_to_dict(wide_cfg), "model": wide.state_dict(), "epoch": 1})


def test_the_overlay_says_how_much_a_word_looked_at_the_photo():
    from PIL import Image

    from captioner.visualize import overlay_attention

    alphas = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.1, 0.1, 0.1]])  # the second looked 40 % at the photo
    fig = overlay_attention(Image.new("RGB", (32, 32)), ["dog", "the"], alphas, (2, 2))
    titles = [ax.get_title() for ax in fig.axes]
    assert "dog" in titles and "the\n0.40 on the photo" in titles


def test_the_sentinel_is_refused_beside_a_read_it_is_not_a_slot_of():
    with pytest.raises(ConfigError, match="model.decoder.sentinel"):
        load_config("smoke", ["model.decoder.sentinel=true", "model.attention.attention=hard"])
    with pytest.raises(ConfigError, match="model.decoder.sentinel"):
        load_config("smoke", ["model.decoder.sentinel=true", "model.decoder.scene=mean"])
    with pytest.raises(ConfigError, match="sentinel"):
        load_config("smoke", ["model.decoder.sentinel=true", "train.compile=inductor"])
