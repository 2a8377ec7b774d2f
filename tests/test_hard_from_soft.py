"""Hard attention from soft (issue 35): train.init takes a soft run, a model folder or a shipped model's name for a
hard run (only the attention kind and the dropout rates may differ, and the log says so); the K leave-one-out
copies of a caption share their dropout masks (contract.shared_dropout, in both decoder paths); SCST's own
location-policy settings (train.objective.attention_mode, entropy_weight) and its xe_weight; soft models read one cell
per word when asked for "argmax"/"sample", and multi-head attention refuses to."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import captioner.training.loop as train_mod
import captioner.training.validation as validation_mod
from captioner import fast as fast_paths
from captioner.api import build_model, load_captioner
from captioner.cli import main as cli_main
from captioner.config import ConfigError, check_read_keys, config_from_dict, config_to_dict, load_config
from captioner.data.vocab import Vocab
from captioner.decoding.options import DecodeOptions
from captioner.models.attention import check_read
from captioner.models.decoders.contract import shared_dropout
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.models.decoders.transformer import TransformerDecoder
from captioner.training.loop import train
from captioner.training.objectives.registry import build_objective
from captioner.training.objectives.self_critical import SelfCritical
from captioner.training.resume import INIT_MAY_DIFFER, init_weights, load_init, require_same_sections

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
HARD = "model.attention.attention=hard"
REINFORCE = "train.objective.kind=reinforce"  # what trains a hard model's location policy
SWITCH = "model.attention.attention: 'soft' -> 'hard' (the same weights, read the new way)"
# the words of the smoke_checkpoint fixture (conftest.py)
VOCAB = Vocab.build([["a", "red", "circle"], ["a", "blue", "square", "above"]])


def _changes(payload: dict, cfg) -> list[str]:
    return require_same_sections(payload["config"], cfg, "train.init", "", may_differ=INIT_MAY_DIFFER)


def _assert_same_weights(model: nn.Module, state: dict) -> None:
    mine = model.state_dict()
    assert mine.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(mine[key], value.to(mine[key].dtype)), key


# --------------------------------------------------------------------------- train.init: soft -> hard


def test_a_soft_checkpoint_starts_a_hard_model_with_its_weights(smoke_checkpoint, caplog):
    cfg = load_config(SMOKE, [HARD, REINFORCE, f"train.init={smoke_checkpoint}"])
    payload = load_init(str(smoke_checkpoint))  # a run directory: its best.pt
    model = build_model(cfg, Vocab.from_dict(payload["vocab"]))
    assert model.decoder.stochastic
    with caplog.at_level(logging.INFO, logger="captioner.training.resume"):
        init_weights(cfg, model, payload)
    _assert_same_weights(model, payload["model"])
    assert f"initialised from {smoke_checkpoint} (epoch 1); {SWITCH}" in caplog.text


def test_the_dropout_rates_may_differ_and_are_listed(smoke_checkpoint):
    payload = load_init(str(smoke_checkpoint))
    assert _changes(payload, load_config(SMOKE)) == []
    cfg = load_config(SMOKE, [HARD, REINFORCE, "model.decoder.dropout=0.3", "model.decoder.feature_dropout=0.2"])
    assert _changes(payload, cfg) == ["model.attention.attention: 'soft' -> 'hard'",
                                      "model.decoder.dropout: 0.1 -> 0.3", "model.decoder.feature_dropout: 0.0 -> 0.2"]


@pytest.mark.parametrize("override,section", [
    ("model.decoder.embed_dim=48", "model"),
    ("model.encoder.position_embedding=true", "model"),
    ("model.attention.scorer=dot", "model"),
    ("data.shapes.n_train=30", "data"),
])
def test_any_other_difference_is_still_refused(smoke_checkpoint, override, section):
    cfg = load_config(SMOKE, [HARD, REINFORCE, override, f"train.init={smoke_checkpoint}"])
    with pytest.raises(ConfigError, match=f"train.init=.*the config's '{section}' section differs from the "
                                          f"checkpoint's.*only data.entities, model.attention.attention"):
        init_weights(cfg, None, load_init(str(smoke_checkpoint)))  # refused before a weight is read


def test_a_model_folder_starts_a_hard_model(smoke_checkpoint, tmp_path, caplog):
    folder = tmp_path / "soft-folder"
    assert cli_main(["export", "--checkpoint", str(smoke_checkpoint), "--format", "hub", str(folder)]) == 0
    cfg = load_config(SMOKE, [HARD, REINFORCE, f"train.init={folder}"])
    payload = load_init(str(folder))
    model = build_model(cfg, Vocab.from_dict(payload["vocab"]))
    with caplog.at_level(logging.INFO, logger="captioner.training.resume"):
        init_weights(cfg, model, payload)
    _assert_same_weights(model, load_captioner(folder).state_dict())  # the float16 weights captioning reads
    assert f"initialised from {folder} (epoch None); {SWITCH}" in caplog.text


def test_the_shipped_soft_model_starts_the_hard_from_soft_config():
    cfg = load_config("flickr8k_hard_from_soft")
    assert cfg.train.init == "flickr8k_soft"
    assert _changes(load_init(cfg.train.init), cfg) == ["model.attention.attention: 'soft' -> 'hard'",
                                                         "model.decoder.feature_dropout: 0.5 -> 0.3"]


def test_the_shipped_soft_model_starts_the_pointing_finetune_config():
    """The boxes' folder is read by the grounding term only: a model trained without boxes may start one with."""
    cfg = load_config("flickr8k_soft_pointing_finetune")
    assert cfg.train.init == "flickr8k_soft" and cfg.data.entities
    assert _changes(load_init(cfg.train.init), cfg) == ["data.entities: '' -> 'data/flickr8k/flickr30k_entities'"]


