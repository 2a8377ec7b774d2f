"""Ensembles at decode time (models/ensemble.py, api.load_ensemble, `caption`/`evaluate` with several models):
two copies of one model decode as that model; the ensemble's step is the mean of its members' log-probabilities
and its alpha the first member's or the mean; models with other words or another backbone are refused, the file
named. Smoke-config models with random weights, CPU."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioner import fast as fast_paths
from captioner.api import ImageCaptionerEnsemble, build_model, load_captioner
from captioner.config import config_to_dict, load_config
from captioner.data.vocab import Vocab
from captioner.decoding.options import DecodeOptionError, DecodeOptions
from captioner.models.ensemble import ATTENTION_SHOWN, ATTENTION_SHOWN_WORDS, CaptionerEnsemble
from captioner.names import ENSEMBLE_ATTENTIONS
from captioner.store.checkpoint import CheckpointError, save_checkpoint

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
WORDS = [["a", "red", "circle"], ["a", "blue", "square", "above"]]  # the smoke_checkpoint's vocabulary


def smoke_model(seed: int, backbone_of=None, overrides=(), words=WORDS):
    """A random smoke-config model; ``backbone_of``: copy that model's backbone (one fingerprint), and give
    this one a random position embedding, so its prepared grid differs from the other's."""
    torch.manual_seed(seed)
    cfg = load_config(SMOKE, ["model.encoder.position_embedding=true", *overrides])
    model = build_model(cfg, Vocab.build(words))
    if backbone_of is not None:
        model.encoder.backbone.load_state_dict(backbone_of.encoder.backbone.state_dict())
    with torch.no_grad():
        for p in model.refine.parameters():
            p.normal_(0.0, 0.5)
    return model.eval()


def save_run(folder: Path, model) -> Path:
    folder.mkdir(parents=True)
    save_checkpoint(folder / "best.pt", {"model": model.state_dict(), "config": config_to_dict(model.config),
                                         "vocab": model.vocab.to_dict(), "epoch": 1, "step": 1, "metrics": {}})
    return folder


def backbone_grid(model, batch: int = 3, seed: int = 0) -> torch.Tensor:
    H, W = model.grid_hw
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, H * W, model.encoder.backbone_dim, generator=g)  # (B, L, D_backbone)


@torch.no_grad()
def teacher_forced(member, grid: torch.Tensor, tokens: list[int], finished: bool, mode: str = "expectation"):
    """One image's member log-probs of ``tokens`` (then <end> when ``finished``) and alphas, stepping the member
    densely."""
    state = member.decoder.init_state(member.prepare_grid(grid))
    targets = tokens + [member.end_id] * finished
    inputs = ([member.start_id] + tokens)[: len(targets)]
    scores, alphas = [], []
    for word, target in zip(inputs, targets):
        log_probs, alpha, _, state = member.decoder.step_with_location(torch.tensor([word]), state, mode)
        scores.append(float(log_probs[0, target]))
        alphas.append(alpha[0])
    return scores, torch.stack(alphas)  # (n [+ 1],), (n [+ 1], L)


@pytest.fixture(scope="module")
def pair():
    a = smoke_model(0)
    return a, smoke_model(1, backbone_of=a)


def test_every_attention_choice_is_named_in_the_table():
    assert tuple(ATTENTION_SHOWN) == tuple(ATTENTION_SHOWN_WORDS) == ENSEMBLE_ATTENTIONS


@pytest.mark.parametrize("beam", [1, 3])
def test_two_copies_of_a_model_decode_as_that_model(smoke_checkpoint, beam):
    single = load_captioner(smoke_checkpoint)
    twice = load_captioner([smoke_checkpoint, smoke_checkpoint])
    assert isinstance(twice, ImageCaptionerEnsemble) and len(twice.members) == 2
    grid = backbone_grid(single, batch=4)
    with fast_paths.reference():  # the same dense log-softmax both ways: the mean of a and a is a, bit for bit
        assert twice.decode_options == single.decode_options  # an ensemble decodes as its first member
        options = single.decode_options.replace_given(beam=beam, n_best=beam)
        alone = single.generate(single.prepare_grid(grid), options)
        both = twice.generate(twice.grid_from(grid, images=False), options)
    for one, two in zip(alone, both):
        assert [h.tokens for h in one] == [h.tokens for h in two]
        assert [h.score for h in one] == [h.score for h in two]
        for h1, h2 in zip(one, two):
            assert torch.equal(h1.alphas, h2.alphas)
    # the single model reads Logits, the ensemble dense log-probs
    fast = twice.generate(grid, twice.decode_options.replace_given(beam=beam))
    assert [h[0].tokens for h in fast] == [h[0].tokens for h in alone]


