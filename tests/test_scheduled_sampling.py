"""Scheduled sampling (train.objective.scheduled_sampling_*, Bengio et al. 2015): ruotianluo's schedule, the
decoder feeding back its own samples (exactly: a decoder whose output is one word for sure reads that word), the
fast decoder's fallback, the objective's epochs, and the settings refused."""

from __future__ import annotations

import pytest
import torch

from captioner.config import AttentionConfig, ConfigError, load_config
from captioner.models.decoders import DECODERS
from captioner.models.decoders.registry import build_decoder
from captioner.objective_sections import CrossEntropyConfig
from tests.test_objective_contract import SMOKE, _built, _cfg

V, D, L = 11, 8, 6


def test_the_schedule_is_ruotianluos():
    s = CrossEntropyConfig(scheduled_sampling_start=2, scheduled_sampling_increase_every=3,
                           scheduled_sampling_increase_prob=0.1, scheduled_sampling_max_prob=0.25)
    assert [s.sample_prob(e) for e in range(12)] == pytest.approx(
        [0, 0, 0, 0, 0, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.25])
    assert CrossEntropyConfig().sample_prob(50) == 0.0  # off by default


def _decoder(fast: bool):
    torch.manual_seed(0)
    section = DECODERS.section("lstm")(embed_dim=16, hidden_dim=24, dropout=0.0)
    decoder = build_decoder(section, AttentionConfig(attention_dim=16), vocab_size=V, feature_dim=D)
    if not fast:
        decoder.__class__ = decoder.__class__.__mro__[1]  # the plain ShowAttendTellDecoder, same weights
    return decoder.eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    grid = torch.randn(3, L, D, generator=g)
    captions = torch.randint(3, V, (3, 7), generator=g)
    captions[:, 0] = 1
    return grid, captions, torch.tensor([7, 6, 7])


@pytest.mark.parametrize("fast", [True, False])
def test_every_input_after_the_first_is_the_models_own_word_at_p_1(fast):
    decoder = _decoder(fast)
    with torch.no_grad():
        decoder.out.bias.fill_(-1e4)
        decoder.out.bias[5] = 1e4  # the model says word 5, surely
    grid, captions, lengths = _batch()
    with torch.no_grad():
        own = decoder(grid, captions, lengths, sample_prob=1.0)
        fed = captions.clone()
        fed[:, 1:] = 5  # what it would read had the references said 5 after <start>
        expected = decoder(grid, fed, lengths)
        plain = decoder(grid, captions, lengths)
    torch.testing.assert_close(own.alphas, expected.alphas)
    assert not torch.allclose(own.alphas[:, 1:], plain.alphas[:, 1:])
    torch.testing.assert_close(own.alphas[:, 0], plain.alphas[:, 0])  # the first input is always <start>


def test_at_p_0_the_fast_decoder_is_unchanged_and_a_tiny_p_reads_the_references():
    decoder = _decoder(True)
    grid, captions, lengths = _batch()
    with torch.no_grad():
        fast = decoder(grid, captions, lengths)
        tiny = decoder(grid, captions, lengths, sample_prob=1e-12)  # the plain path, drawing but never sampling
    torch.testing.assert_close(fast.alphas, tiny.alphas, atol=1e-5, rtol=1e-5)


def test_the_objective_samples_from_its_schedule_and_trains(tmp_path):
    data_root = tmp_path / "data"
    data_root.mkdir()
    cfg = _cfg(data_root, tmp_path / "run", "xe", "train.objective.scheduled_sampling_start=0",
               "train.objective.scheduled_sampling_increase_every=1",
               "train.objective.scheduled_sampling_increase_prob=0.5",
               "train.objective.scheduled_sampling_max_prob=0.75")
    model, objective, batch = _built(cfg)
    seen = []
    real = model.decoder.forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("sample_prob", 0.0))
        return real(*args, **kwargs)

    model.decoder.forward = spy
    from captioner.training.loop import _TrainForward

    forward = _TrainForward(model, from_images=True)
    for epoch in (0, 1, 3):
        objective.on_epoch(epoch)
        res = objective.loss(forward, batch)
    assert seen == [0.0, 0.5, 0.75] and objective.epoch_figures() == {"ss_prob": 0.75}  # up to max_prob
    res.loss.backward()
    assert model.decoder.embedding.weight.grad.abs().sum() > 0


def test_settings_it_would_ignore_or_cannot_apply_are_refused():
    with pytest.raises(ConfigError, match="scheduled_sampling_increase_prob: set to 0.1, but this run would ignore "
                                          "it \\(scheduled sampling is off"):
        load_config(SMOKE, ["train.objective.scheduled_sampling_increase_prob=0.1"])
    with pytest.raises(ConfigError, match="scheduled_sampling_start: the transformer decoder reads every input word "
                                          "at once"):
        load_config(SMOKE, ["model.decoder={kind: transformer}", "train.objective.scheduled_sampling_start=0"])
    with pytest.raises(ConfigError, match="scheduled_sampling_start: set to 0, but this run would ignore it"):
        load_config(SMOKE, ["model.attention.attention=hard", "train.objective.kind=reinforce",
                            "train.objective.scheduled_sampling_start=0"])
    with pytest.raises(ConfigError, match="scheduled_sampling_start: an epoch"):
        load_config(SMOKE, ["train.objective.scheduled_sampling_start=-2"])
    assert load_config(SMOKE, ["train.objective.scheduled_sampling_start=3"]).train.objective.sample_prob(8) == 0.05
