"""Supervised attention (train.objective.grounding_weight): the term by hand, the box maps it reads, that it adds
exactly its weighted term to every objective (xe, reinforce, loo, gumbel, scst) and reaches the attention's
weights, that captions without boxed words add nothing, where it is refused, and a run end to end (train with it,
validation's pointing figure, `captioner evaluate --entities`) on a tiny data set in the real formats."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from captioner.api import build_model
from captioner.config import ConfigError, load_config
from captioner.data.datasets import build_vocab, collate_captions, load_records
from captioner.data.entities import read_entities
from captioner.training.inputs import make_datasets
from captioner.training.loop import _TrainForward
from captioner.training.losses import attention_mass_loss, attention_supervision_loss
from captioner.training.objectives.base import BoxTargets
from captioner.training.objectives.registry import build_objective
from tests.entities_fixture import write_flickr_like

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def test_the_term_is_the_cross_entropy_of_alpha_against_the_box_map_on_supervised_steps_only():
    alphas = torch.tensor([[[0.5, 0.25, 0.125, 0.125], [0.1, 0.2, 0.3, 0.4]]])  # (1, 2, 4)
    maps = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]])
    total, count = attention_supervision_loss(alphas, maps, torch.tensor([[True, False]]))
    assert count.item() == 1
    assert total.item() == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)), rel=1e-6)


def test_the_mass_term_is_minus_the_log_of_alphas_share_inside_the_boxes_on_supervised_steps_only():
    alphas = torch.tensor([[[0.5, 0.25, 0.125, 0.125], [0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]])  # (1, 3, 4)
    shares = torch.tensor([[[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.25, 0.25]]])
    total, count = attention_mass_loss(alphas, shares, torch.tensor([[True, False, True]]))
    assert count.item() == 2
    inside = [1.0 * 0.5 + 0.5 * 0.25, 0.25 * 0.1 + 0.25 * 0.1]  # 0.625, 0.05
    assert total.item() == pytest.approx(-(math.log(inside[0]) + math.log(inside[1])), rel=1e-6)
    # any map wholly inside cells the boxes cover reaches the minimum, however it spreads there
    whole = torch.tensor([[[0.9, 0.1, 0.0, 0.0]]])
    assert attention_mass_loss(whole, torch.tensor([[[1.0, 1.0, 0.0, 0.0]]]), torch.tensor([[True]]))[0].item() \
        == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_flickr_like(tmp_path_factory.mktemp("flickr_like"))


def _cfg(data, tmp_path, kind="xe", weight=1.0, *more):
    images, captions, entities = data
    sets = [f"data.root={images}", f"data.captions={captions}", "data.format=karpathy", "data.use_cache=false",
            f"data.entities={entities}", f"train.run_dir={tmp_path / 'run'}", "train.num_threads=1",
            "train.tensorboard_images=0", "train.batch_size=6", f"train.objective.kind={kind}",
            f"train.objective.grounding_weight={weight}", *more]
    if kind in ("reinforce", "loo", "gumbel"):
        sets.append("model.attention.attention=hard")
    if kind == "scst":
        sets.append("train.objective.samples=2")
    return load_config(SMOKE, sets)


def _built(cfg):
    train = load_records(cfg.data, "train")
    vocab = build_vocab(train, cfg.data.min_count)
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    train_set, _, _ = make_datasets(cfg, model, vocab, train, load_records(cfg.data, "val"), True, 0, 1)
    return model, vocab, train_set


def test_box_maps_go_to_the_boxed_words_of_each_photo_and_flip_with_a_mirrored_copy(data, tmp_path):
    cfg = _cfg(data, tmp_path)
    model, vocab, train_set = _built(cfg)
    records = train_set.records
    mirrored = [type(records[0])(image_id=records[0].image_id + "#mirror", path=records[0].path,
                                 captions=records[0].captions, raw=records[0].raw, mirrored=True)]
    entities = read_entities(cfg.data.entities, [r.image_id for r in records])
    targets = BoxTargets(records[:2] + mirrored, entities, vocab, model.grid_hw)
    tokens = torch.tensor([[vocab.id("square"), vocab.id("red"), vocab.id("grass")]] * 3)
    maps, hit = targets.lookup(torch.tensor([0, 1, 2]), tokens)
    assert hit.tolist() == [[True, False, True]] * 3  # "square" and "grass" head boxed phrases; "red" does not
    H, W = model.grid_hw
    left, right, again = maps[:, 0].view(3, H, W)
    assert left[:, : W // 2].sum() > 0.99 and right[:, W // 2 :].sum() > 0.99  # photo 0: left, photo 1: right
    assert torch.allclose(again, left.flip(-1))  # the mirrored copy of photo 0: its map flipped
    assert torch.allclose(maps[0, 2], torch.full((H * W,), 1.0 / (H * W)))  # the grass: the whole photo
    assert torch.allclose(maps.sum(-1), hit.float())


def test_the_mass_term_reads_the_cells_shares_and_a_power_sharpens_the_map(data, tmp_path):
    cfg = _cfg(data, tmp_path)
    model, vocab, train_set = _built(cfg)
    records = train_set.records[:2]
    entities = read_entities(cfg.data.entities, [r.image_id for r in records])
    tokens = torch.tensor([[vocab.id("square")]] * 2)
    images = torch.tensor([0, 1])
    plain, _ = BoxTargets(records, entities, vocab, model.grid_hw).lookup(images, tokens)
    shares, _ = BoxTargets(records, entities, vocab, model.grid_hw, "mass").lookup(images, tokens)
    sharp, _ = BoxTargets(records, entities, vocab, model.grid_hw, "cross_entropy", 3.0).lookup(images, tokens)
    assert shares.max() <= 1.0 + 1e-6 and (shares.amax(-1) > 0).all()
    # the plain map is the shares normalised; the power-3 map is the cubed shares normalised: by hand, per cell
    assert torch.allclose(plain, shares / shares.sum(-1, keepdim=True), atol=1e-6)
    assert torch.allclose(sharp, shares ** 3 / (shares ** 3).sum(-1, keepdim=True), atol=1e-6)


@pytest.mark.parametrize("loss", ["cross_entropy", "mass"])
def test_an_objective_adds_the_term_it_names(data, tmp_path, loss):
    cfg = _cfg(data, tmp_path, "xe", 1.0, f"train.objective.grounding_loss={loss}")
    model, vocab, train_set = _built(cfg)
    objective = build_objective(cfg, model, train_set, from_images=True)
    batch = collate_captions([train_set[i] for i in range(4)])
    maps, hit = objective.box_targets.lookup(batch.indices, batch.captions[:, 1:])
    model.eval()  # dropout off, so the two forwards read the same alphas
    got = objective.total_loss(_TrainForward(model, from_images=True), batch).parts["grounding"]
    out = _TrainForward(model, from_images=True)(batch.inputs, batch.captions, batch.lengths,
                                                 attention_mode="expectation")
    want, n = (attention_mass_loss if loss == "mass" else attention_supervision_loss)(out.alphas, maps,
                                                                                       hit & out.mask)
    assert got.item() == pytest.approx((want / n).item(), rel=1e-5)


def test_the_grounding_terms_keys_are_checked_and_refused_where_unread(data, tmp_path):
    with pytest.raises(ConfigError, match="grounding_loss: 'peak' is not one of cross_entropy, mass"):
        _cfg(data, tmp_path, "xe", 1.0, "train.objective.grounding_loss=peak")
    with pytest.raises(ConfigError, match="grounding_power: must be >= 1"):
        _cfg(data, tmp_path, "xe", 1.0, "train.objective.grounding_power=0.5")
    with pytest.raises(ConfigError, match="grounding_power.*mass term reads the boxes' cell shares"):
        _cfg(data, tmp_path, "xe", 1.0, "train.objective.grounding_loss=mass", "train.objective.grounding_power=2")
    with pytest.raises(ConfigError, match="grounding_loss.*grounding term is off"):
        _cfg(data, tmp_path, "scst", 0.0, "train.objective.grounding_loss=mass")
    assert _cfg(data, tmp_path, "xe", 1.0, "train.objective.grounding_power=2").train.objective.grounding_power == 2


@pytest.mark.parametrize("kind", ["xe", "reinforce", "loo", "gumbel", "scst"])
def test_every_objective_gets_exactly_its_weighted_term_and_it_reaches_the_attention(data, tmp_path, kind):
    weight = 2.0
    cfg = _cfg(data, tmp_path, kind, weight)
    model, vocab, train_set = _built(cfg)
    objective = build_objective(cfg, model, train_set, from_images=True)
    batch = collate_captions([train_set[i] for i in range(4)])
    forward = _TrainForward(model, from_images=True)
    torch.manual_seed(1)
    plain = objective.loss(forward, batch)
    torch.manual_seed(1)
    full = objective.total_loss(forward, batch)
    parts = full.parts
    assert parts["grounding"] > 0 and 0 < parts["grounded_words"] < 1
    term = full.loss - plain.loss
    assert term.item() == pytest.approx(weight * (parts["grounding"] * parts["grounded_words"]).item(), rel=1e-4)
    model.zero_grad()
    term.backward()
    scorer = [p for name, p in model.named_parameters() if "attention" in name and p.grad is not None]
    assert scorer and any(p.grad.abs().sum() > 0 for p in scorer)


def test_captions_without_boxed_words_add_nothing(data, tmp_path):
    cfg = _cfg(data, tmp_path)
    model, vocab, train_set = _built(cfg)
    objective = build_objective(cfg, model, train_set, from_images=True)
    batch = collate_captions([train_set[i] for i in range(3)])
    batch.captions[:, 1:-1] = torch.where(batch.captions[:, 1:-1] > 3, vocab.id("on"), batch.captions[:, 1:-1])
    forward = _TrainForward(model, from_images=True)
    torch.manual_seed(1)
    plain = objective.loss(forward, batch)
    torch.manual_seed(1)
    full = objective.total_loss(forward, batch)
    assert full.parts["grounded_words"].item() == 0 and full.loss.item() == plain.loss.item()


def test_it_is_refused_without_entities_or_without_a_per_word_alpha(data, tmp_path):
    with pytest.raises(ConfigError, match="grounding_weight: supervises attention .* data.entities names no folder"):
        _cfg(data, tmp_path, "xe", 1.0, "data.entities=")
    with pytest.raises(ConfigError, match="grounding_weight: the transformer decoder has no per-word alpha"):
        _cfg(data, tmp_path, "xe", 1.0, "model.decoder.kind=transformer")
    with pytest.raises(ConfigError, match="grounding_weight: must be >= 0"):
        _cfg(data, tmp_path, "xe", -1.0)
    assert _cfg(data, tmp_path, "xe", 0.0, "data.entities=").train.objective.grounding_weight == 0


def test_photos_of_another_data_set_are_refused_by_name(data, tmp_path):
    cfg = _cfg(data, tmp_path)
    model, vocab, train_set = _built(cfg)
    empty = tmp_path / "other_entities"
    (empty / "Sentences").mkdir(parents=True)
    (empty / "Annotations").mkdir()
    cfg.data.entities = str(empty)
    with pytest.raises(ConfigError, match=r"grounding_weight: .*other_entities: no Flickr30k Entities annotation "
                                          r"for any of the 12 photos of the training split"):
        build_objective(cfg, model, train_set, from_images=True)


@pytest.mark.slow
def test_a_supervised_run_reports_pointing_and_evaluate_reads_the_boxes(data, tmp_path, capsys):
    from captioner.commands.evaluate import main as evaluate
    from captioner.training.loop import train

    cfg = _cfg(data, tmp_path, "xe", 1.0, "train.epochs=8", "train.patience=100", "eval.beam_size=1")
    run_dir = train(cfg)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [e for e in lines if "pointing" in e]
    assert len(epochs) == 8 and all(e["train_grounding"] > 0 for e in epochs)
    assert epochs[-1]["grounded_words"] > 0 and 0 <= epochs[-1]["pointing"] <= 1
    capsys.readouterr()
    assert evaluate(["--checkpoint", str(run_dir / "best.pt"), "--split", "val", "--json", "--no-meteor"]) == 0
    boxes = json.loads(capsys.readouterr().out)["boxes"]  # data.entities from the checkpoint's config
    # each val photo: 3 references with 1 + 1 + 2 boxed phrases (the scene chain has no box)
    assert boxes["teacher_forced"]["words"] == 4 * 4 and boxes["photos"] == 4
    assert set(boxes["teacher_forced"]["by_type"]) == {"other"}
    assert 0 <= boxes["teacher_forced"]["inside"] <= 1