@pytest.fixture
def fake_scores(monkeypatch):
    monkeypatch.setattr(validation_mod, "caption_scores", lambda predictions, references, meteor=False:
                        {"BLEU-4": 1.0, "CIDEr-D": 1.0})


def test_a_hard_loo_run_trains_from_a_soft_run(tmp_path, fake_scores, caplog):
    def cfg(run: str, *overrides: str):
        return load_config(SMOKE, [f"data.root={tmp_path / 'data'}", f"train.run_dir={tmp_path / run}",
                                   "train.num_threads=1", "train.tensorboard_images=0", "train.epochs=1", *overrides])

    soft = train(cfg("soft"))
    with caplog.at_level(logging.INFO, logger="captioner.training.resume"):
        hard = train(cfg("hard", HARD, "train.objective.kind=loo", "train.objective.samples=2", f"train.init={soft}"))
    assert SWITCH in caplog.text
    assert (hard / "best.pt").is_file()


# --------------------------------------------------------------------------- shared dropout


def test_shared_dropout_without_rows_is_the_plain_layer():
    layer, x = nn.Dropout(0.5).train(), torch.randn(6, 40)
    torch.manual_seed(0)
    shared = shared_dropout(layer, x, None)
    torch.manual_seed(0)
    assert torch.equal(shared, layer(x))  # the same RNG stream as before
    assert torch.equal(shared_dropout(layer.eval(), x, torch.zeros(6, dtype=torch.long)), x)


def test_rows_of_one_value_share_one_mask():
    out = shared_dropout(nn.Dropout(0.5).train(), torch.ones(5, 64), torch.tensor([3, 0, 3, 0, 1]))
    assert torch.equal(out[0], out[2]) and torch.equal(out[1], out[3])
    assert not torch.equal(out[0], out[1]) and not torch.equal(out[0], out[4])
    assert set(out.unique().tolist()) <= {0.0, 2.0}  # kept values scaled by 1 / (1 - p), as nn.Dropout does


def _copies(attention: str, mode: str, rows: torch.Tensor | None) -> torch.Tensor:
    """Teacher-forced logits of one caption over one grid, len(rows) times, in training mode (dropout on)."""
    torch.manual_seed(0)
    dec = FastShowAttendTellDecoder(19, 12, embed_dim=16, hidden_dim=20, attention_dim=16, attention=attention,
                                    dropout=0.5, feature_dropout=0.5).train()
    n = 6
    grid = torch.randn(1, 6, 12).expand(n, -1, -1)
    captions = torch.tensor([[1, 5, 6, 7, 8, 2]]).expand(n, -1)
    return dec(grid, captions, torch.full((n,), 6), attention_mode=mode, dropout_rows=rows).logits


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=0.0, atol=1e-6)


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("attention,mode", [("soft", "expectation"), ("hard", "argmax")])
def test_copies_of_a_caption_share_their_dropout_masks(reference, attention, mode):
    with fast_paths.reference(reference):
        shared = _copies(attention, mode, torch.tensor([0, 0, 0, 1, 1, 1]))
        plain = _copies(attention, mode, None)
    assert _same(shared[0], shared[1]) and _same(shared[0], shared[2]) and _same(shared[3], shared[5])
    assert not _same(shared[0], shared[3])  # another caption: other masks
    assert not _same(plain[0], plain[1])  # without dropout_rows every row draws its own


def test_the_train_forward_passes_the_copy_rows_as_dropout_rows():
    model = build_model(load_config(SMOKE, [HARD, REINFORCE, "model.decoder.dropout=0.5"]), VOCAB).train()
    forward = train_mod._TrainForward(model, from_images=False)
    grids = torch.randn(2, model.grid_hw[0] * model.grid_hw[1], model.encoder.backbone_dim)
    rows = torch.tensor([0, 0, 1, 1])  # two copies of each of two captions, as the loo estimator makes them
    captions = torch.tensor([[1, 4, 5, 6, 2]]).expand(4, -1)
    logits = forward(grids, captions, torch.full((4,), 5), attention_mode="argmax", rows=rows).logits
    assert _same(logits[0], logits[1]) and _same(logits[2], logits[3])


