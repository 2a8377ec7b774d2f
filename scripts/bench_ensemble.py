"""Decoding speed of an ensemble against one model. Run: `python scripts/bench_ensemble.py [--config F8K]
[--members 2] [--beam 3] [--repeats 5] [--json] [--quick]`.

Beam search over a batch of synthetic backbone grids at one of scripts/bench.py's CONFIGS (F8K: Flickr8k's
shape, 7x7x1280 grids, 64 images, a 2,300-word vocabulary; decoder sizes 512), exactly ``decode_length`` steps
per image (<end> masked), through ``Captioner.generate`` for one model and ``CaptionerEnsemble.generate``
(captioner/models/ensemble.py) for ``--members`` random models over the same backbone. Both include preparing
their grids (each member projects its own). The two alternate, so each pair of runs saw the same machine load;
captions/s come from the median times, and the ratio is the median of the paired time ratios (ideal: the
number of members, plus the mean's pass over the (N, V) log-probabilities and the dense log-softmax each
member pays instead of the single model's read of raw logits, search.Logits).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as scripts/bench.py: shared cores, passive OpenMP waits
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench.py's sizes
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout without install
from bench import CONFIGS, _sizes, _sync  # noqa: E402


def _models(s: dict, members: int, device: str) -> list:
    """``members`` random captioners sharing one random EfficientNet-Lite0 backbone (no weights are read), each
    with its own projection to s["feature_dim"] (when that is not the backbone's 1280) and decoder."""
    from captioner.models.captioner import Captioner
    from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
    from captioner.models.encoder import build_encoder

    models = []
    backbone = None
    for seed in range(members):
        torch.manual_seed(seed)
        encoder = build_encoder("efficientnet_lite0", pretrained=False, input_size=224,
                                grid_size=s["grid"], proj_dim=None if s["feature_dim"] == 1280 else s["feature_dim"])
        if backbone is None:
            backbone = encoder.backbone.state_dict()
        encoder.backbone.load_state_dict(backbone)
        decoder = FastShowAttendTellDecoder(s["vocab"], encoder.out_dim, embed_dim=s["embed_dim"],
                                            hidden_dim=s["hidden_dim"], attention_dim=s["attention_dim"])
        models.append(Captioner(encoder, decoder, start_id=1, end_id=2, pad_id=0, unk_id=3).to(device).eval())
    return models


def bench_ensemble(config: str = "F8K", members: int = 2, beam: int = 3, repeats: int = 5, quick: bool = False,
                   device: str = "cpu", threads: int = 2) -> dict:
    """Captions/s of one model and of an ensemble of ``members``, beam ``beam``, alternating ``repeats`` times."""
    from captioner.models.ensemble import CaptionerEnsemble

    torch.set_num_threads(threads)
    s = _sizes(config, quick)
    models = _models(s, members, device)
    single, ensemble = models[0], CaptionerEnsemble(models)
    B, n = s["batch"], s["decode_length"]
    grid = torch.randn(B, s["grid"] ** 2, models[0].encoder.backbone_dim, generator=torch.Generator().manual_seed(0))
    grid = grid.to(device)  # (B, L, D_backbone)

    def run(model) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(model.prepare_rows(grid), model.decode_options.replace_given(beam=beam, max_length=n),
                           min_length=n)
        _sync(device)
        return time.perf_counter() - start

    run(single), run(ensemble)  # warm-up: allocator, caches of packed weights
    times = {"single": [], "ensemble": []}
    for _ in range(repeats):
        times["single"].append(run(single))
        times["ensemble"].append(run(ensemble))
    return {"config": config, "members": members, "beam": beam, "images": B, "steps": n, "threads": threads,
            "single_captions_per_s": B / statistics.median(times["single"]),
            "ensemble_captions_per_s": B / statistics.median(times["ensemble"]),
            "ensemble_time_ratio": statistics.median(e / t for e, t in zip(times["ensemble"], times["single"]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="F8K", choices=tuple(CONFIGS))
    parser.add_argument("--members", type=int, default=2, help="models in the ensemble (>= 2)")
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each, alternating")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.members < 2 or args.beam < 1 or args.repeats < 1:
        parser.error("need --members >= 2, --beam >= 1 and --repeats >= 1")
    result = bench_ensemble(args.config, args.members, args.beam, args.repeats, args.quick, args.device,
                            args.threads)
    print(json.dumps(result, indent=2) if args.json else
          "\n".join(f"{k:26s} {v:.4g}" if isinstance(v, float) else f"{k:26s} {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
