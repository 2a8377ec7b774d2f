"""Every registered training objective (``objective_sections.OBJECTIVES``) through the contract the training loop
relies on, as tests/test_decoder_contract.py does for the decoders: a finite loss whose gradients reach the
decoder, a ``state_dict`` that survives a checkpoint (``torch.load(weights_only=True)``), a run killed inside an
epoch and resumed that ends where an uninterrupted one does, and the keys its section would ignore refused.

The checks are functions of the kind alone, so an objective registered with one line is checked with no other
edit: the last test registers a new one (a section, a module written here, one line) and runs them all on it."""

from __future__ import annotations

import dataclasses
import io
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from captioner.api import build_model
from captioner.config import ConfigError, load_config
from captioner.data.datasets import build_vocab, collate_captions, load_records
from captioner.objective_sections import OBJECTIVES, CrossEntropyConfig
from captioner.store.rundir import RunDir
from captioner.training.inputs import make_datasets
from captioner.training.loop import _TrainForward, train
from captioner.training.objectives.registry import build_objective
from tests.test_kill_resume import Killed, _die_at, _equal_weights, _scored_by_val_loss, _timeless

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("objective_data")


def _sets(kind: str) -> list[str]:
    """A smoke run of ``kind``: hard attention where its section trains only that (HARD), soft otherwise."""
    sets = [f"train.objective.kind={kind}", "train.num_threads=1", "train.tensorboard=off"]
    if OBJECTIVES.section(kind).HARD:
        sets.append("model.attention.attention=hard")
    return sets


def _cfg(data_root: Path, run_dir: Path, kind: str, *more: str):
    return load_config(SMOKE, [f"data.root={data_root}", f"train.run_dir={run_dir}", *_sets(kind), *more])


def _built(cfg):
    """The model, its objective and one batch of four training items, as the training loop builds them."""
    records = load_records(cfg.data, "train")
    vocab = build_vocab(records, cfg.data.min_count)
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    train_set, _, _ = make_datasets(cfg, model, vocab, records, load_records(cfg.data, "val"), True, 0, 1)
    objective = build_objective(cfg, model, train_set, from_images=True)
    return model, objective, collate_captions([train_set[i] for i in range(4)])