def test_captioning_images_through_an_ensemble_encodes_once_and_matches(smoke_checkpoint, monkeypatch):
    single = load_captioner(smoke_checkpoint)
    twice = load_captioner([smoke_checkpoint, smoke_checkpoint], ensemble_attention="mean")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(2)]
    calls = []
    backbone = twice.encoder.backbone_features
    monkeypatch.setattr(twice.encoder, "backbone_features", lambda x: calls.append(x.shape[0]) or backbone(x))
    with fast_paths.reference():
        alone, both = single.caption(images, beam=2), twice.caption(images, beam=2)
    assert calls == [2]  # one backbone pass for the batch, not one per member
    for one, two in zip(alone, both):
        assert one["words"] == two["words"] and np.array_equal(one["alphas"], two["alphas"])
        assert two["ensemble"] == {"members": [str(smoke_checkpoint)] * 2, "attention": "mean",
                                   "cells": "at the arg-max of the mean of the models' attention"}
        assert "ensemble" not in one


def test_the_step_is_the_mean_of_the_members_log_probs(pair):
    a, b = pair
    ensemble = CaptionerEnsemble([a, b], attention="mean")
    grid = backbone_grid(a)
    state = ensemble.decoder.init_state(ensemble.prepare_grid(grid))
    tokens = torch.full((3,), a.start_id)
    log_probs, alpha, location, _ = ensemble.decoder.step_with_location(tokens, state, "expectation")
    members = [m.decoder.step_with_location(tokens, m.decoder.init_state(m.prepare_grid(grid)), "expectation")
               for m in (a, b)]
    assert torch.allclose(log_probs, (members[0][0] + members[1][0]) / 2, atol=1e-6)
    assert torch.allclose(alpha, (members[0][1] + members[1][1]) / 2, atol=1e-6)
    assert location is None
    for lp, alpha_m, _, _ in members:  # the mean is neither member
        assert (log_probs - lp).abs().max() > 1e-3
        assert (alpha - alpha_m).abs().max() > 1e-4
    assert torch.allclose(alpha.sum(dim=1), torch.ones(3))


@pytest.mark.parametrize("attention", ENSEMBLE_ATTENTIONS)
@pytest.mark.parametrize("beam", [1, 3])
def test_decoded_captions_carry_the_mean_score_and_the_chosen_alpha(pair, attention, beam):
    """The best caption's score is the mean over members of each member's log-probability of it (<end>
    included), and its alphas are the first member's or the mean of the members' along it."""
    a, b = pair
    ensemble = CaptionerEnsemble([a, b], attention=attention)
    grid = backbone_grid(a)
    hyps = ensemble.generate(grid, ensemble.decode_options.replace_given(beam=beam, max_length=6))
    for i, per_image in enumerate(hyps):
        best = per_image[0]
        reads = [teacher_forced(m, grid[i : i + 1], best.tokens, best.finished) for m in (a, b)]
        assert best.score == pytest.approx(np.mean([sum(scores) for scores, _ in reads]), abs=1e-4)
        n = len(best.tokens)
        expected = reads[0][1][:n] if attention == "first" else (reads[0][1][:n] + reads[1][1][:n]) / 2
        assert torch.allclose(best.alphas, expected, atol=1e-5)


def test_hard_attention_copies_give_the_cells_the_model_reads(tmp_path):
    hard = smoke_model(2, overrides=["model.attention.attention=hard", "train.objective.kind=reinforce"])
    ensemble = CaptionerEnsemble([hard, hard])
    grid = backbone_grid(hard)
    with fast_paths.reference():
        options = hard.decode_options.replace_given(beam=2, attention_mode="argmax")
        alone = hard.generate(hard.prepare_grid(grid), options)
        both = ensemble.generate(grid, options)
    assert [h[0].tokens for h in alone] == [h[0].tokens for h in both]
    assert [h[0].locations for h in alone] == [h[0].locations for h in both]
    assert all(h[0].locations is not None for h in both)


def test_an_ensemble_only_decodes(pair):
    ensemble = CaptionerEnsemble(list(pair))
    with pytest.raises(TypeError, match="only decodes"):
        ensemble(backbone_grid(pair[0]), torch.tensor([[1, 4, 2]]), torch.tensor([3]))
    with pytest.raises(ValueError, match="unknown ensemble attention 'max'; valid: first, mean"):
        CaptionerEnsemble(list(pair), attention="max")


