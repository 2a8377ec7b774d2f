"""One device rule for every command (captioner/runtime.resolve_device): auto by default, said aloud, refused by name
when the machine cannot give it, and resolved once per command call (the loaders take the command's torch.device as
it is); under torchrun each process on its own GPU; RNG state per local device."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from captioner import runtime
from captioner.runtime import DeviceError, resolve_device

REPO = Path(__file__).resolve().parent.parent
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without CUDA")


@pytest.fixture(autouse=True)
def plain_auto(monkeypatch):
    """"auto" as a user gets it (the suite's conftest makes it mean the CPU; test_the_suite_... checks that)."""
    monkeypatch.delenv(runtime.AUTO_DEVICE_ENV, raising=False)


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with two CUDA devices, as far as the device rule can tell (it asks only these two functions)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_the_suite_means_the_cpu_by_auto_even_where_a_gpu_is(two_gpus, monkeypatch):
    monkeypatch.setenv(runtime.AUTO_DEVICE_ENV, "cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)  # a named device is not touched
    assert "CAPTIONER_AUTO_DEVICE=cpu" in runtime.describe_device(torch.device("cpu"), "auto")


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert "no CUDA" in runtime.describe_device(torch.device("cpu"), "auto")


def test_auto_and_cuda_take_the_local_gpu(two_gpus):
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)


def test_an_explicit_gpu_under_torchrun_is_replaced_by_local_rank_saying_so(two_gpus):
    with pytest.warns(UserWarning, match=r"train.device=cuda:0 under torchrun.*LOCAL_RANK 1\) uses cuda:1"):
        assert resolve_device("cuda:0", "train.device", local_rank=1) == torch.device("cuda", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the matching GPU says nothing
        assert resolve_device("cuda:1", local_rank=1) == torch.device("cuda", 1)


def test_a_gpu_past_the_last_is_refused_naming_the_setting(two_gpus):
    with pytest.raises(DeviceError, match=r"--device=cuda:2: this machine has 2 CUDA device"):
        resolve_device("cuda:2")


def test_cuda_without_cuda_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"train.device=cuda: CUDA is not available"):
        resolve_device("cuda", "train.device")
    with pytest.raises(DeviceError, match=r"--device='tpu0': not a device"):
        resolve_device("tpu0")


@pytest.mark.parametrize("command", ["caption", "evaluate", "serve", "extract"])
def test_every_command_defaults_to_auto_and_says_so_in_help(command):
    import importlib

    module = importlib.import_module(f"captioner.commands.{command}")
    parser = module._parser()
    action = next(a for a in parser._actions if "--device" in a.option_strings)
    assert "auto" in action.help
    if command == "extract":  # its default is the config's train.device, which defaults to auto
        from captioner.config import TrainConfig

        assert action.default is None and TrainConfig().device == "auto"
    else:
        assert action.default == "auto"


def test_the_python_api_and_training_default_to_auto():
    import captioner
    from captioner import api
    from captioner.config import TrainConfig

    for fn in (captioner.load_captioner, api.load_captioner, api.load_model, api.load_model_folder,
               api.load_shipped):
        assert inspect.signature(fn).parameters["device"].default == "auto", fn
    assert TrainConfig().device == "auto"


@no_cuda
def test_evaluate_with_cuda_on_a_machine_without_it_is_refused_naming_the_flag():
    proc = subprocess.run([sys.executable, "-m", "captioner", "evaluate", "--checkpoint", "flickr8k_soft",
                           "--device", "cuda", "--max-images", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "--device=cuda: CUDA is not available" in proc.stderr


def test_caption_says_which_device_it_chose(tmp_path):
    from captioner.demo import sample_photo

    image = tmp_path / "photo.png"
    sample_photo("astronaut").save(image)
    env = {k: v for k, v in os.environ.items() if k != runtime.AUTO_DEVICE_ENV}
    proc = subprocess.run([sys.executable, "-m", "captioner", "caption", str(image), "--beam", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    expected = "device cuda" if torch.cuda.is_available() else "device cpu (asked: auto; no CUDA on this machine)"
    assert f"captioner caption: {expected}" in proc.stderr


# --------------------------------------------------------------------------- RNG state per local device


def test_rng_state_on_the_cpu_holds_no_gpu_state():
    from captioner.training.distributed import rng_state, set_rng_state

    state = rng_state(torch.device("cpu"))
    assert "cuda" not in state and "cuda_device" not in state
    expected = torch.rand(3)
    torch.manual_seed(123)
    set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)


def test_a_resume_with_fewer_gpus_visible_restores_its_own_and_never_indexes_past_them(monkeypatch):
    """Old checkpoints saved every visible GPU's state; a rank whose index is past them restores none rather than
    raising IndexError. New ones save this rank's device only, and it is restored on that device."""
    from captioner.training import distributed

    calls = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append((state, device)))
    state = distributed.rng_state(torch.device("cpu"))
    old = dict(state, cuda=[torch.zeros(4, dtype=torch.uint8)])  # saved on a 1-GPU machine
    distributed.set_rng_state(old, torch.device("cuda", 1))
    assert calls == []
    distributed.set_rng_state(old, torch.device("cuda", 0))
    assert len(calls) == 1 and calls[0][1] == torch.device("cuda", 0)
    new = dict(state, cuda_device=torch.ones(4, dtype=torch.uint8))
    distributed.set_rng_state(new, torch.device("cuda", 3))
    assert torch.equal(calls[-1][0], torch.ones(4, dtype=torch.uint8)) and calls[-1][1] == torch.device("cuda", 3)


# --------------------------------------------------------------------------- resolved once per command call


@pytest.fixture
def device_rule_calls(monkeypatch):
    """Every call of runtime.resolve_device, wherever a module imported it by name, logged as (name, setting) and
    answered by the rule itself: what proves a command resolves its device once."""
    import captioner.api  # noqa: F401  (imported before the patch, so their by-name imports are patched too)
    import captioner.commands.caption  # noqa: F401
    import captioner.commands.evaluate  # noqa: F401

    rule, calls = runtime.resolve_device, []

    def counted(name, setting="--device", local_rank=None):
        calls.append((str(name), setting))
        return rule(name, setting, local_rank)

    for module in list(sys.modules.values()):
        if module is not None and vars(module).get("resolve_device") is rule:
            monkeypatch.setattr(module, "resolve_device", counted)
    return calls


@pytest.mark.parametrize("models", [1, 2], ids=["one-model", "ensemble"])
def test_evaluate_resolves_its_device_once(smoke_checkpoint, tmp_path, monkeypatch, device_rule_calls, models):
    """--device is resolved by the command (naming the flag) and the resolved torch.device goes down to every
    loader (load_captioner, load_ensemble, load_model for each member), none of which resolves it again."""
    import captioner.commands.evaluate as evaluate

    seen = {}
    monkeypatch.setattr(evaluate, "evaluate_model", lambda model, records, options, **kw: seen.update(model=model)
                        or {"scores": {}, "n_images": len(records)})
    monkeypatch.setattr(evaluate, "format_table", lambda result, split: "")
    code = evaluate.main(["--checkpoint", *[str(smoke_checkpoint)] * models, "--device", "cpu", "--data-root",
                          str(tmp_path / "shapes"), "--split", "val", "--max-images", "1", "--no-cache",
                          "--tokenizer", "simple"])
    assert code == 0
    assert device_rule_calls == [("cpu", "--device")]
    assert seen["model"].device == torch.device("cpu")


def test_caption_resolves_its_device_once(smoke_checkpoint, tmp_path, device_rule_calls, capsys):
    from PIL import Image

    from captioner.commands.caption import main as caption

    Image.new("RGB", (64, 64), "red").save(tmp_path / "x.png")
    assert caption([str(tmp_path / "x.png"), "--model", str(smoke_checkpoint), "--device", "cpu", "--beam", "1"]) == 0
    assert device_rule_calls == [("cpu", "--device")]
    assert "captioner caption: device cpu (asked: cpu)" in capsys.readouterr().err


def test_the_python_api_resolves_a_name_once_and_takes_a_torch_device_as_resolved(smoke_checkpoint,
                                                                                     device_rule_calls):
    from captioner.api import load_captioner

    assert load_captioner(smoke_checkpoint, device="cpu").device == torch.device("cpu")
    assert device_rule_calls == [("cpu", "device")]  # named as the keyword a Python user passed
    assert load_captioner([smoke_checkpoint] * 2, device=torch.device("cpu")).device == torch.device("cpu")
    assert device_rule_calls == [("cpu", "device")]  # a torch.device is one already chosen: not resolved again


@no_cuda
def test_the_python_api_still_refuses_a_device_name_this_machine_lacks(smoke_checkpoint):
    from captioner.api import load_captioner, load_model

    for load in (load_captioner, load_model):
        for device in ("cuda", torch.device("cuda")):  # a torch.device is trusted only where the machine has it
            with pytest.raises(DeviceError, match=r"device=cuda: CUDA is not available"):
                load(smoke_checkpoint, device=device)
