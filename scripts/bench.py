"""Benchmarks of the captioner's hot paths. Run: `python scripts/bench.py [--json] [--only train,decode,extract]`.

train / decode: the Show-Attend-Tell decoder (Xu et al. 2015 Eq. (1)-(7)) at two reference configurations,
R7 (grid 7x7, D 1280: EfficientNet-Lite0 at 224) and R14 (14x14, D 2048: ResNet-101), batch 32, sizes 512,
V 10,000, captions of 22 tokens, additive scorer; soft attention, and hard attention in "sample" mode.
Training = forward + backward + Adam step, each configuration in a fresh process so its peak RSS is its own;
decoding = greedy and beam 3 / 5 over 32 images together, exactly 20 steps (<end> masked). matmul_gflops (a
float32 512x2048 @ 2048x2048 mm, same run and threads) turns the model's useful FLOPs into a fraction:
train_frac_of_matmul against the reading taken at the start of the run, train_frac_of_matmul_paired against
the same product timed between the training steps (the median of the per-step fractions; the machine's
speed drifts by tens of percent within minutes, so this one compares a step with the rate of its moment).
Both also run the plain per-step implementation of scripts/baseline.py, alternating with this project's
steps or decodes, and report the median paired ratio (*_speedup_vs_baseline) and its own figures.
`--configs R7,F8K` runs train and decode at a subset of CONFIGS (R7, R14, and F8K: Flickr8k's shape).

extract: images per second from JPEG files on disk to cached backbone grids (the feature cache of
captioner/data/features.py, Xu et al. 2015 Sec. 3.1.1 annotation vectors), the optimised path
(DataLoader workers decoding in parallel, channels_last, inference_mode) against plain eager float32 NCHW
inference that decodes images one by one in the main process. Both use 2 intra-op threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

# Set before torch starts OpenMP (workers inherit it). On these shared cores, threads that spin
# while a sibling is descheduled stretch every op to a scheduler tick: soft training at R7 measured
# 9.5 s/step with the default (active) waiting under load, 1.0 s passive, 0.9 s with one thread.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout without install
from captioner.runtime import keep_freed_memory  # noqa: E402

keep_freed_memory()  # as the `captioner` command does (captioner/runtime.py)


def _write_jpegs(folder: Path, n: int, size: int = 224, seed: int = 0) -> list:
    from PIL import Image

    from captioner.data.datasets import ImageRecord

    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        path = folder / f"{i:04d}.jpg"
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path, quality=90)
        records.append(ImageRecord(image_id=str(i), path=path, captions=[], raw=[], objects=[]))
    return records


def bench_extract(n_images: int = 64, batch_size: int = 32, num_workers: int = 2, threads: int = 2,
                  encoder_name: str = "efficientnet_lite0", amp: bool = False, repeats: int = 2) -> dict:
    """Images/s to the feature cache: optimised extract_features vs a plain serial float32 NCHW loop.

    The two alternate ``repeats`` times and the best time of each counts (a shared machine is noisy).
    Keys: extract_img_per_s, extract_plain_img_per_s, extract_speedup, extract_with_setup_img_per_s (the
    once-per-cache fingerprint hashing and file creation included), extract_max_abs_diff (fp16 cache vs plain
    float32), and with ``amp`` extract_amp_img_per_s / extract_amp_rel_err (bf16 on CPU, fp16 on CUDA).
    """
    from captioner.data.features import extract_features
    from captioner.data.images import load_image
    from captioner.models.encoder import build_encoder

    torch.set_num_threads(threads)
    plain, fast = build_encoder(encoder_name).eval(), build_encoder(encoder_name)
    times: dict[str, list[float]] = {"plain": [], "fast": [], "setup": [], "amp": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        records = _write_jpegs(tmp, n_images)
        ids = [r.image_id for r in records]
        for rep in range(repeats):
            # plain: what a first script does: decode serially in this process, NCHW float32, eager, no_grad
            start = time.perf_counter()
            plain_rows = []
            with torch.no_grad():
                for i in range(0, n_images, batch_size):
                    x = torch.stack([plain.transform(load_image(r.path)) for r in records[i:i + batch_size]])
                    plain_rows.append(plain.backbone_features(x).half().numpy())  # (B, L, D)
            times["plain"].append(time.perf_counter() - start)
            reference = np.concatenate(plain_rows).astype(np.float32)  # (N, L, D)

            start = time.perf_counter()
            cache = extract_features(fast, records, tmp / f"cache{rep}", batch_size=batch_size,
                                     num_workers=num_workers, progress=False)
            times["setup"].append(time.perf_counter() - start)
            # the loop (DataLoader worker start-up included), without the once-per-cache set-up that the
            # plain loop does not do at all
            times["fast"].append(cache.stats["seconds"])
            max_diff = float(np.abs(cache.get_batch(ids).astype(np.float32) - reference).max())
            if amp:  # reduced precision: a separate, opt-in number
                cache = extract_features(fast, records, tmp / f"cache_amp{rep}", batch_size=batch_size,
                                         num_workers=num_workers, progress=False, amp=True)
                times["amp"].append(cache.stats["seconds"])
                amp_err = float(np.abs(cache.get_batch(ids).astype(np.float32) - reference).mean()
                                / np.abs(reference).mean())
    best = {k: min(v) for k, v in times.items() if v}
    result = {"extract_img_per_s": n_images / best["fast"], "extract_plain_img_per_s": n_images / best["plain"],
              "extract_speedup": best["plain"] / best["fast"],
              "extract_with_setup_img_per_s": n_images / best["setup"], "extract_max_abs_diff": max_diff}
    if amp:
        result.update(extract_amp_img_per_s=n_images / best["amp"], extract_amp_rel_err=amp_err)
    result.update(n_images=n_images, threads=threads, num_workers=num_workers, repeats=repeats,
                  encoder=encoder_name)
    return result



# ---------------------------------------------------------------------------------------
# decoder training and decoding (perf engineer): two reference configurations, synthetic inputs

# Reference configurations of the performance issue: R7 = EfficientNet-Lite0 at 224 (grid 7x7, D 1280),
# R14 = ResNet-101 as the popular PyTorch port uses it (grid 14x14, D 2048).
CONFIGS = {
    "R7": dict(grid=7, feature_dim=1280),
    "R14": dict(grid=14, feature_dim=2048),
    # Flickr8k's shape (configs/flickr8k_soft.yaml): EfficientNet-Lite0 7x7x1280 grids, batch 64, a 2,300-word
    # vocabulary (the figure for the port's run), caption lengths drawn from FLICKR8K_LENGTHS.
    "F8K": dict(grid=7, feature_dim=1280, vocab=2300, batch=64, lengths="flickr8k"),
}
# Words per caption (captions clipped at 30 words, as data.max_length does) -> number of captions, counted over
# the 30,000 training captions of Flickr8k's Karpathy split (data/flickr8k/dataset_flickr8k.json, the "tokens"
# field, split "train"); mean 10.8 words. A caption of n words has n + 2 tokens with <start> and <end>.
FLICKR8K_LENGTHS = {2: 15, 3: 126, 4: 346, 5: 862, 6: 1958, 7: 2537, 8: 2929, 9: 3318, 10: 3320, 11: 3131,
                    12: 2777, 13: 2321, 14: 1848, 15: 1329, 16: 976, 17: 662, 18: 513, 19: 365, 20: 204,
                    21: 136, 22: 110, 23: 74, 24: 52, 25: 33, 26: 20, 27: 11, 28: 7, 29: 9, 30: 11}
# Shared by both configurations (the sizes); --quick replaces them with tiny ones for tests.
SIZES = dict(batch=32, embed_dim=512, attention_dim=512, hidden_dim=512, vocab=10_000, tokens=22,
             decode_length=20, train_steps=8, warmup_steps=3, decode_repeats=3)
QUICK = dict(batch=4, embed_dim=16, attention_dim=16, hidden_dim=16, vocab=50, tokens=6,
             decode_length=4, train_steps=2, warmup_steps=1, decode_repeats=1, grid=2, feature_dim=24)


def _sizes(config: str, quick: bool) -> dict:
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}; valid: {', '.join(CONFIGS)}")
    return {**SIZES, **CONFIGS[config], **(QUICK if quick else {})}


def _caption_lengths(s: dict, generator: torch.Generator) -> torch.Tensor:
    """(B,) tokens per caption: all s["tokens"], or drawn from Flickr8k's histogram (<start> and <end> added)."""
    B = s["batch"]
    if s.get("lengths") != "flickr8k":
        return torch.full((B,), s["tokens"])
    words = torch.tensor(list(FLICKR8K_LENGTHS))
    counts = torch.tensor(list(FLICKR8K_LENGTHS.values()), dtype=torch.float)
    drawn = words[torch.multinomial(counts, B, replacement=True, generator=generator)] + 2
    return drawn