def test_other_words_are_refused_naming_the_file(smoke_checkpoint, tmp_path):
    first = load_captioner(smoke_checkpoint)
    other = smoke_model(0, words=[["a", "green", "circle"], ["a", "blue", "square", "above"]])
    other.encoder.backbone.load_state_dict(first.encoder.backbone.state_dict())
    run = save_run(tmp_path / "other_words", other)
    with pytest.raises(CheckpointError) as info:
        load_captioner([smoke_checkpoint, run])
    message = str(info.value)
    assert message.startswith(f"{run}: cannot join an ensemble with {smoke_checkpoint}")
    assert "vocabulary mismatch" in message and "first difference at id" in message


@pytest.mark.parametrize("override, differs", [((), "weights_sha256"), (("model.encoder.grid_size=1",), "grid_hw")])
def test_another_encoder_is_refused_naming_the_file(smoke_checkpoint, tmp_path, override, differs):
    first = load_captioner(smoke_checkpoint)
    other = smoke_model(5, overrides=override)  # its own random backbone, or the same one pooled to 1x1
    if override:
        other.encoder.backbone.load_state_dict(first.encoder.backbone.state_dict())
    run = save_run(tmp_path / "other_encoder", other)
    with pytest.raises(ValueError) as info:
        load_captioner([smoke_checkpoint, run])
    message = str(info.value)
    assert message.startswith(f"{run}: cannot join an ensemble with {smoke_checkpoint}: its encoder differs")
    assert differs in message


def test_one_model_asked_for_an_ensemble_attention_is_refused(smoke_checkpoint):
    with pytest.raises(ValueError, match="needs two or more models"):
        load_captioner(smoke_checkpoint, ensemble_attention="mean")
    assert not isinstance(load_captioner([smoke_checkpoint]), ImageCaptionerEnsemble)  # a list of one: the model


# --------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def second_checkpoint(smoke_checkpoint, tmp_path_factory) -> Path:
    """Another random decoder on the smoke checkpoint's backbone and vocabulary."""
    first = load_captioner(smoke_checkpoint)
    return save_run(tmp_path_factory.mktemp("second") / "run", smoke_model(7, backbone_of=first))


def test_caption_command_with_two_models_says_it_is_an_ensemble(smoke_checkpoint, second_checkpoint, tmp_path,
                                                                  capsys):
    from captioner.cli import main

    path = tmp_path / "0.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    argv = ["caption", str(path), "--checkpoint", str(smoke_checkpoint), "--model", str(second_checkpoint),
            "--beam", "2", "--ensemble-attention", "mean"]
    assert main([*argv, "--json", "--attention-out", str(tmp_path / "overlays")]) == 0
    out = capsys.readouterr()
    (result,) = json.loads(out.out)["results"]
    assert result["ensemble"] == {"members": [str(smoke_checkpoint), str(second_checkpoint)], "attention": "mean",
                                  "cells": "at the arg-max of the mean of the models' attention"}
    assert Path(result["overlay"]).is_file()
    assert "an ensemble of 2 models" in out.err and "the mean of the models' attention" in out.err
    assert main(argv) == 0  # text: one tab-separated line per image on stdout, the ensemble named on stderr
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"{path}\t{result['caption']}"]
    with pytest.raises(SystemExit) as exit_info:
        main(["caption", str(path), "--checkpoint", str(smoke_checkpoint), "--ensemble-attention", "mean"])
    assert exit_info.value.code == 2 and "needs two or more" in capsys.readouterr().err


def test_evaluate_command_with_two_models(smoke_checkpoint, second_checkpoint, tmp_path, capsys, monkeypatch):
    from captioner.commands.evaluate import main as evaluate

    common = ["--data-root", str(tmp_path / "shapes"), "--split", "val", "--no-meteor", "--tokenizer", "simple",
              "--no-cache", "--beam", "2"]
    monkeypatch.setenv(fast_paths.ENV, "1")  # the reference: copies of a model decode it bit for bit

    def run(name: str, *checkpoints: Path) -> dict:
        out = tmp_path / f"{name}.json"
        assert evaluate(["--checkpoint", *map(str, checkpoints), "--out", str(out), *common]) == 0
        return json.loads(out.read_text())

    single = run("single", smoke_checkpoint)
    table = capsys.readouterr().out
    assert "ensemble" not in single and "ensemble" not in table
    twice = run("twice", smoke_checkpoint, smoke_checkpoint)
    assert twice["predictions"] == single["predictions"]
    pair = run("pair", smoke_checkpoint, second_checkpoint)
    table = capsys.readouterr().out
    assert pair["ensemble"] == {"members": [str(smoke_checkpoint), str(second_checkpoint)], "attention": "first",
                                "cells": f"read by the first model ({smoke_checkpoint})"}
    assert table.splitlines()[1].startswith("an ensemble of 2 models")
    assert len(pair["predictions"]) == len(single["predictions"])


