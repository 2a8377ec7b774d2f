"""The Transformer decoder through the application, as the LSTM goes: `captioner train` on its smoke config (the
cross-entropy run, then self-critical training from it), `captioner evaluate`, `captioner caption` with overlays,
and `captioner serve`'s JSON with one overlay per word from its cross-attention."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from captioner.cli import main as cli

SMOKE_TRANSFORMER = Path(__file__).resolve().parents[1] / "configs" / "smoke_transformer.yaml"


@pytest.fixture(scope="module")
def transformer_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("transformer")
    common = ["--set", f"data.root={root / 'data'}", "--set", "train.num_threads=1", "--set", "train.tensorboard=off",
              "--set", "train.val_metric=BLEU-4"]
    assert cli(["train", "--config", str(SMOKE_TRANSFORMER), "--set", f"train.run_dir={root / 'xe'}", *common]) == 0
    # the SCST stage's own config, as the shipped *_scst.yaml are: its objective section replaces cross-entropy's
    scst_config = yaml.safe_load(SMOKE_TRANSFORMER.read_text())
    scst_config["train"]["objective"] = {"kind": "scst", "samples": 2}
    (root / "scst.yaml").write_text(yaml.safe_dump(scst_config))
    assert cli(["train", "--config", str(root / "scst.yaml"), "--set", f"train.run_dir={root / 'scst'}",
                "--set", f"train.init={root / 'xe'}", "--set", "train.epochs=1", *common]) == 0
    return root


@pytest.mark.slow
def test_transformer_trains_with_cross_entropy_then_scst(transformer_run):
    rows = {run: [json.loads(line) for line in (transformer_run / run / "metrics.jsonl").read_text().splitlines()]
            for run in ("xe", "scst")}
    assert len(rows["xe"]) == 2 and rows["xe"][1]["train_xe"] < rows["xe"][0]["train_xe"]
    assert 0.0 <= rows["scst"][0]["train_reward"] and rows["scst"][0]["train_sample_length"] > 0
    assert all((transformer_run / run / "best.pt").is_file() for run in rows)


@pytest.mark.slow
def test_transformer_evaluates_captions_and_serves(transformer_run, tmp_path, capsys):
    run = transformer_run / "xe"
    capsys.readouterr()
    assert cli(["evaluate", "--checkpoint", str(run), "--split", "val", "--beam", "2", "--no-meteor",
                "--tokenizer", "simple", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["beam_size"] == 2 and 0.0 <= result["scores"]["BLEU-1"] <= 100.0
    assert 1.0 / result["locations"] - 1e-6 <= result["alpha_max"] <= 1.0

    images = sorted((transformer_run / "data" / "images").glob("*.png"))[:2]
    out_dir = tmp_path / "overlays"
    assert cli(["caption", *map(str, images), "--checkpoint", str(run), "--beam", "2", "--allow-unk",
                "--attention-out", str(out_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] == [] and len(doc["results"]) == 2
    for r in doc["results"]:
        assert Path(r["overlay"]).stat().st_size > 1000 and r["grid_hw"]

    pytest.importorskip("fastapi", reason="captioner serve needs the 'serve' extra")
    from fastapi.testclient import TestClient

    from captioner.api import load_captioner
    from captioner.serving.server import create_app, page_options

    model = load_captioner(run)
    assert type(model.decoder).__name__ == "TransformerDecoder"
    buffer = io.BytesIO()
    Image.open(images[0]).save(buffer, format="PNG")
    # base_url: the Host check
    client = TestClient(create_app(model, page_options(model, beam=2, forbid_unk=False)), base_url="http://127.0.0.1")
    response = client.post("/api/caption", files={"image": ("shape.png", buffer.getvalue(), "image/png")})
    assert response.status_code == 200, response.text
    out = response.json()
    assert len(out["overlays"]) == len(out["words"]) and out["cells"] is None
    assert "multi_head attention" in client.get("/").text
