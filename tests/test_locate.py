"""One resolver for what a model path names (captioner/store/locate.py, issue 46): a shipped name, a model folder,
a hub id or a checkpoint, by one precedence, with a run folder's best.pt or last.pt as the caller asks; captioning,
train.init and --resume all read paths through it, and put the weights into a model through ``load_weights``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from captioner.api import build_model, load_captioner
from captioner.cli import main as cli_main
from captioner.config import load_config
from captioner.data.vocab import Vocab
from captioner.store.checkpoint import CheckpointError
from captioner.store.hub import ModelFolderError
from captioner.store.locate import Located, load_weights, locate
from captioner.store.rundir import RunDir
from captioner.store.zoo import DEFAULT_MODEL, SHIPPED_DIR
from captioner.training.errors import TrainingError
from captioner.training.resume import init_weights, load_init, resume_payload

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache with the hub offline, and a working directory where no name is a path."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return cache


@pytest.fixture(scope="module")
def folder(smoke_checkpoint, tmp_path_factory) -> Path:
    """The smoke model exported as a model folder (float16, as `captioner export` writes it)."""
    out = tmp_path_factory.mktemp("export") / "tiny-captioner"
    assert cli_main(["export", "--checkpoint", str(smoke_checkpoint), "--format", "hub", str(out)]) == 0
    return out


def _run(root: Path, *files: str) -> RunDir:
    run = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    for name in files:
        getattr(run, name).write_bytes(b"")  # locate reads no checkpoint: only which file is meant
    return run


# --------------------------------------------------------------------------- each kind, and the precedence


def test_nothing_or_a_shipped_name_is_the_shipped_model(offline_cache):
    assert locate(None) == Located("shipped", SHIPPED_DIR / DEFAULT_MODEL)
    assert locate("flickr8k") == Located("shipped", SHIPPED_DIR / "flickr8k_soft")  # an alias
    assert locate("flickr8k_hard") == Located("shipped", SHIPPED_DIR / "flickr8k_hard")


def test_an_existing_path_wins_over_a_shipped_name_and_a_hub_id(offline_cache, tmp_path):
    run = _run(tmp_path / "flickr8k", "last")
    assert locate("flickr8k") == Located("checkpoint", Path("flickr8k") / run.last.name)
    owner = _run(tmp_path / "someone" / "model", "best")
    assert locate("someone/model") == Located("checkpoint", Path("someone/model") / owner.best.name)


def test_a_folder_with_config_json_is_a_model_folder(folder, offline_cache):
    assert locate(folder) == Located("folder", folder)
    assert locate(str(folder), prefer="last", hub=False).kind == "folder"  # whatever a run folder would mean


def test_an_owner_name_that_is_no_path_is_a_hub_model_in_the_cache(folder, offline_cache, in_hub_cache):
    snapshot = in_hub_cache(offline_cache, "someone/tiny-captioner", folder)
    assert locate("someone/tiny-captioner") == Located("hub", snapshot)


def test_a_hub_model_missing_with_the_hub_offline_names_the_id_and_how_to_fetch_it(offline_cache):
    with pytest.raises(ModelFolderError, match=r"^someone/absent: no such file or folder, and no model .* in the "
                                               r"Hugging Face cache .*offline.*`hf download someone/absent`"):
        locate("someone/absent")


def test_without_hub_ids_an_owner_name_is_a_missing_path(folder, offline_cache, in_hub_cache):
    in_hub_cache(offline_cache, "someone/tiny-captioner", folder)  # there, but not looked up
    with pytest.raises(CheckpointError, match="^checkpoint not found: someone/tiny-captioner$"):
        locate("someone/tiny-captioner", hub=False)


def test_a_checkpoint_file_is_itself_and_a_missing_path_is_named(offline_cache, tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"")
    assert locate("weights.pt", prefer="last") == Located("checkpoint", Path("weights.pt"))
    with pytest.raises(CheckpointError, match=r"^checkpoint not found: nope\.pt$"):
        locate("nope.pt")


def test_a_run_folder_means_best_pt_else_last_pt_or_last_pt_alone(offline_cache, tmp_path):
    run = _run(tmp_path / "run", "last")
    assert locate(run.root).path == run.last  # stopped before validating: its last.pt
    assert locate(run.root, prefer="last").path == run.last
    _run(run.root, "best")
    assert locate(run.root).path == run.best
    assert locate(run.root, prefer="last").path == run.last  # the latest state, not the best epoch
    run.last.unlink()
    with pytest.raises(CheckpointError, match=f"^checkpoint not found: {re.escape(str(run.root))} is a directory "
                                              "without last.pt$"):
        locate(run.root, prefer="last")
    run.best.unlink()
    with pytest.raises(CheckpointError, match="is a directory without best.pt or last.pt$"):
        locate(run.root)
    with pytest.raises(ValueError, match="prefer='latest'"):
        locate(run.root, prefer="latest")


# --------------------------------------------------------------------------- the weights


def test_load_weights_loads_a_state_dict_exactly_and_names_the_source_of_a_misfit():
    torch.manual_seed(0)
    saved, model = nn.Linear(3, 2), nn.Linear(3, 2)
    load_weights(model, saved.state_dict(), "run/best.pt")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())
    with pytest.raises(CheckpointError, match=r"^run/best.pt: checkpoint weights do not fit this model.*"
                                              r"weight: checkpoint \(2, 4\) vs model \(2, 3\)"):
        load_weights(model, nn.Linear(4, 2).state_dict(), "run/best.pt")


# --------------------------------------------------------------------------- its callers


def test_train_init_takes_a_hub_id_as_captioning_does(folder, offline_cache, in_hub_cache):
    in_hub_cache(offline_cache, "someone/tiny-captioner", folder)
    cfg = load_config(SMOKE, ["train.init=someone/tiny-captioner"])
    payload = load_init(cfg.train.init)
    model = build_model(cfg, Vocab.from_dict(payload["vocab"]))
    init_weights(cfg, model, payload)
    captioning = load_captioner("someone/tiny-captioner").state_dict()  # the float16 weights captioning reads
    assert model.state_dict().keys() == captioning.keys()
    assert all(torch.equal(v, captioning[k]) for k, v in model.state_dict().items())
    with pytest.raises(ModelFolderError, match="^someone/absent: no such file or folder.*offline"):
        load_init("someone/absent")


def test_resume_refuses_a_model_folder_or_shipped_name_saying_to_start_from_it(folder, offline_cache):
    cfg = load_config(SMOKE)
    for given, what in ((str(folder), f"the model folder {folder}"), ("flickr8k", "the shipped model flickr8k_soft")):
        with pytest.raises(TrainingError, match=f"^--resume {re.escape(given)}: {re.escape(what)} holds a model's "
                                                f"weights.*nothing to resume.*--init {re.escape(given)}$"):
            resume_payload(cfg, given, world=1)


def test_resume_reads_no_hub_id(folder, offline_cache, in_hub_cache):
    in_hub_cache(offline_cache, "someone/tiny-captioner", folder)
    with pytest.raises(CheckpointError, match="^checkpoint not found: someone/tiny-captioner$"):
        resume_payload(load_config(SMOKE), "someone/tiny-captioner", world=1)


def test_a_missing_run_folder_is_named_without_asking_the_hub(tmp_path, monkeypatch, capsys):
    """`train.init: runs/flickr8k_hard` before that run exists was sent to huggingface.co as a model id (about 25 s
    offline, then a traceback): a path under runs/ or under an existing folder is a missing path."""
    import captioner.store.locate as locate_mod
    from captioner.commands.train import main as train_main
    from captioner.store.checkpoint import CheckpointError
    from captioner.store.hub import looks_like_repo_id

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(locate_mod, "hub_model_folder", lambda text: pytest.fail(f"asked the hub for {text}"))
    (tmp_path / "mine").mkdir()
    assert not looks_like_repo_id("runs/flickr8k_hard") and not looks_like_repo_id("mine/model")
    assert looks_like_repo_id("owner/name")
    with pytest.raises(CheckpointError, match="checkpoint not found: runs/flickr8k_hard"):
        locate_mod.locate("runs/flickr8k_hard", prefer="best")
    smoke = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
    assert train_main(["--config", str(smoke), "--init", "runs/nothere"]) == 1
    err = capsys.readouterr().err
    assert "captioner train: error: checkpoint not found: runs/nothere" in err and "Traceback" not in err