def test_fine_tuned_members_share_the_cached_rows_and_run_their_own_top_blocks():
    """Snapshots of one fine-tuning run share the frozen bottom (one cache fingerprint) but not the trained top:
    the ensemble encodes an image up to the cached rows once, and each member finishes them with its own top."""
    tuned = ("model.encoder.finetune_blocks=1",)
    a = smoke_model(0, overrides=tuned)
    b = smoke_model(1, backbone_of=a, overrides=tuned)
    with torch.no_grad():
        next(b.encoder._top[0].parameters()).mul_(1.5)  # another snapshot's conv head
    ensemble = CaptionerEnsemble([a, b])
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        rows = ensemble.encode(images)  # (B, l, C): the shared cached rows
        torch.testing.assert_close(rows, a.encoder.cache_features(images))
        assert not torch.allclose(a.prepare_rows(rows), b.prepare_rows(rows))
        tokens = torch.full((2,), a.start_id)
        mean, _, _, _ = ensemble.decoder.step_with_location(tokens, ensemble.decoder.init_state(rows))
        own = [m.decoder.step_with_location(tokens, m.decoder.init_state(m.prepare_rows(rows)))[0] for m in (a, b)]
    torch.testing.assert_close(mean, (own[0] + own[1]) / 2)
    frozen = smoke_model(2, backbone_of=a)  # the same backbone weights, but its cache holds other rows
    with pytest.raises(ValueError, match="its encoder differs.*split"):
        CaptionerEnsemble([a, frozen])


# --------------------------------------------------------------------------- one read, whatever the order

HARD_ARGMAX = ("model.attention.attention=hard", "train.objective.kind=reinforce", "eval.attention_mode=argmax")


@pytest.fixture(scope="module")
def soft_and_hard(pair):
    """A soft model (reads "expectation" on its own) and a hard one whose config reads "argmax", one backbone."""
    return pair[0], smoke_model(3, backbone_of=pair[0], overrides=HARD_ARGMAX)


def _recording(monkeypatch, members, names):
    """Record the mode each member's decoder is asked to read with."""
    modes = {name: set() for name in names}
    for name, member in zip(names, members):
        step = member.decoder.step_with_location

        def record(tokens, state, attention_mode="expectation", dense=True, _step=step, _name=name):
            modes[_name].add(attention_mode)
            return _step(tokens, state, attention_mode=attention_mode, dense=dense)

        monkeypatch.setattr(member.decoder, "step_with_location", record)
    return modes


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_members_that_read_differently_on_their_own_are_refused_until_a_mode_is_given(soft_and_hard, order):
    """The soft model beside the hard one used to read as the first member does: with soft first, the hard
    model read softly; with hard first, both read one cell. Now neither order decodes without a mode."""
    members = [soft_and_hard[i] for i in order]
    names = [("soft.pt", "hard.pt")[i] for i in order]
    reads = "; ".join(f"{n}: {m}" for n, m in zip(names, [("expectation", "argmax")[i] for i in order]))
    ensemble = CaptionerEnsemble(members, names=names)
    grid = backbone_grid(members[0])
    with pytest.raises(DecodeOptionError, match=re.escape(f"differently on their own ({reads})")):
        ensemble.generate(grid, ensemble.decode_options.replace_given(beam=2))
    with pytest.raises(DecodeOptionError, match="attention_mode must be given"):
        ensemble.generate(grid, ensemble.decode_options)  # the options themselves, passed back, are refused too


@pytest.mark.parametrize("mode", ["expectation", "argmax", "sample"])
def test_a_given_mode_is_every_members_read_and_the_order_changes_no_word(soft_and_hard, monkeypatch, mode):
    soft, hard = soft_and_hard
    grid = backbone_grid(soft)
    words = []
    for members, names in (([soft, hard], ["soft.pt", "hard.pt"]), ([hard, soft], ["hard.pt", "soft.pt"])):
        modes = _recording(monkeypatch, members, names)
        torch.manual_seed(0)
        ensemble = CaptionerEnsemble(members, names=names)
        hyps = ensemble.generate(grid, ensemble.decode_options.replace_given(beam=2, attention_mode=mode))
        assert modes == {"soft.pt": {mode}, "hard.pt": {mode}}
        words.append([h[0].tokens for h in hyps])
        monkeypatch.undo()
    if mode != "sample":  # sampled cells follow the random stream member by member
        assert words[0] == words[1]