def check_loss_reaches_the_decoder(data_root: Path, tmp_path: Path, kind: str) -> None:
    model, objective, batch = _built(_cfg(data_root, tmp_path / "run", kind))
    model.train()
    torch.manual_seed(1)
    res = objective.total_loss(_TrainForward(model, from_images=True), batch)
    assert res.loss.dim() == 0 and torch.isfinite(res.loss), res.loss
    res.loss.backward()
    grads = [p.grad for p in model.decoder.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def check_state_dict_round_trips(data_root: Path, tmp_path: Path, kind: str) -> None:
    cfg = _cfg(data_root, tmp_path / "run", kind)
    _, objective, _ = _built(cfg)
    objective.on_epoch(1)
    objective.after_step(0.75)  # what a taken step tells it (its moving state, if it keeps one, moves)
    state = objective.state_dict()
    buffer = io.BytesIO()
    torch.save({"objective": state}, buffer)  # as a checkpoint holds it, read back as checkpoints are
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["objective"]
    _, fresh, _ = _built(cfg)
    fresh.load_state_dict(loaded)
    assert fresh.state_dict() == state


def check_a_resumed_run_ends_as_an_uninterrupted_one(data_root: Path, tmp_path: Path, kind: str,
                                                     monkeypatch) -> None:
    """Killed twice inside its epochs (last.pt written after every batch), resumed each time: the uninterrupted
    run's weights, best.pt and metrics (clock readings aside)."""
    _scored_by_val_loss(monkeypatch)
    sets = ["train.epochs=2", "train.save_every_min=1e-9"]
    straight = RunDir(train(_cfg(data_root, tmp_path / "straight", kind, *sets)))
    run = RunDir(tmp_path / "run")
    for nth in (2, 3):  # the process dies as it starts its nth last.pt write of that session
        with monkeypatch.context() as mp:
            _die_at(mp, "last.pt", nth)
            with pytest.raises(Killed):
                train(_cfg(data_root, run.root, kind, *sets), resume=str(run.root) if run.last.is_file() else None)
    train(_cfg(data_root, run.root, kind, *sets), resume=str(run.root))
    for path in ("last", "best"):
        assert _equal_weights(getattr(run, path), getattr(straight, path)), (kind, path)
    assert _timeless(run) == _timeless(straight)


def _other_value(section: type, key: str):
    """A valid value of ``key`` other than its default."""
    value = getattr(section(), key)
    if key in section.CHOICES:
        return next(choice for choice in section.CHOICES[key] if choice != value)
    if isinstance(value, bool):
        return not value
    if key in section.UNIT_INTERVAL or key == "label_smoothing":  # label smoothing: [0, 1), checked by check
        return value / 2 if value > 0 else 0.5
    return abs(value) + 1


def check_keys_it_would_not_read_are_refused(kind: str) -> None:
    """A key only another objective has is unknown here, named with this kind's keys; and each key the section
    says a run would ignore (``unread``), set, is refused with the reason, for each attention it can train."""
    section = OBJECTIVES.section(kind)
    own = {f.name for f in dataclasses.fields(section)}
    foreign = sorted({f.name for _, other in OBJECTIVES.items() for f in dataclasses.fields(other)} - own)
    assert foreign  # every kind lacks some key of another
    with pytest.raises(ConfigError, match=f"unknown config key 'train.objective.{foreign[0]}'"):
        load_config(SMOKE, [*_sets(kind), f"train.objective.{foreign[0]}=1"])
    for hard in (False, True):
        if section.HARD not in (None, hard):
            continue
        attention = ["model.attention.attention=hard"] if hard else ["model.attention.attention=soft"]
        for path in section().unread(hard):
            key = path.rsplit(".", 1)[1]
            value = _other_value(section, key)
            with pytest.raises(ConfigError, match=f"{path}: .*would ignore"):
                load_config(SMOKE, [f"train.objective.kind={kind}", *attention, f"{path}={value}"])


KINDS = list(OBJECTIVES)


@pytest.mark.parametrize("kind", KINDS)
def test_the_loss_is_finite_and_reaches_the_decoder(data_root, tmp_path, kind):
    check_loss_reaches_the_decoder(data_root, tmp_path, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_the_state_dict_round_trips_through_a_checkpoint(data_root, tmp_path, kind):
    check_state_dict_round_trips(data_root, tmp_path, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_run_killed_inside_epochs_resumes_to_the_uninterrupted_run(data_root, tmp_path, kind, monkeypatch):
    check_a_resumed_run_ends_as_an_uninterrupted_one(data_root, tmp_path, kind, monkeypatch)


@pytest.mark.parametrize("kind", KINDS)
def test_keys_the_section_would_ignore_are_refused(kind):
    check_keys_it_would_not_read_are_refused(kind)


@dataclasses.dataclass
class HalfCrossEntropyConfig(CrossEntropyConfig):
    """A new objective's section: cross-entropy at half weight (a probe, not a shipped objective)."""

    kind: str = "half_xe"
    IMPLEMENTATION = "half_xe_probe:HalfCrossEntropy"


PROBE_MODULE = '''
from captioner.training.losses import LossOutput
from captioner.training.objectives.cross_entropy import CrossEntropy


class HalfCrossEntropy(CrossEntropy):
    def loss(self, forward, batch):
        res = super().loss(forward, batch)
        return LossOutput(loss=0.5 * res.loss, parts=res.parts)
'''


@pytest.mark.slow
def test_an_objective_registered_with_one_line_passes_the_contract(data_root, tmp_path, monkeypatch):
    """A section (above), a module (written here) and one line in OBJECTIVES: the config reads the new kind, the
    training loop builds and trains it, and every check above holds for it, with no other edit."""
    (tmp_path / "half_xe_probe.py").write_text(textwrap.dedent(PROBE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(OBJECTIVES.sections, "half_xe", HalfCrossEntropyConfig)  # the one line
    assert isinstance(load_config(SMOKE, ["train.objective.kind=half_xe"]).train.objective, HalfCrossEntropyConfig)
    check_loss_reaches_the_decoder(data_root, tmp_path, "half_xe")
    check_state_dict_round_trips(data_root, tmp_path, "half_xe")
    check_keys_it_would_not_read_are_refused("half_xe")
    check_a_resumed_run_ends_as_an_uninterrupted_one(data_root, tmp_path, "half_xe", monkeypatch)
    assert "half_xe_probe" in sys.modules


def test_a_section_that_names_no_objective_is_refused_with_its_path(data_root, tmp_path, monkeypatch):
    @dataclasses.dataclass
    class Broken(CrossEntropyConfig):
        kind: str = "broken"
        IMPLEMENTATION = "captioner.training.losses:LossOutput"  # a class, but not an Objective

    monkeypatch.setitem(OBJECTIVES.sections, "broken", Broken)
    with pytest.raises(TypeError, match="Broken.IMPLEMENTATION 'captioner.training.losses:LossOutput' is not a "
                                        "subclass of Objective"):
        _built(_cfg(data_root, tmp_path / "run", "broken"))
    Broken.IMPLEMENTATION = "captioner.training.objectives.no_such_module:Nothing"
    with pytest.raises(ImportError, match="Broken.IMPLEMENTATION 'captioner.training.objectives.no_such_module:"
                                          "Nothing' does not resolve"):
        _built(_cfg(data_root, tmp_path / "run", "broken"))
