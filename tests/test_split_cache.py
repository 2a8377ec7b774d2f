"""Fine-tuning the encoder's top on cached activations (model.encoder.finetune_blocks with data.use_cache): the
split cache's rows and keys, its fingerprint and refusal, mirrored activations, frozen batch-norm statistics,
and a fine-tuned model that captions raw photos through the same grid as training saw."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from captioner.config import ConfigError, load_config
from captioner.data.datasets import mirrored_records
from captioner.data.features import FeatureCache, FeatureCacheError, extract_features
from captioner.data.images import load_image
from captioner.models.encoder import build_encoder
from tests.test_features import make_images
from tests.test_mirror import _record

torch.set_num_threads(1)
SIZE = 64  # efficientnet_lite0 at 64 px: a 2 x 2 grid; the cached activations below the conv head are 2 x 2 x 320
REPO = Path(__file__).resolve().parents[1]


def _encoder(finetune_blocks: int, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return build_encoder("efficientnet_lite0", pretrained=False, input_size=SIZE, finetune_blocks=finetune_blocks,
                         **kwargs)


def _perturb(module: nn.Module) -> None:
    with torch.no_grad():
        next(module.parameters()).add_(0.5)


@pytest.mark.parametrize("blocks, cached_dim", [(1, 320), (2, 192), (3, 192)])
def test_bottom_then_top_is_the_whole_backbone(blocks, cached_dim):
    encoder = _encoder(blocks).eval()
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        rows = encoder.cache_features(x)  # (B, l, C)
        grid = encoder.finish(rows)
        whole = encoder.backbone_features(x)
    assert encoder.splits and encoder.cache_shape == (2, 2, cached_dim)
    assert rows.shape == (2, 4, cached_dim)
    assert grid.shape == whole.shape == (2, 4, 1280)
    torch.testing.assert_close(grid, whole)


def test_a_frozen_encoder_caches_its_grid_and_finishes_nothing():
    encoder = _encoder(0).eval()
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        rows = encoder.cache_features(x)
    torch.testing.assert_close(rows, encoder.backbone_features(x))
    assert encoder.finish(rows) is rows
    assert encoder.cache_fingerprint() == encoder.fingerprint() and "split" not in encoder.cache_fingerprint()


def test_cache_fingerprint_names_the_split_and_the_bottom_weights_only():
    encoder = _encoder(2)
    fp = encoder.cache_fingerprint()
    assert fp["split"] == {"finetune_blocks": 2, "cached_hw": [2, 2], "cached_dim": 192}
    assert fp["weights_sha256"] != encoder.fingerprint()["weights_sha256"]
    _perturb(encoder._top[-1])  # the trained top changes as it trains: the cache stays valid
    assert encoder.cache_fingerprint() == fp
    _perturb(encoder._bottom[-1])  # another bottom: other activations
    assert encoder.cache_fingerprint()["weights_sha256"] != fp["weights_sha256"]
    assert _encoder(1).cache_fingerprint()["split"]["finetune_blocks"] == 1
    assert _encoder(1).cache_fingerprint() != _encoder(2).cache_fingerprint()


def test_split_cache_rows_keys_and_the_refusal_of_another_split(tmp_path):
    encoder = _encoder(1)
    images = make_images(tmp_path / "images", 3)
    records = [_record(i, r.path) for i, r in enumerate(images)]
    cache = extract_features(encoder, records, tmp_path / "cache", batch_size=2, num_workers=0, progress=False)
    assert set(cache.rows) == {"id0", "id1", "id2"}
    assert cache.shape == (3, 4, 320) and cache.grid_hw == (2, 2)
    assert cache.fingerprint == encoder.cache_fingerprint()
    x = torch.stack([encoder.transform(load_image(r.path)) for r in records])  # (3, 3, S, S)
    with torch.no_grad():
        expected = encoder.cache_features(x).numpy()  # (3, 4, 320)
    np.testing.assert_allclose(cache.get_batch(["id0", "id1", "id2"]).astype(np.float32), expected,
                               rtol=2e-3, atol=2e-3)
    with pytest.raises(FeatureCacheError, match="different encoder.*split"):
        FeatureCache.open(tmp_path / "cache", expected_fingerprint=_encoder(2).cache_fingerprint())
    with pytest.raises(FeatureCacheError, match="different encoder.*weights_sha256"):
        other = _encoder(1, seed=1)
        FeatureCache.open(tmp_path / "cache", expected_fingerprint=other.cache_fingerprint())


def test_mirrored_rows_are_the_activations_of_the_flipped_photo(tmp_path):
    """A mirrored copy's row is the bottom's activations of the flipped photo, which are not the original's
    activations flipped (convolutions are not mirror-symmetric)."""
    encoder = _encoder(2)
    images = make_images(tmp_path / "images", 2)
    originals = [_record(i, r.path) for i, r in enumerate(images)]
    cache = extract_features(encoder, originals + mirrored_records(originals), tmp_path / "cache", batch_size=2,
                             num_workers=0, progress=False)
    x = torch.stack([encoder.transform(load_image(r.path)) for r in originals])
    with torch.no_grad():
        flipped_photo = encoder.cache_features(x.flip(-1)).numpy()  # (2, 4, 192)
        original = encoder.cache_features(x)
    flipped_rows = original.view(2, 2, 2, 192).flip(2).reshape(2, 4, 192).numpy()  # the original's rows mirrored
    for i in range(2):
        got = cache.get(f"id{i}#mirror").astype(np.float32)
        np.testing.assert_allclose(got, flipped_photo[i], rtol=2e-3, atol=2e-3)
        assert not np.allclose(got, flipped_rows[i], atol=1e-2)


def _batch_norms(encoder) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for link in encoder._top for m in link.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def test_batch_norm_statistics_stay_frozen_unless_a_setting_says_otherwise():
    x = torch.randn(4, 3, SIZE, SIZE) * 3
    for update, changes in ((False, False), (True, True)):
        encoder = _encoder(2, update_bn_stats=update).train()
        norms = _batch_norms(encoder)
        assert norms and all(m.training is update for m in norms)
        before = [m.running_mean.clone() for m in norms]
        encoder.finish(encoder.cache_features(x)).sum().backward()
        assert any(not torch.equal(b, m.running_mean) for b, m in zip(before, norms)) is changes
        assert all(p.grad is not None for p in encoder.trainable_parameters())  # the affine weights train anyway
    with pytest.raises(ValueError, match="update_bn_stats=True needs finetune_blocks > 0"):
        _encoder(0, update_bn_stats=True)
    with pytest.raises(ConfigError, match="model.encoder.update_bn_stats"):
        load_config(REPO / "configs" / "smoke.yaml", ["model.encoder.update_bn_stats=true"])


def test_a_backbone_that_is_no_chain_refuses_the_split_cache():
    encoder = build_encoder("timm:resnet18", pretrained=False, input_size=SIZE, finetune_blocks=1)
    assert not encoder.splits
    with pytest.raises(ValueError, match="data.use_cache=false"):
        encoder.cache_features(torch.zeros(1, 3, SIZE, SIZE))


@pytest.mark.slow
def test_a_fine_tuned_model_captions_raw_photos_through_the_grid_it_trained_on(tmp_path):
    """A frozen smoke model starts one whose conv head fine-tunes on cached activations (train.init may differ in
    finetune_blocks): the top's weights move, the bottom's do not, the checkpoint and its exported folder hold
    them, and a raw photo's grid through `encode` equals the grid training built from the cached row (up to the
    cache's float16)."""
    from captioner.api import export_model, load_captioner
    from captioner.data.datasets import load_records
    from captioner.training.loop import train

    common = [f"data.root={tmp_path / 'data'}", "train.num_threads=1", "train.tensorboard_images=0", "train.epochs=1"]
    smoke = REPO / "configs" / "smoke.yaml"
    frozen = load_captioner(train(load_config(smoke, common + [f"train.run_dir={tmp_path / 'frozen'}"])))
    cfg = load_config(smoke, common + [f"train.run_dir={tmp_path / 'tuned'}", f"train.init={tmp_path / 'frozen'}",
                                       "model.encoder.finetune_blocks=1", "train.encoder_lr=0.01"])
    run_dir = train(cfg)
    model = load_captioner(run_dir)
    before = frozen.encoder.backbone.state_dict()
    moved = {name for name, t in model.encoder.backbone.state_dict().items() if not torch.equal(t, before[name])}
    # the conv head (stage 5: conv, batch norm) trained, its batch norm's statistics stayed; nothing below it moved
    assert moved == {"stages.5.0.0.weight", "stages.5.0.1.weight", "stages.5.0.1.bias"}

    record = load_records(cfg.data, "val")[0]
    caches = {d.name: d for d in (tmp_path / "data" / "features").iterdir()}
    assert len(caches) == 2  # the frozen run's grids, the fine-tuned run's activations below the conv head
    fingerprint = model.encoder.cache_fingerprint()
    cache = next(FeatureCache.open(d) for d in caches.values() if FeatureCache.open(d).fingerprint == fingerprint)
    assert cache.dim == 320
    with torch.no_grad():
        trained_on = model.prepare_rows(torch.from_numpy(cache.get(record.image_id)).float()[None])
        raw = model.encode(model.transform(load_image(record.path))[None])
    torch.testing.assert_close(raw, trained_on, rtol=1e-2, atol=1e-2)

    folder = export_model(run_dir, tmp_path / "folder", dtype="float32")
    exported = load_captioner(folder)
    torch.testing.assert_close(_first_weight(exported.encoder._top[0]), _first_weight(model.encoder._top[0]))
    image = str(record.path)
    assert exported.caption([image], beam=2)[0]["caption"] == model.caption([image], beam=2)[0]["caption"]


def _first_weight(module: nn.Module) -> torch.Tensor:
    return next(module.parameters()).detach().clone()
