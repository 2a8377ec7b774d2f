"""Every registered decoder (models/decoders' DECODERS) through the contract that search, SCST, the losses and the
overlays use, on a tiny model: teacher forcing and its packed rows, step() == teacher forcing, the loss falls,
greedy == beam 1, per-image state == copied state in beam search, sampling and SCST's loss, per-word overlays.
The Transformer's own parts (causal mask, KV cache, overlay layer) are checked at the end."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from captioner.api import build_model
from captioner.config import AttentionConfig, load_config
from captioner.data.vocab import Vocab
from captioner.decoding.options import DecodeOptions
from captioner.decoding.search import beam_search, greedy_search
from captioner.models.attention import AttentionOutput
from captioner.models.decoders import DECODERS, ShowAttendTellConfig
from captioner.models.decoders.contract import CaptionDecoder, DecoderOutput, SampleDraws
from captioner.models.decoders.registry import build_decoder
from captioner.names import ATTENTIONS
from captioner.training.losses import scst_baseline, scst_loss, soft_attention_loss
from captioner.visualize import overlay_attention

KINDS = sorted(DECODERS)
V, D, GRID_HW = 19, 12, (2, 3)
L = GRID_HW[0] * GRID_HW[1]
START, END, PAD = 1, 2, 0


def tiny(kind: str, dropout: float = 0.0, **overrides) -> CaptionDecoder:
    torch.manual_seed(0)
    sizes = dict(embed_dim=16, hidden_dim=24, layers=2, dropout=dropout, **overrides)
    family = DECODERS.section(kind)  # built as api.build_model builds it: the family's section and model.attention
    section = family(**{f: v for f, v in sizes.items() if f in family.__dataclass_fields__})
    return build_decoder(section, AttentionConfig(attention_dim=16, heads=2), vocab_size=V, feature_dim=D,
                         pad_id=PAD)


def batch(b: int = 4, t: int = 8, seed: int = 0):
    """Random grids and captions <start> w.. <end> <pad>.. of varied lengths (longest = t)."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.randn(b, L, D, generator=g)
    lengths = torch.randint(3, t + 1, (b,), generator=g)
    lengths[0] = t
    captions = torch.randint(4, V, (b, t), generator=g)
    captions[:, 0] = START
    for i, n in enumerate(lengths.tolist()):
        captions[i, n - 1] = END
        captions[i, n:] = PAD
    return grid, captions, lengths


def _step_fn(dec: CaptionDecoder):
    def step(tokens, state):
        log_probs, alpha, location, state = dec.step_with_location(tokens, state, "expectation", dense=False)
        return log_probs, (alpha, location), state
    return step