def _build_decoder(s: dict, attention: str, device: str):
    from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder

    torch.manual_seed(0)
    return FastShowAttendTellDecoder(s["vocab"], s["feature_dim"], embed_dim=s["embed_dim"], hidden_dim=s["hidden_dim"],
                                 attention_dim=s["attention_dim"], scorer="additive", attention=attention,
                                 dropout=0.5).to(device)


def _build_baseline(s: dict, device: str):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from baseline import PlainDecoder

    torch.manual_seed(0)
    return PlainDecoder(s["vocab"], s["feature_dim"], embed_dim=s["embed_dim"], hidden_dim=s["hidden_dim"],
                        attention_dim=s["attention_dim"], dropout=0.5).to(device)


def _synthetic_batch(s: dict, device: str, seed: int = 0):
    """Grid (B, L, D) and captions (B, T) <start> w_1 .. w_n <end> <pad> ...: every caption has s["tokens"]
    tokens, or (F8K) lengths drawn from Flickr8k's, T the longest."""
    g = torch.Generator().manual_seed(seed)
    B, L = s["batch"], s["grid"] ** 2
    lengths = _caption_lengths(s, g)  # (B,)
    T = int(lengths.max())
    grid = torch.randn(B, L, s["feature_dim"], generator=g)  # (B, L, D)
    captions = torch.randint(4, s["vocab"], (B, T), generator=g)  # (B, T); ids 0-3 are specials
    captions[:, 0] = 1  # <start>
    captions[torch.arange(B), lengths - 1] = 2  # <end>
    captions[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # <pad>
    return grid.to(device), captions.to(device), lengths.to(device)


def caption_train_flops(decoder: torch.nn.Module, grid_locations: int, steps: int, soft: bool = True) -> float:
    """Useful FLOPs to train on one caption (forward + backward = 3x forward), counted from the model's shapes.

    Linear and LSTMCell modules cost 2 * in * out per row. Once per image (the keys are projected once, not
    per word): f_init,h / f_init,c (one row) and the scorer's key projection (L rows). Per word: every other
    Linear and the LSTMCell (one row), the scorer's v (L rows), and for soft attention the context
    sum_i alpha_i a_i (2 * L * D). Elementwise ops (tanh, softmax, gates) are not counted.
    """
    per_image_rows = {"init_h.0": 1, "init_c.0": 1, "attention.scorer.key_proj": grid_locations}
    per_step_rows = {"attention.scorer.v": grid_locations}
    per_image = per_step = 0.0
    for name, module in decoder.named_modules():
        if isinstance(module, torch.nn.Linear):
            flops = 2.0 * module.in_features * module.out_features
        elif isinstance(module, torch.nn.LSTMCell):
            flops = 2.0 * (module.input_size + module.hidden_size) * 4 * module.hidden_size
        else:
            continue
        if name in per_image_rows:
            per_image += flops * per_image_rows[name]
        else:
            per_step += flops * per_step_rows.get(name, 1)
    if soft:
        per_step += 2.0 * grid_locations * decoder.attention.out_dim  # (1, L) @ (L, D)
    return 3.0 * (per_image + steps * per_step)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _train_worker(config: str, attentions: list[str], quick: bool, device: str, threads: int, amp: bool) -> dict:
    """Timed training steps (forward + backward + Adam) of one configuration; run in a fresh process.

    With several attention kinds their steps alternate (soft, hard, soft, ...), so their time ratio
    is measured under the same machine load; the peak RSS is then the sum of both models, so it is
    reported only for a single kind. Returns {kind: {...}}.
    """
    import resource

    from captioner.training.losses import hard_attention_loss, soft_attention_loss
    from captioner.training.optim import build_optimizer

    torch.set_num_threads(threads)
    s = _sizes(config, quick)
    grid, captions, lengths = _synthetic_batch(s, device)
    targets = captions[:, 1:]  # (B, T-1)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=amp)
    models = {}
    for kind in attentions:
        if kind == "baseline":  # the plain per-step implementation (scripts/baseline.py), plain Adam
            decoder = _build_baseline(s, device).train()
            models[kind] = (decoder, torch.optim.Adam(decoder.parameters(), lr=1e-4))
            continue
        decoder = _build_decoder(s, kind, device).train()
        models[kind] = (decoder, build_optimizer("adam", decoder.parameters(), lr=1e-4))
    times: dict[str, list[float]] = {kind: [] for kind in attentions}
    matmul = _Matmul(device)
    rates: list[float] = []  # the matmul rate measured right after each timed round of steps
    for i in range(s["warmup_steps"] + s["train_steps"]):
        if i >= s["warmup_steps"]:
            rates.append(matmul.gflops())
        for kind, (decoder, optimizer) in models.items():
            _sync(device)
            start = time.perf_counter()
            with autocast:
                if kind == "baseline":
                    loss = decoder.loss(grid, captions, lengths)
                elif kind == "hard":  # REINFORCE in "sample" mode; a fixed baseline keeps every step's work equal
                    out = decoder(grid, captions, lengths, attention_mode="sample")
                    loss = hard_attention_loss(out, targets, baseline=0.0).loss
                else:
                    loss = soft_attention_loss(decoder(grid, captions, lengths), targets).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            _sync(device)
            if i >= s["warmup_steps"]:
                times[kind].append(time.perf_counter() - start)
    result = {}
    for kind, (decoder, _) in models.items():
        step_s = statistics.median(times[kind])
        result[kind] = {"train_caps_per_s": s["batch"] / step_s, "train_step_s": step_s}
        if kind != "baseline":
            steps = float(lengths.float().mean()) - 1  # words predicted per caption (all s["tokens"] - 1 but F8K)
            flops = caption_train_flops(decoder, s["grid"] ** 2, steps, soft=kind != "hard")
            result[kind]["train_useful_gflop_per_caption"] = flops / 1e9
            # the step's useful FLOP rate against the matmul rate measured beside it (not minutes earlier)
            result[kind]["train_frac_of_matmul_paired"] = statistics.median(
                flops * s["batch"] / t / 1e9 / rate for t, rate in zip(times[kind], rates))
            result[kind]["matmul_gflops_alongside"] = statistics.median(rates)
        if len(models) == 1:
            result[kind]["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            if device.startswith("cuda"):
                result[kind]["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if "hard" in times and "soft" in times:
        result["hard"]["hard_soft_time_ratio"] = _paired_ratio(times["hard"], times["soft"])
    if "baseline" in times and "soft" in times:
        result["soft"]["train_speedup_vs_baseline"] = _paired_ratio(times["baseline"], times["soft"])
    return result


def _paired_ratio(times: list[float], reference: list[float]) -> float:
    """Median of times[i] / reference[i]: runs made in alternation, so each pair saw the same machine load."""
    return statistics.median(t / r for t, r in zip(times, reference))


def bench_train_one(config: str, attentions: tuple[str, ...] = ("soft",), quick: bool = False, device: str = "cpu",
                    threads: int = 2, amp: bool = False) -> dict:
    """Run _train_worker in a fresh interpreter so its peak RSS is this configuration's alone."""
    spec = json.dumps(dict(config=config, attentions=list(attentions), quick=quick, device=device,
                           threads=threads, amp=amp))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--train-worker", spec],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"training worker for {config}/{attentions} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_decode_one(config: str, quick: bool = False, device: str = "cpu", threads: int = 2,
                     amp: bool = False, beams: tuple[int, ...] = (1, 3, 5), with_baseline: bool = True) -> dict:
    """Images/s of greedy and beam search, all images decoded together, exactly decode_length steps each;
    with_baseline: also the plain implementation's (scripts/baseline.py: one image at a time), the two
    alternating, and the median of the paired time ratios."""
    from captioner.decoding.options import DecodeOptions
    from captioner.decoding.search import search

    torch.set_num_threads(threads)
    s = _sizes(config, quick)
    decoder = _build_decoder(s, "soft", device).eval()
    grid, _, _ = _synthetic_batch(s, device)
    B, n = s["batch"], s["decode_length"]
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=amp)

    def step(tokens, state):  # what Captioner.generate hands the searches
        log_probs, alpha, location, state = decoder.step_with_location(tokens, state, dense=False)
        return log_probs, (alpha, location), state

    def run(beam: int, length: int) -> None:
        with torch.inference_mode(), autocast:
            state = decoder.init_state(grid)
            # min_length = max_length masks <end>: every run makes the same `length` step calls.
            # greedy for a beam of one, else the K beams of an image share its attention memory (not copied K times)
            search(step, state, DecodeOptions(beam=beam, max_length=length), batch_size=B, start_id=1, end_id=2,
                   min_length=length, forbid_ids=(0, 1), expand=decoder.expand_state)
        _sync(device)

    baseline = _build_baseline(s, device).eval() if with_baseline else None

    def run_baseline(beam: int, length: int) -> None:
        baseline.beam_search(grid, beam, start_id=1, length=length)

    runs = {"": run} if baseline is None else {"": run, "baseline_": run_baseline}
    result = {}
    for beam in beams:
        key = "greedy_img_per_s" if beam == 1 else f"beam{beam}_img_per_s"
        for fn in runs.values():
            fn(beam, 2)  # warm-up: allocator and kernels at this beam's batch size
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(s["decode_repeats"]):  # the two alternate: each pair of runs saw the same machine load
            for name, fn in runs.items():
                start = time.perf_counter()
                fn(beam, n)
                times[name].append(time.perf_counter() - start)
        for name in runs:
            result[name + key] = B / min(times[name])  # best of the repeats: the machine is shared
        if baseline is not None:
            result[f"{key.replace('_img_per_s', '')}_speedup_vs_baseline"] = _paired_ratio(times["baseline_"],
                                                                                             times[""])
    return result


def bench_matmul(threads: int = 2, device: str = "cpu", repeats: int = 10) -> dict:
    """float32 torch.mm of (512, 2048) @ (2048, 2048): the machine's dense-matmul rate, same run and threads."""
    torch.set_num_threads(threads)
    matmul = _Matmul(device, repeats)
    for _ in range(2):  # three warm-up products in all
        torch.mm(matmul.a, matmul.b)
    return {"matmul_gflops": matmul.gflops()}


class _Matmul:
    """bench_matmul's float32 512x2048 @ 2048x2048 product, kept ready to be timed between training steps."""

    def __init__(self, device: str, repeats: int = 2) -> None:
        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(512, 2048, generator=g).to(device)
        self.b = torch.randn(2048, 2048, generator=g).to(device)
        self.device, self.repeats = device, repeats
        torch.mm(self.a, self.b)

    def gflops(self) -> float:
        best = math.inf
        for _ in range(self.repeats):
            _sync(self.device)
            start = time.perf_counter()
            torch.mm(self.a, self.b)
            _sync(self.device)
            best = min(best, time.perf_counter() - start)
        return 2 * 512 * 2048 * 2048 / best / 1e9


def _check_configs(configs: Sequence[str] | None) -> list[str]:
    """The configurations to run (None: all of CONFIGS); an unknown name is an error naming the valid ones."""
    configs = list(CONFIGS) if configs is None else list(configs)
    for config in configs:
        if config not in CONFIGS:
            raise ValueError(f"unknown configuration {config!r}; valid: {', '.join(CONFIGS)}")
    return configs


def bench_train(quick: bool = False, device: str = "cpu", threads: int = 2, amp: bool = False,
                configs: Sequence[str] | None = None) -> dict:
    """Per configuration (all of CONFIGS unless ``configs`` names some): soft training alone (R7, R14 keys:
    speed and peak RSS), then hard-attention "sample" training alternating with soft steps (R7_hard, R14_hard:
    speed and the hard/soft ratio)."""
    result = {}
    for config in _check_configs(configs):
        soft = bench_train_one(config, ("soft",), quick, device, threads)["soft"]
        pair = bench_train_one(config, ("soft", "hard"), quick, device, threads)
        hard = pair["hard"]
        hard["soft_train_caps_per_s_alongside"] = pair["soft"]["train_caps_per_s"]
        # the plain implementation (scripts/baseline.py), its steps alternating with soft ones: a paired ratio
        versus = bench_train_one(config, ("soft", "baseline"), quick, device, threads)
        soft["train_speedup_vs_baseline"] = versus["soft"]["train_speedup_vs_baseline"]
        baseline = {"train_caps_per_s": versus["baseline"]["train_caps_per_s"],
                    "soft_train_caps_per_s_alongside": versus["soft"]["train_caps_per_s"]}
        if amp:
            bf16 = bench_train_one(config, ("soft",), quick, device, threads, amp=True)["soft"]
            soft["train_caps_per_s_bf16"] = bf16["train_caps_per_s"]
        result[config], result[f"{config}_hard"], result[f"{config}_baseline"] = soft, hard, baseline
    return result


def bench_decode(quick: bool = False, device: str = "cpu", threads: int = 2, amp: bool = False,
                 configs: Sequence[str] | None = None) -> dict:
    result = {}
    for config in _check_configs(configs):
        result[config] = bench_decode_one(config, quick, device, threads)
        if amp:
            bf16 = bench_decode_one(config, quick, device, threads, amp=True, with_baseline=False)
            result[config].update({f"{k}_bf16": v for k, v in bf16.items()})
    return result


# Self-critical training at Flickr8k's shape (configs/flickr8k_soft_scst.yaml): 7x7x1280 grids, the
# 2,541-word vocabulary of the Flickr8k train split (min_count 5), 32 images x 5 sampled captions of at
# most 20 words; the reward's corpus is 6,000 images x 5 references of 8-15 words (Flickr8k's sizes).
SCST_SIZES = dict(grid=7, feature_dim=1280, vocab=2541, images=32, samples=5, max_length=20,
                  corpus_images=6000, refs=5, steps=3)
SCST_QUICK = dict(grid=2, feature_dim=24, vocab=50, images=2, samples=3, max_length=4, corpus_images=20, refs=2,
                  steps=1, embed_dim=16, attention_dim=16, hidden_dim=16)


def bench_scst(quick: bool = False, device: str = "cpu", threads: int = 2, amp: bool = False) -> dict:
    """One SCST step (sampling with gradients, CIDEr-D reward, backward, Adam) against a cross-entropy step
    on the same number of captions, and the reward's share of the SCST step."""
    from captioner.training.losses import scst_baseline, scst_loss, soft_attention_loss
    from captioner.training.optim import build_optimizer
    from captioner.training.rewards import CiderD

    torch.set_num_threads(threads)
    s = {**SIZES, **SCST_SIZES, **(SCST_QUICK if quick else {})}
    rng = np.random.default_rng(0)
    corpus = [[list(rng.integers(4, s["vocab"], rng.integers(8, 16))) + [2] for _ in range(s["refs"])]
              for _ in range(s["corpus_images"])]
    start = time.perf_counter()
    reward = CiderD(corpus, vocab_size=s["vocab"])
    build_s = time.perf_counter() - start
    decoder = _build_decoder(s, "soft", device).train()
    optimizer = build_optimizer("adam", decoder.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    B, k = s["images"], s["samples"]
    grid = torch.randn(B, s["grid"] ** 2, s["feature_dim"], generator=g).to(device)  # (B, L, D)
    images = np.repeat(np.arange(B), k)  # (B*k,) sample -> image
    n_caps = B * k
    T = 12  # Flickr8k's mean caption is about 11 words; teacher-forced captions of 12 tokens + <start>
    captions = torch.randint(4, s["vocab"], (n_caps, T + 1), generator=g)
    captions[:, 0], captions[:, -1] = 1, 2
    lengths = torch.full((n_caps,), T + 1)
    scst_times, reward_times, xe_times = [], [], []
    for i in range(s["steps"] + 1):
        _sync(device)
        t0 = time.perf_counter()
        out = decoder.sample(grid, k, start_id=1, end_id=2, max_length=s["max_length"], forbid_ids=(3,))
        t1 = time.perf_counter()
        r = torch.from_numpy(reward(out.tokens.cpu().numpy(), images, lengths=out.lengths.cpu().numpy())).float()
        t2 = time.perf_counter()
        loss = scst_loss(out, r.to(device), scst_baseline(r.view(B, k)).reshape(-1).to(device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        _sync(device)
        t3 = time.perf_counter()
        grid_xe = grid.repeat_interleave(k, dim=0)  # (B*k, L, D): the same captions count, teacher-forced
        loss = soft_attention_loss(decoder(grid_xe, captions.to(device), lengths.to(device)),
                                   captions[:, 1:].to(device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        _sync(device)
        t4 = time.perf_counter()
        if i > 0:  # the first round warms up
            scst_times.append(t3 - t0)
            reward_times.append(t2 - t1)
            xe_times.append(t4 - t3)
    scst_s, reward_s, xe_s = (statistics.median(x) for x in (scst_times, reward_times, xe_times))
    return {"scst": {"scst_step_s": scst_s, "scst_reward_s": reward_s, "scst_reward_share": reward_s / scst_s,
                     "scst_reward_build_s": build_s, "xe_step_s_same_captions": xe_s,
                     "scst_xe_time_ratio": scst_s / xe_s, "scst_images_per_s": B / scst_s}}


def add_useful_flops(results: dict) -> None:
    """train_useful_gflops (useful FLOPs x captions/s) and its fraction of the same run's matmul rate."""
    for _key, row in results.items():
        if isinstance(row, dict) and "train_useful_gflop_per_caption" in row:
            row["train_useful_gflops"] = row["train_useful_gflop_per_caption"] * row["train_caps_per_s"]
            if "matmul_gflops" in results:
                row["train_frac_of_matmul"] = row["train_useful_gflops"] / results["matmul_gflops"]


def run_benches(only: list[str] | None = None, quick: bool = False, device: str = "cpu", threads: int = 2,
                amp: bool = False, configs: Sequence[str] | None = None, on_part=lambda results: None) -> dict:
    """Everything the issue asks for in one run (matmul always, for the ratios); train and decode at every
    configuration of CONFIGS, or at ``configs``. ``on_part(results)`` after each bench (the GPU check writes them
    as they come, so that a time limit keeps what was measured). On CUDA float32 matmuls run in TF32, as training
    runs them (train.tf32's default)."""
    names = only or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise ValueError(f"unknown bench {unknown[0]!r}; valid: {', '.join(BENCHES)}")
    _check_configs(configs)  # before minutes of benchmarks, not after
    torch.set_num_threads(threads)
    from captioner.fast import kernels
    from captioner.runtime import enable_tf32

    if device.startswith("cuda"):  # only there: on the CPU "high" precision may change oneDNN's matmuls
        enable_tf32(True)

    # Whether this run used the fused C kernels (captioner/fast/kernels; CAPTIONER_KERNELS=0 times the PyTorch path).
    results: dict = {"device": device, "threads": threads, "quick": quick, "fused_kernels": kernels.available()}
    results.update(bench_matmul(threads, device))
    for name in names:
        if name == "extract":
            kwargs = dict(n_images=4, batch_size=2, num_workers=0, repeats=1) if quick else {}
            results.update(bench_extract(threads=threads, amp=amp, **kwargs))
        else:
            common = dict(quick=quick, device=device, threads=threads, amp=amp)
            rows = BENCHES[name](**common, configs=configs) if name in ("train", "decode") else BENCHES[name](**common)
            for key, row in rows.items():
                results.setdefault(key, {}).update(row)
        on_part(results)
    add_useful_flops(results)
    return results


BENCHES = {"train": bench_train, "decode": bench_decode, "extract": bench_extract, "scst": bench_scst}


def format_table(results: dict) -> str:
    """Rows = configurations, columns = their keys; scalar results first."""
    lines = [f"{k:30s} {v:.4g}" if isinstance(v, float) else f"{k:30s} {v}"
             for k, v in results.items() if not isinstance(v, dict)]
    rows = {k: v for k, v in results.items() if isinstance(v, dict)}
    columns = list(dict.fromkeys(c for row in rows.values() for c in row))
    for column in columns:
        cells = [f"{rows[r][column]:.4g}" if column in rows[r] else "-" for r in rows]
        if column == columns[0]:
            lines.append(f"{'':30s} " + " ".join(f"{r:>10s}" for r in rows))
        lines.append(f"{column:30s} " + " ".join(f"{c:>10s}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(BENCHES)}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--configs", default=None,
                        help=f"train and decode at a comma-separated subset of: {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda also reports bf16 autocast figures)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--amp", action="store_true", help="also time bf16 autocast (implied by --device cuda)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the results as JSON to this file, after each bench (a time limit keeps them)")
    parser.add_argument("--train-worker", default=None, help=argparse.SUPPRESS)  # internal: one training run
    args = parser.parse_args(argv)
    if args.train_worker:
        print(json.dumps(_train_worker(**json.loads(args.train_worker))))
        return 0
    names = args.only.split(",") if args.only else None
    if names and any(n not in BENCHES for n in names):
        parser.error(f"unknown bench in {args.only!r} (valid: {', '.join(BENCHES)})")
    configs = args.configs.split(",") if args.configs else None
    if configs and any(c not in CONFIGS for c in configs):
        parser.error(f"unknown configuration in {args.configs!r} (valid: {', '.join(CONFIGS)})")
    amp = args.amp or args.device.startswith("cuda")
    def write(partial: dict) -> None:
        if args.out is not None:
            args.out.write_text(json.dumps(partial, indent=2))

    results = run_benches(names, quick=args.quick, device=args.device, threads=args.threads, amp=amp,
                          configs=configs, on_part=write)
    write(results)
    print(json.dumps(results, indent=2) if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
