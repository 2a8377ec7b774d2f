"""What the training options of issue 55 cost per training step (docs/training-options.md): the Show-Attend-Tell
decoder's cross-entropy step (forward, backward, Adam) at Flickr8k's shape, plain, with label smoothing (the fused
loss), with scheduled sampling (the plain step-by-step forward), and the Up-Down decoder's step, fast
(updown_fast.py, what `kind: updown` builds) and as its reference class (updown.py) runs it.

    python scripts/bench_options.py [--rounds 8] [--json]

Flickr8k's shape: grid 7x7, D 1280 (EfficientNet-Lite0 at 224), batch 64, captions of 14 tokens, V 2,600 (its
vocabulary at min_count 5), sizes 512, additive scorer, soft attention. The variants alternate within each round;
each variant's time is the median over rounds, and its ratio to the plain step the median of the per-round ratios
(the machine's speed drifts within minutes). The CPU's name and a float32 matmul's rate are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from captioner.config import AttentionConfig  # noqa: E402
from captioner.models.decoders import DECODERS  # noqa: E402
from captioner.models.decoders.registry import build_decoder  # noqa: E402
from captioner.models.decoders.updown import UpDownDecoder  # noqa: E402
from captioner.training.losses import soft_attention_loss  # noqa: E402
from captioner.training.provenance import cpu_model  # noqa: E402

B, L, D, T, V = 64, 49, 1280, 14, 2600


def matmul_gflops(n: int = 5) -> float:
    a, b = torch.randn(512, 2048), torch.randn(2048, 2048)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * 512 * 2048 * 2048 / statistics.median(times) / 1e9


def variant(kind: str, smoothing: float = 0.0, sample_prob: float = 0.0, as_class: type | None = None):
    """One training step's timer; ``as_class``: the built decoder run by that class of its family (the
    reference, whose state it shares)."""
    torch.manual_seed(0)
    decoder = build_decoder(DECODERS.section(kind)(), AttentionConfig(), vocab_size=V, feature_dim=D).train()
    if as_class is not None:
        decoder.__class__ = as_class
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    grid = torch.randn(B, L, D, generator=g)
    captions = torch.randint(3, V, (B, T), generator=g)
    lengths = torch.randint(8, T + 1, (B,), generator=g)
    read = {"sample_prob": sample_prob} if sample_prob else {}

    def step() -> float:
        start = time.perf_counter()
        out = decoder(grid, captions, lengths, **read)
        loss = soft_attention_loss(out, captions[:, 1:], alpha_c=0.05, label_smoothing=smoothing).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


VARIANTS = {
    "xe": lambda: variant("lstm"),
    "label_smoothing_0.1": lambda: variant("lstm", smoothing=0.1),
    "scheduled_sampling_0.25": lambda: variant("lstm", sample_prob=0.25),
    "updown": lambda: variant("updown"),
    "updown_reference": lambda: variant("updown", as_class=UpDownDecoder),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = {name: make() for name, make in VARIANTS.items()}
    for step in steps.values():  # warm-up: kernels built, caches filled
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(step())
    rows = {name: {"step_s": statistics.median(t),
                   "vs_xe": statistics.median(a / b for a, b in zip(t, times["xe"]))} for name, t in times.items()}
    result = {"cpu": cpu_model(), "threads": args.threads, "matmul_gflops": matmul_gflops(), "rounds": args.rounds,
              "shape": {"batch": B, "grid": L, "D": D, "tokens": T, "V": V}, "variants": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['cpu']}, {args.threads} threads, matmul {result['matmul_gflops']:.1f} GFLOP/s, "
          f"{args.rounds} rounds")
    for name, row in rows.items():
        print(f"{name:<26} {row['step_s'] * 1000:8.1f} ms/step   x{row['vs_xe']:.2f} of xe")


if __name__ == "__main__":
    main()