def test_the_transformer_decoder_refuses_dropout_rows():
    dec = TransformerDecoder(vocab_size=19, feature_dim=12, embed_dim=16, hidden_dim=24, heads=2)
    with pytest.raises(ValueError, match="dropout_rows"):
        dec(torch.randn(2, 6, 12), torch.tensor([[1, 5, 2], [1, 6, 2]]), torch.tensor([3, 3]),
            dropout_rows=torch.tensor([0, 0]))


# --------------------------------------------------------------------------- SCST's explicit settings

SCST = "train.objective.kind=scst"
HARD_SCST = [HARD, SCST]


@pytest.mark.parametrize("overrides,message", [
    (HARD_SCST, "train.objective.entropy_weight: hard-attention SCST samples its cells and needs the location "
                "policy's entropy bonus set explicitly .*or train.objective.attention_mode: argmax"),
    ([*HARD_SCST, "train.objective.entropy_weight=-0.5"], "train.objective.entropy_weight: must be >= 0, got -0.5"),
    ([*HARD_SCST, "train.objective.attention_mode=argmax", "train.objective.entropy_weight=0.01"],
     "train.objective.entropy_weight: set to 0.01, .*argmax reads are not sampled"),
    ([*HARD_SCST, "train.objective.entropy_weight=0.01", "train.objective.alpha_c=0.05"],
     "unknown config key 'train.objective.alpha_c' .*for kind scst"),
    ([SCST, "train.objective.entropy_weight=0.01"],
     "train.objective.entropy_weight: .*only hard attention has a location policy"),
    ([SCST, "train.objective.attention_mode=argmax"],
     "train.objective.attention_mode: .*only hard attention has a location policy"),
    ([SCST, "train.objective.attention_mode=expectation"], "train.objective.attention_mode: 'expectation' is not "
                                                           "one of sample, argmax"),
    ([SCST, "train.objective.xe_weight=-1"], "train.objective.xe_weight: must be >= 0"),
])
def test_scst_location_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize("overrides", [[*HARD_SCST, "train.objective.entropy_weight=0"],
                                       [*HARD_SCST, "train.objective.attention_mode=argmax"],
                                       [SCST, "train.objective.xe_weight=0.5"]])
def test_scst_location_settings_load(overrides):
    load_config(None, overrides)


def test_a_hard_scst_config_saved_before_the_setting_still_loads_for_decoding():
    saved = config_to_dict(load_config(None, [*HARD_SCST, "train.objective.entropy_weight=0.01"]))
    del saved["train"]["objective"]["entropy_weight"]  # a checkpoint written before the key existed
    cfg = config_from_dict(saved)  # what load_captioner and model folders read
    assert cfg.train.objective.entropy_weight == -1.0
    with pytest.raises(ConfigError, match="train.objective.entropy_weight: hard-attention SCST"):
        check_read_keys(cfg)  # a run on it must still choose


_TRAIN_SET = SimpleNamespace(encoded=[[VOCAB.encode(["a", "red", "circle"]), VOCAB.encode(["a", "circle"])],
                                      [VOCAB.encode(["a", "blue", "square", "above"])]])