@pytest.mark.parametrize("kind", KINDS)
def test_teacher_forcing_packs_the_real_steps_and_step_reproduces_it(kind):
    dec = tiny(kind, dropout=0.3).eval()
    assert isinstance(dec, CaptionDecoder) and dec.attention_kind in ATTENTIONS and not dec.stochastic
    grid, captions, lengths = batch()
    with torch.no_grad():
        out = dec(grid, captions, lengths)
        assert isinstance(out, DecoderOutput)
        assert out.logits.shape == (4, 7, V) and out.alphas.shape == (4, 7, L)
        assert torch.equal(out.mask, torch.arange(7)[None] < (lengths - 1)[:, None])
        assert sorted(out.rows.tolist()) == out.mask.reshape(-1).nonzero().squeeze(1).tolist()
        torch.testing.assert_close(out.alphas.sum(-1), out.mask.float())  # 1 at real steps, 0 at padding
        state = dec.init_state(grid)
        for t in range(captions.shape[1] - 1):
            log_probs, alpha, _, state = dec.step_with_location(captions[:, t], state)
            real = out.mask[:, t]
            torch.testing.assert_close(log_probs[real], F.log_softmax(out.logits[real, t], -1), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(alpha[real], out.alphas[real, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_cross_entropy_loss_falls(kind):
    torch.manual_seed(0)
    dec = tiny(kind)
    grid = torch.randn(32, L, D)
    top = grid[:, :, 0].topk(2, dim=1).indices + 4  # caption = the two cells with the largest first feature
    captions = torch.cat([torch.full((32, 1), START), top, torch.full((32, 1), END)], dim=1)
    lengths = torch.full((32,), 4)
    opt = torch.optim.Adam(dec.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = soft_attention_loss(dec(grid, captions, lengths), captions[:, 1:], alpha_c=0.0).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses[::10]


@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_greedy_and_per_word_overlays(kind):
    dec = tiny(kind).eval()
    with torch.no_grad():
        dec.out.bias[END] -= 3.0  # captions of a few words
    grid = torch.randn(3, L, D)
    common = dict(batch_size=3, start_id=START, end_id=END, forbid_ids=(PAD, START))
    one, three = DecodeOptions(beam=1, max_length=6), DecodeOptions(beam=3, n_best=2, max_length=6)
    with torch.no_grad():
        greedy = greedy_search(_step_fn(dec), dec.init_state(grid), one, **common)
        beam1 = beam_search(_step_fn(dec), dec.init_state(grid), one, expand=dec.expand_state, **common)
        shared = beam_search(_step_fn(dec), dec.init_state(grid), three, expand=dec.expand_state, **common)
        copied = beam_search(_step_fn(dec), dec.init_state(grid), three, **common)
    assert [h[0].tokens for h in greedy] == [h[0].tokens for h in beam1]
    for a, b in zip(shared, copied):  # per-image memory (expand_state) against every tensor copied per beam
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert all(abs(x.score - y.score) < 1e-5 for x, y in zip(a, b))
    for hyps in shared:
        best = hyps[0]
        assert best.tokens and best.alphas.shape == (len(best.tokens), L)
        torch.testing.assert_close(best.alphas.sum(1), torch.ones(len(best.tokens)))
        words = [f"w{i}" for i in best.tokens]
        figure = overlay_attention(torch.zeros(8, 12, 3, dtype=torch.uint8).numpy(), words, best.alphas, GRID_HW)
        assert len(figure.axes) == len(words) + 1  # the image, then one panel per word


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_and_the_scst_loss_train_every_part(kind):
    dec = tiny(kind, dropout=0.1).train()
    grid = torch.randn(2, L, D)
    k = 3
    # SCST samples the words of a soft model and reads softly (SelfCritical.sample_mode)
    sample = dec.sample(grid, k, START, END, max_length=5, forbid_ids=(3,), attention_mode="expectation")
    N = 2 * k
    assert sample.tokens.shape == sample.word_log_probs.shape and sample.tokens.shape[0] == N
    assert sample.alphas.shape == (*sample.tokens.shape, L)
    assert not torch.isin(sample.tokens, torch.tensor([3, START])).any()
    after_end = torch.arange(sample.tokens.shape[1])[None] >= sample.lengths[:, None]
    assert (sample.word_log_probs[after_end] == 0).all() and (sample.word_log_probs[~after_end] < 0).all()
    rewards = torch.rand(N, generator=torch.Generator().manual_seed(0))
    baselines = scst_baseline(rewards.view(-1, k), "mean").reshape(-1)
    scst_loss(sample, rewards, baselines).loss.backward()
    for name in ("embedding.weight", "out.weight"):
        assert dec.get_parameter(name).grad.abs().sum() > 0, name
    reached = [n for n, p in dec.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert any("attention" in n for n in reached), reached  # the policy gradient reaches the attention
    # greedy sampling (SCST's greedy baseline) decodes what greedy search decodes
    dec.eval()
    with torch.no_grad():
        drawn = dec.sample(grid, 1, START, END, max_length=5, greedy=True, attention_mode="expectation")
        greedy = greedy_search(_step_fn(dec), dec.init_state(grid), DecodeOptions(beam=1, max_length=5), batch_size=2,
                               start_id=START, end_id=END, forbid_ids=(PAD, START))
    for row, hyp in zip(drawn.tokens.tolist(), greedy):
        assert row[:len(hyp[0].tokens)] == hyp[0].tokens


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_at_a_temperature_draws_from_and_scores_the_tempered_policy(kind):
    """SCST's sample_temperature T: each sampled word's log-probability is log softmax(logits / T) (forbidden
    words masked) at the teacher-forced logits of the drawn caption, with autograd on as in training."""
    dec = tiny(kind).eval()
    grid = torch.randn(3, L, D, generator=torch.Generator().manual_seed(1))
    k, T = 4, 0.5
    sample = dec.sample(grid, k, START, END, max_length=6, forbid_ids=(3,), attention_mode="expectation",
                        generator=torch.Generator().manual_seed(2), temperature=T)
    n = sample.tokens.shape[0]
    captions = torch.cat([torch.full((n, 1), START), sample.tokens], dim=1)
    with torch.no_grad():
        logits = dec(grid.repeat_interleave(k, 0), captions, sample.lengths + 1).logits  # (n, t, V)
    logits[..., [3, PAD, START]] = -float("inf")
    expected = F.log_softmax(logits / T, -1).gather(2, sample.tokens.unsqueeze(2)).squeeze(2)
    live = torch.arange(sample.tokens.shape[1])[None] < sample.lengths[:, None]
    torch.testing.assert_close(sample.word_log_probs.detach()[live], expected[live], atol=1e-5, rtol=1e-5)
    untempered = F.log_softmax(logits, -1).gather(2, sample.tokens.unsqueeze(2)).squeeze(2)
    assert not torch.allclose(expected[live], untempered[live], atol=1e-3)  # T changed the policy
    with pytest.raises(ValueError, match="temperature must be > 0"):
        dec.sample(grid, k, START, END, max_length=6, temperature=0.0)


def test_tempered_draws_follow_softmax_of_logits_over_t():
    """SampleDraws at T = 0.5 on fixed logits: the share of each word among 40,000 draws is softmax(logits / T)
    (to 0.01), and the forbidden word is never drawn."""
    logits = torch.tensor([[0.0, 1.0, 0.5, 2.0, -1.0]]).repeat(40000, 1)
    draws = SampleDraws(40000, START, END, PAD, (3,), False, torch.Generator().manual_seed(0), torch.device("cpu"),
                        temperature=0.5)
    draws.draw(logits, AttentionOutput(context=torch.zeros(40000, 1), alpha=torch.ones(40000, 1), log_prob=None,
                                       entropy=None, index=None))
    masked = logits[0].clone()
    masked[[3, PAD, START]] = -float("inf")
    want = torch.softmax(masked / 0.5, -1)
    share = torch.bincount(draws.tokens, minlength=5).float() / 40000
    torch.testing.assert_close(share, want, atol=0.01, rtol=0)
    torch.testing.assert_close(draws.word_lp[0], torch.log(want)[draws.tokens])


# --------------------------------------------------------------------------- the Transformer's own parts


def test_transformer_words_see_only_earlier_words():
    dec = tiny("transformer").eval()
    grid, captions, lengths = batch()
    changed = captions.clone()
    changed[:, 4] = (captions[:, 4] + 1) % (V - 4) + 4  # a later word differs
    with torch.no_grad():
        a, b = dec(grid, captions, lengths).logits, dec(grid, changed, torch.full_like(lengths, 8)).logits
    torch.testing.assert_close(a[:, :4], b[:, :4])  # steps 0..3 read words 0..3 only
    assert not torch.allclose(a[0, 4], b[0, 4])


def test_transformer_overlay_layer_and_cache():
    grid, captions, lengths = batch()
    first, last = tiny("transformer", overlay_layer=0).eval(), tiny("transformer").eval()
    last.load_state_dict(first.state_dict())  # one set of weights, two layers shown
    with torch.no_grad():
        out_first, out_last = first(grid, captions, lengths), last(grid, captions, lengths)
        torch.testing.assert_close(out_first.packed_logits, out_last.packed_logits)
        assert not torch.allclose(out_first.alphas, out_last.alphas)
        grid_memory, words = first.init_state(grid)
        for t in range(3):
            _, _, _, (grid_memory_t, words) = first.step_with_location(captions[:, t], (grid_memory, words))
            assert grid_memory_t is grid_memory  # the grid's keys and values: once per image
            assert all(v.shape[2] == t + 1 for v, _ in words)  # one cached position per word
    with pytest.raises(ValueError, match=r"overlay_layer: 2 is not a layer of model.decoder.layers \(2\)"):
        tiny("transformer", overlay_layer=2)


def test_a_section_of_another_family_is_refused():
    section = DECODERS.section("lstm")(embed_dim=16, hidden_dim=24)
    section.kind = "transformer"
    with pytest.raises(ValueError, match="the section is a ShowAttendTellConfig, not the TransformerConfig registered"):
        build_decoder(section, AttentionConfig(heads=2), vocab_size=V, feature_dim=D)


@dataclasses.dataclass
class ProbeConfig(ShowAttendTellConfig):
    """A new family's section (a probe: the plain LSTM decoder under a new kind, in a module written below)."""

    kind: str = "probe"
    IMPLEMENTATION = "probe_decoder:ProbeDecoder"


PROBE_MODULE = '''
from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder


class ProbeDecoder(ShowAttendTellDecoder):
    """A new decoder family's class."""
'''


def test_a_family_registered_with_one_line_passes_the_contract(tmp_path, monkeypatch):
    """Its config module (ProbeConfig above), its class's module and one line in DECODERS: the config reads the
    new kind, api.build_model builds it, and the contract's tests hold for it with no other edit."""
    (tmp_path / "probe_decoder.py").write_text(PROBE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(DECODERS.sections, "probe", ProbeConfig)  # the one line
    cfg = load_config(None, ["model.decoder.kind=probe", "model.decoder.embed_dim=16", "model.decoder.hidden_dim=24",
                             "model.encoder.pretrained=false"])
    assert isinstance(cfg.model.decoder, ProbeConfig)
    assert type(build_model(cfg, Vocab.build([["a", "b"]], min_count=1)).decoder).__name__ == "ProbeDecoder"
    for test in (test_teacher_forcing_packs_the_real_steps_and_step_reproduces_it, test_cross_entropy_loss_falls,
                 test_beam_search_greedy_and_per_word_overlays, test_sampling_and_the_scst_loss_train_every_part):
        test("probe")