def test_members_that_read_alike_need_no_mode(pair):
    """A soft model beside a hard one whose config reads "expectation": each reads as on its own."""
    soft = pair[0]
    hard = smoke_model(4, backbone_of=soft, overrides=HARD_ARGMAX[:2])
    ensemble = CaptionerEnsemble([hard, soft])
    assert type(ensemble.decode_options) is DecodeOptions and ensemble.decode_options.attention_mode == "expectation"
    assert ensemble.generate(backbone_grid(soft), ensemble.decode_options.replace_given(beam=2))[0][0].locations is None


def test_argmax_beside_sample_is_refused_too(pair):
    a = smoke_model(5, backbone_of=pair[0], overrides=HARD_ARGMAX)
    b = smoke_model(6, backbone_of=pair[0], overrides=(*HARD_ARGMAX[:2], "eval.attention_mode=sample"))
    ensemble = CaptionerEnsemble([a, b])
    with pytest.raises(DecodeOptionError, match=r"\(member 0: argmax; member 1: sample\)"):
        ensemble.generate(backbone_grid(a))
    assert ensemble.decode_options.replace_given(attention_mode="sample") == DecodeOptions(
        beam=2, attention_mode="sample", max_length=a.decode_options.max_length)  # chosen: plain options


def test_a_soft_member_that_cannot_read_one_cell_is_refused_by_name(pair):
    multi = smoke_model(7, backbone_of=pair[0], overrides=("model.attention.attention=multi_head",
                                                           "model.attention.heads=2"))
    hard = smoke_model(8, backbone_of=pair[0], overrides=HARD_ARGMAX)
    ensemble = CaptionerEnsemble([hard, multi], names=["hard.pt", "multi.pt"])
    with pytest.raises(ValueError, match=r"^multi.pt: attention mode 'argmax' reads one grid cell per word"):
        ensemble.generate(backbone_grid(hard), ensemble.decode_options.replace_given(attention_mode="argmax"))


@pytest.mark.parametrize("attention", ENSEMBLE_ATTENTIONS)
def test_the_cells_reported_are_those_of_the_map_shown(pair, attention):
    """In a one-cell mode the ensemble used to report the first member's cells even beside the mean map; the
    cells now follow the map shown: the first member's reads, or the arg-max of the mean alpha."""
    a = smoke_model(9, backbone_of=pair[0], overrides=HARD_ARGMAX)
    b = smoke_model(10, backbone_of=pair[0], overrides=HARD_ARGMAX)
    with torch.no_grad():  # random scorers of some strength: the two models look at other cells
        for p in (*a.decoder.attention.parameters(), *b.decoder.attention.parameters()):
            p.normal_(0.0, 1.0)
    grid = backbone_grid(a, batch=4)
    options = a.decode_options.replace_given(beam=2)  # the ensemble's: its first member's (both read alike)
    hyps = {shown: CaptionerEnsemble([a, b], attention=shown).generate(grid, options) for shown in ENSEMBLE_ATTENTIONS}
    for per_image in hyps[attention]:
        best = per_image[0]
        assert best.locations is not None and len(best.locations) == len(best.tokens)
        assert list(best.locations) == best.alphas.argmax(dim=-1).tolist()  # hard argmax reads alpha's peak
    first, mean = ([h[0].locations for h in hyps[shown]] for shown in ENSEMBLE_ATTENTIONS)
    assert [h[0].tokens for h in hyps["first"]] == [h[0].tokens for h in hyps["mean"]]  # the same words
    assert first != mean  # and, on these two models, other cells: the choice shows


def test_caption_command_needs_a_mode_for_members_that_read_differently(smoke_checkpoint, tmp_path, capsys):
    from captioner.cli import main

    first = load_captioner(smoke_checkpoint, device="cpu")
    hard = save_run(tmp_path / "hard", smoke_model(11, backbone_of=first, overrides=HARD_ARGMAX))
    path = tmp_path / "0.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    argv = ["caption", str(path), "--model", str(smoke_checkpoint), "--model", str(hard), "--device", "cpu"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert (f"argument --attention-mode: must be given: the ensemble's models read differently on their own "
            f"({smoke_checkpoint}: expectation; {hard}: argmax)") in err
    assert main([*argv, "--attention-mode", "argmax", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["attention_mode"] == "argmax" and len(result["locations"]) == len(result["words"])
    assert result["ensemble"]["cells"] == f"read by the first model ({smoke_checkpoint})"