def _self_critical(*overrides: str, cfg=None) -> tuple[SelfCritical, nn.Module]:
    cfg = cfg or load_config(SMOKE, [SCST, "train.objective.samples=2", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB).train()
    sc = build_objective(cfg, model, _TRAIN_SET, from_images=False)
    sc.rewards = lambda tokens, lengths, images: torch.rand(tokens.shape[0])  # a nonzero advantage, no CIDEr-D
    return sc, model


def _batch(model: nn.Module) -> SimpleNamespace:
    H, W = model.grid_hw
    return SimpleNamespace(inputs=torch.randn(2, H * W, model.encoder.backbone_dim), indices=torch.tensor([0, 1]))


@pytest.mark.parametrize("overrides,mode,entropy_weight", [
    ([HARD, "train.objective.entropy_weight=0.2"], "sample", 0.2),
    ([HARD, "train.objective.entropy_weight=0"], "sample", 0.0),
    ([HARD, "train.objective.attention_mode=argmax"], "argmax", 0.0),
    ([], "expectation", 0.0),
])
def test_self_critical_reads_its_entropy_weight_from_its_section(overrides, mode, entropy_weight):
    sc, _ = _self_critical(*overrides)
    assert (sc.sample_mode, sc.entropy_weight) == (mode, entropy_weight)


def test_self_critical_refuses_an_unset_entropy_weight_built_without_load_config():
    cfg = config_from_dict({"model": {"attention": {"attention": "hard"}}, "train": {"objective": {"kind": "scst"}}})
    with pytest.raises(ConfigError, match="train.objective.entropy_weight"):
        _self_critical(cfg=cfg)


@pytest.mark.parametrize("mode,attention_learns", [("sample", True), ("argmax", False)])
def test_scst_argmax_mode_has_no_location_terms(mode, attention_learns):
    sc, model = _self_critical(HARD, f"train.objective.attention_mode={mode}",
                               *(["train.objective.entropy_weight=0"] if mode == "sample" else []))
    sc.loss(train_mod._TrainForward(model, from_images=False), _batch(model)).loss.backward()
    attention = [p.grad for name, p in model.decoder.named_parameters() if name.startswith("attention.")]
    assert any(g is not None and g.abs().sum() > 0 for g in attention) == attention_learns
    assert model.decoder.out.weight.grad.abs().sum() > 0  # the words learn either way


def test_xe_weight_adds_a_teacher_forced_cross_entropy():
    sc, model = _self_critical("train.objective.xe_weight=0.5")
    forward, batch = train_mod._TrainForward(model, from_images=False), _batch(model)
    torch.manual_seed(1)
    with_xe = sc.loss(forward, batch)
    sc.section = dataclasses.replace(sc.section, xe_weight=0.0)
    torch.manual_seed(1)
    without = sc.loss(forward, batch)
    assert "xe" not in without.parts and with_xe.parts["xe"] > 0
    assert with_xe.loss.item() == pytest.approx(without.loss.item() + 0.5 * with_xe.parts["xe"].item(), rel=1e-5)


# --------------------------------------------------------------------------- soft models, one cell on request


@pytest.mark.parametrize("mode,stochastic,one_cell,read", [
    ("argmax", False, True, "argmax"), ("sample", False, True, "sample"), ("expectation", False, True, "expectation"),
    ("expectation", False, False, "expectation"), ("argmax", True, False, "argmax"),
    ("expectation", True, True, "expectation"),
])
def test_check_read(mode, stochastic, one_cell, read):
    assert check_read(mode, stochastic, one_cell) == read


@pytest.mark.parametrize("mode", ["argmax", "sample"])
def test_check_read_refuses_one_cell_reads_a_module_cannot_make(mode):
    with pytest.raises(ValueError, match="cannot do"):
        check_read(mode, stochastic=False, one_cell=False)


def test_a_soft_model_asked_for_argmax_reads_one_cell_per_word():
    model = build_model(load_config(SMOKE), VOCAB).eval()
    assert not model.decoder.stochastic and model.decoder.one_cell
    assert model.decode_options.attention_mode == "expectation"
    H, W = model.grid_hw
    grid = model.prepare_grid(torch.randn(1, H * W, model.encoder.backbone_dim))
    with torch.no_grad():
        greedy = model.decode_options.replace_given(beam=1, max_length=6)
        ((one_cell,),) = model.generate(grid, greedy.replace_given(attention_mode="argmax"), min_length=3)
        ((soft,),) = model.generate(grid, greedy.replace_given(attention_mode="expectation"), min_length=3)
    assert one_cell.locations == one_cell.alphas.argmax(1).tolist()  # the cell each word read, reported
    assert soft.locations is None


def test_multi_head_attention_refuses_one_cell_modes():
    model = build_model(load_config(SMOKE, ["model.attention.attention=multi_head", "model.attention.heads=2"]),
                        VOCAB)
    expectation = DecodeOptions(attention_mode="expectation")
    assert model.check_decode_options(expectation) is expectation
    for mode in ("argmax", "sample"):
        with pytest.raises(ValueError, match=f"attention mode '{mode}' reads one grid cell per word"):
            model.check_decode_options(DecodeOptions(attention_mode=mode))
        with pytest.raises(ValueError, match=f"attention mode '{mode}' reads one grid cell per word"):
            # refused before the grid is read
            model.generate(torch.zeros(1, 1, 1), model.decode_options.replace_given(attention_mode=mode))


@pytest.mark.parametrize("reference", [False, True])
def test_sample_without_a_mode_reads_as_the_decoder_was_trained(reference):
    """decoder.sample() with no attention_mode: hard attention samples its cells (log p(s) kept), soft attention
    reads softly (no cells, no log p(s)), on both paths."""
    torch.manual_seed(0)
    grid = torch.randn(2, 6, 12)
    with fast_paths.reference(reference):
        for attention, has_cells in (("hard", True), ("soft", False)):
            dec = FastShowAttendTellDecoder(19, 12, embed_dim=16, hidden_dim=20, attention_dim=16,
                                            attention=attention).eval()
            out = dec.sample(grid, 2, start_id=1, end_id=2, max_length=4)
            assert (out.location_log_probs is not None) == has_cells, attention
