"""8-bit weights with group-wise scales (captioner/store/quantize.py) and model folders written with them
(`captioner export --dtype int8`, what the shipped models use): the rounding is bounded by half a step of each
group, the file holds int8 matrices, float16 vectors and their scales, it reads back as float32 into a model that
captions, and the loading refusals (digest, shapes, damaged scales) hold as they do for float weights."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from captioner.api import load_captioner
from captioner.cli import main as cli_main
from captioner.store import quantize
from captioner.store.hub import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, ModelFolderError, sha256_of


@pytest.mark.parametrize("shape,group", [((7, 64), 64), ((5, 100), 32), ((2, 3, 130), 64), ((4, 10), 64)])
def test_each_entry_rounds_to_within_half_a_step_of_its_group(shape, group):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * torch.logspace(-3, 1, shape[-1])  # (…, C): magnitudes differ along a row
    q, scale = quantize.quantize(x, group)
    rows = math.prod(shape[:-1])
    assert q.dtype == torch.int8 and q.shape == x.shape and int(q.abs().max()) <= 127
    assert scale.dtype == torch.float16 and scale.shape == (rows, math.ceil(shape[-1] / group))
    back = quantize.dequantize(q, scale, group)
    assert back.dtype == torch.float32 and back.shape == x.shape
    step = scale.float().repeat_interleave(group, dim=1)[:, : shape[-1]].reshape(shape)  # each entry's group's step
    assert bool(((back - x).abs() <= step / 2 + 1e-7).all())
    # the group's largest entry is kept to the float16 rounding of its scale: finer groups, finer steps
    coarse = quantize.dequantize(*quantize.quantize(x, shape[-1]), shape[-1])
    assert float((back - x).square().sum()) <= float((coarse - x).square().sum())


def test_a_group_of_zeros_and_a_tiny_group_stay_finite():
    x = torch.zeros(2, 128)
    x[1, 64:] = 1e-9  # below float16's range: its scale rounds to 0
    q, scale = quantize.quantize(x)
    back = quantize.dequantize(q, scale)
    assert bool(torch.isfinite(back).all()) and float(back.abs().max()) <= 1e-9


def test_pack_keeps_vectors_and_integers_and_unpack_refuses_damaged_scales():
    tensors = {"w": torch.randn(8, 70), "b": torch.randn(8), "steps": torch.tensor([3, 4])}
    packed = quantize.pack(tensors, 64)
    assert packed["w"].dtype == torch.int8 and packed["w" + quantize.SCALE_SUFFIX].shape == (8, 2)
    assert packed["b"].dtype == torch.float16 and torch.equal(packed["steps"], tensors["steps"])
    back = quantize.unpack(packed, 64)
    assert back.keys() == tensors.keys() and back["w"].dtype == torch.float32
    assert float((back["w"] - tensors["w"]).abs().max()) <= float(tensors["w"].abs().max()) / 127
    with pytest.raises(ValueError, match=r"w: int8 weights without their scales \(w#scale\)"):
        quantize.unpack({k: v for k, v in packed.items() if k != "w" + quantize.SCALE_SUFFIX}, 64)
    with pytest.raises(ValueError, match="w#scale: scales without an int8 tensor"):
        quantize.unpack({**packed, "w": tensors["w"]}, 64)
    with pytest.raises(ValueError, match=r"w: scales of shape \(8, 2\) do not fit"):
        quantize.unpack(packed, 32)


@pytest.fixture(scope="module")
def int8_folder(smoke_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "tiny-int8"
    assert cli_main(["export", "--checkpoint", str(smoke_checkpoint), str(out), "--dtype", "int8"]) == 0
    return out


def test_an_int8_folder_reads_back_as_float32_and_captions_as_the_original_nearly_does(int8_folder, smoke_checkpoint):
    original = load_captioner(smoke_checkpoint)
    model = load_captioner(int8_folder)
    meta = json.loads((int8_folder / CONFIG_FILE).read_text())
    assert meta["dtype"] == "int8" and meta["quantization"] == {"bits": 8, "group": 64, "scales": "float16"}
    stored = load_file(str(int8_folder / WEIGHTS_FILE))
    own = original.state_dict()
    for key, value in own.items():
        if not value.is_floating_point():
            continue
        assert model.state_dict()[key].dtype == torch.float32, key
        if value.dim() >= 2 and not key.startswith("encoder.backbone."):
            assert stored[key].dtype == torch.int8, key
            step = float(value.abs().max()) / 127  # no group's step is larger
            assert float((model.state_dict()[key] - value).abs().max()) <= step / 2 * 1.01, key
        else:  # vectors and the random backbone that travels in the file (its digest is of the float16 weights)
            assert stored[key].dtype == torch.float16, key
    assert meta["parameters"] == sum(v.numel() for k, v in stored.items() if not k.endswith(quantize.SCALE_SUFFIX))
    # near-identical weights: the same greedy words for most images (a random tiny model's near-ties may flip)
    g = torch.Generator().manual_seed(1)
    images = [Image.fromarray((torch.rand(64, 64, 3, generator=g) * 255).byte().numpy()) for _ in range(6)]
    want = [r["caption"] for r in original.caption(images, beam=1)]
    got = [r["caption"] for r in model.caption(images, beam=1)]
    assert sum(a == b for a, b in zip(want, got)) >= len(want) - 1


def test_the_card_names_the_group_size_the_weights_were_written_with(int8_folder, smoke_checkpoint, tmp_path):
    """The card's first paragraph states the entries per scale: 64 by default, 32 when asked (it said 64 for both)."""
    assert "a float16 scale per 64 entries of a row" in (int8_folder / CARD_FILE).read_text()
    out = tmp_path / "tiny-int8-32"
    assert cli_main(["export", "--checkpoint", str(smoke_checkpoint), str(out), "--dtype", "int8",
                     "--group", "32"]) == 0
    assert json.loads((out / CONFIG_FILE).read_text())["quantization"]["group"] == 32
    card = (out / CARD_FILE).read_text()
    assert "a float16 scale per 32 entries of a row" in card and "per 64 entries" not in card


def test_an_int8_folder_with_altered_scales_is_refused_by_name(int8_folder, tmp_path):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(int8_folder, damaged)
    weights = damaged / WEIGHTS_FILE
    tensors = load_file(str(weights))
    key = next(k for k in tensors if k.endswith(quantize.SCALE_SUFFIX))
    tensors[key] = tensors[key][:, :1].contiguous()  # scales of another shape
    save_file(tensors, str(weights), metadata={"format": "captioner-model"})
    with pytest.raises(ModelFolderError, match="SHA-256 .* differs"):  # the digest refuses it first
        load_captioner(damaged)
    meta = json.loads((damaged / CONFIG_FILE).read_text())
    meta["weights_sha256"] = sha256_of(weights)  # a consistent but damaged folder: the scales themselves refuse it
    (damaged / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ModelFolderError, match=f"{weights}: damaged int8 weights: {key.removesuffix('#scale')}"):
        load_captioner(damaged)
