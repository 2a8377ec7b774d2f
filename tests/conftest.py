"""Suite-wide settings.

OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin while waiting make torch up to 10x slower
when the two cores here are shared (other tests, subprocesses under test, other jobs). It has
to be set before torch starts its thread pool, hence here, before any test imports torch.
Subprocesses started by tests inherit it.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The suite means the CPU wherever it runs: "auto" (every command's default device) is the CPU here and in the
# commands the tests start, also on a machine with a GPU (captioner/runtime.py). Tests marked `gpu` name cuda.
os.environ.setdefault("CAPTIONER_AUTO_DEVICE", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def smoke_checkpoint(tmp_path_factory) -> Path:
    """A run directory holding best.pt of a randomly initialised smoke-config model."""
    import torch

    from captioner.api import build_model
    from captioner.config import config_to_dict, load_config
    from captioner.data.vocab import Vocab
    from captioner.store.checkpoint import save_checkpoint

    torch.manual_seed(0)
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml")
    vocab = Vocab.build([["a", "red", "circle"], ["a", "blue", "square", "above"]])
    model = build_model(cfg, vocab)
    run_dir = tmp_path_factory.mktemp("run")
    save_checkpoint(run_dir / "best.pt", {
        "model": model.state_dict(), "config": config_to_dict(cfg), "vocab": vocab.to_dict(),
        "epoch": 1, "step": 10, "metrics": {"CIDEr-D": 0.0},
    })
    return run_dir


@pytest.fixture
def wrap_objective_loss(monkeypatch):
    """``wrap(around)``: every objective the training loop builds computes its loss as ``around(loss, forward,
    batch)``, ``loss`` its own (the loop's one call per step): to watch or spoil steps."""

    def wrap(around) -> None:
        import captioner.training.loop as loop_mod

        build = loop_mod.build_objective

        def build_wrapped(*args, **kwargs):
            objective = build(*args, **kwargs)
            loss = objective.loss
            objective.loss = lambda forward, batch: around(loss, forward, batch)
            return objective

        monkeypatch.setattr(loop_mod, "build_objective", build_wrapped)

    return wrap


@pytest.fixture
def in_hub_cache():
    """``lay(cache, repo_id, folder) -> snapshot``: ``folder`` (a model folder) laid out as huggingface_hub caches a
    model: blobs named by content, a snapshot of links to them, refs/main."""

    def lay(cache: Path, repo_id: str, folder: Path) -> Path:
        import hashlib
        import shutil

        from captioner.store.hub import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE

        repo = cache / f"models--{repo_id.replace('/', '--')}"
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (repo / "blobs").mkdir()
        for name in (WEIGHTS_FILE, CONFIG_FILE, CARD_FILE):
            blob = repo / "blobs" / hashlib.sha256((folder / name).read_bytes()).hexdigest()
            shutil.copyfile(folder / name, blob)
            (snapshot / name).symlink_to(Path("..", "..", "blobs", blob.name))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
        return snapshot

    return lay


# The files that take longest (seconds of test time, junit, 2026-12-05), run first: `make test` hands whole files to
# its workers in collection order (--dist loadfile), so with these at the front the small files fill the end and the
# workers finish together, instead of one worker starting a minute-long file while the other has nothing left.
# test_gpu.py's `gpu` tests run on the CPU in make test (CAPTIONER_GPU_TEST_DEVICE=cpu): 56 s there.
LONGEST_FIRST = ("test_attention_family.py", "test_kill_resume.py", "test_scst_train.py", "test_gpu.py",
                 "test_train.py", "test_objective_contract.py", "test_bench_scale.py", "test_stop_together.py",
                 "test_notebook.py", "test_end_to_end.py", "test_serve_load.py", "test_ensemble.py", "test_amp.py",
                 "test_bench.py")


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONGEST_FIRST; the order within a file kept); tests marked ``gpu`` skip, saying so,
    on a machine without CUDA (they run wherever a GPU exists)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: every other file as collected
    import torch

    if torch.cuda.is_available() or os.environ.get("CAPTIONER_GPU_TEST_DEVICE") == "cpu":  # cpu: a dry run
        return
    skip = pytest.mark.skip(reason="needs CUDA (a `gpu` test: `make gpu-check` runs these on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
