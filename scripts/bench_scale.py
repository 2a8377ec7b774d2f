"""The input pipeline at COCO's size: a synthetic data set as large as COCO, the training loader against the step.

Run:  python scripts/bench_scale.py [--quick] [--dir DIR] [--keep] [--json] [--out FILE]
(the full run writes 15.5 GB and takes about a quarter of an hour; start it with nohup, its log to a file).

What it writes, in a new folder under --dir (default: the system's temp folder), deleted at the end unless --keep:
- ``dataset_coco.json`` in the Karpathy format that ``data.format: karpathy`` reads (captioner/data/datasets.py):
  COCO 2014's 123,287 images in the Karpathy splits (82,783 train, 30,504 restval, 5,000 val, 5,000 test) with
  616,767 captions (5 per image; 332 images, drawn at random, have a 6th, as in COCO where a few have 6 or 7).
  Words per caption: a discretised normal, mean 10.5 (the mean length of COCO's captions) and standard deviation
  2.5, rounded and clipped to [5, 30] words; the spread and the clip are this bench's assumption (narrower than
  Flickr8k's measured 3.7 in scripts/bench.py: COCO's annotators were asked for at least 8 words, Chen et al.
  2015, arXiv:1504.00325). Words: a Zipf law of exponent 1.43 over 60,000 synthetic types ("w0", "w1", ...),
  which leaves about 9,500 words at min_count 5 (COCO's Karpathy vocabulary at that threshold has 9,487).
  Empty image folders stand in for the photos: the cache is read, never the images.
- a feature cache (captioner/data/features.py) of every image's 7x7x1280 float16 grid (EfficientNet-Lite0 at 224,
  the default encoder): 15.5 GB of random finite values in (-1, 1), written through the package's own
  CacheWriter, so it is the file training opens; every byte is written (a sparse file's holes would read free).

What it measures, on the training split (train + restval: 566,747 captions), batch 64, grids not preloaded:
- the time to read the records, build the vocabulary (min_count 5), build the dataset and open the cache;
- the training loader's batches/s (training/inputs.epoch_loader over a GridCaptionDataset) with 0, 2 and 4
  workers, each from a cold page cache (the file's pages dropped with posix_fadvise first), and each worker's
  memory; then one whole epoch with 2 workers (its time, and the workers' private memory at its end: forked
  workers copy the pages of the Python objects they touch); against the float32 training step's rate (forward +
  backward + Adam of configs/coco_soft.yaml's soft-attention model, random encoder weights, the loader's batches);
- peak RSS per process (VmHWM) and RssAnon / RssFile from /proc/self/status, reading the cache with one process
  and with two (torch.distributed gloo on localhost, DistributedSampler as training uses), each reading its
  shard for a fixed number of batches, rows read with pread (the package) and through a memmap (before);
- the projected epoch on this CPU and what a GPU needs from the loader.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

# Set before torch starts OpenMP (workers inherit it): see scripts/bench.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runnable from a checkout without install
from captioner.runtime import enable_tf32, keep_freed_memory  # noqa: E402

# The Karpathy split of COCO 2014 (dataset_coco.json): images per split, and captions in all.
COCO = dict(train=82_783, restval=30_504, val=5_000, test=5_000, captions=616_767)
COCO_TRAIN_CAPTIONS = 566_747  # train + restval, the captions one COCO epoch steps through
QUICK = dict(train=1_300, restval=500, val=100, test=100, captions=10_005)  # 2,000 images, COCO's 5.0 per image
GRID_HW, DIM = (7, 7), 1280  # EfficientNet-Lite0 at 224 (the default encoder)
BATCH, MAX_LENGTH, MIN_COUNT = 64, 20, 5  # configs/coco_soft.yaml
WORDS_MEAN, WORDS_SD, WORDS_MIN, WORDS_MAX = 10.5, 2.5, 5, 30
ZIPF_EXPONENT, WORD_TYPES = 1.43, 60_000
WORKERS = (0, 2, 4)
MB = 1 << 20


# --------------------------------------------------------------------------- the synthetic data set


def caption_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) words per caption: the module docstring's discretised normal."""
    return np.clip(np.rint(rng.normal(WORDS_MEAN, WORDS_SD, n)), WORDS_MIN, WORDS_MAX).astype(np.int64)


def write_captions(folder: Path, sizes: dict, rng: np.random.Generator) -> dict:
    """``folder/dataset_coco.json`` (Karpathy format) and the image folders it names; returns its statistics."""
    splits = [s for s in ("train", "restval", "val", "test") for _ in range(sizes[s])]  # per image
    n_images = len(splits)
    per_image = np.full(n_images, 5)
    per_image[rng.choice(n_images, sizes["captions"] - 5 * n_images, replace=False)] += 1  # the 6th captions
    lengths = caption_lengths(int(per_image.sum()), rng)  # (captions,)
    ranks = np.arange(1, WORD_TYPES + 1, dtype=np.float64)
    zipf = ranks ** -ZIPF_EXPONENT
    words = rng.choice(WORD_TYPES, size=int(lengths.sum()), p=zipf / zipf.sum())  # every token, in order
    names = [f"w{k}" for k in range(WORD_TYPES)]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    images, sentence = [], 0
    for index, split in enumerate(splits):
        folder_name = "train2014" if split == "train" else "val2014"  # restval, val and test come from val2014
        sentences = []
        for _ in range(per_image[index]):
            tokens = [names[w] for w in words[starts[sentence] : starts[sentence + 1]]]
            sentences.append({"tokens": tokens, "raw": " ".join(tokens) + ".", "imgid": index, "sentid": sentence})
            sentence += 1
        images.append({"filepath": folder_name, "filename": f"COCO_{folder_name}_{index:012d}.jpg",
                       "imgid": index, "split": split, "sentences": sentences, "cocoid": index})
    for name in ("train2014", "val2014"):
        (folder / "images" / name).mkdir(parents=True, exist_ok=True)
    path = folder / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return {"images": n_images, "captions": int(per_image.sum()), "captions_per_image": float(per_image.mean()),
            "mean_words": float(lengths.mean()), "json_mb": path.stat().st_size / MB}


def image_ids(sizes: dict) -> list[str]:
    """The image ids (file stems) write_captions gives, in its order."""
    n = sum(sizes[s] for s in ("train", "restval", "val", "test"))
    return [f"COCO_{'train2014' if i < sizes['train'] else 'val2014'}_{i:012d}" for i in range(n)]


def write_cache(directory: Path, ids: list[str], rng: np.random.Generator, chunk: int = 512) -> dict:
    """Every row of a cache for ``ids``, random finite float16, through features.CacheWriter (as extraction)."""
    from captioner.data.features import CacheWriter

    L = GRID_HW[0] * GRID_HW[1]
    start = time.perf_counter()
    fingerprint = {"name": "bench_scale:random", "grid_hw": list(GRID_HW), "dim": DIM}
    with CacheWriter(directory, ids, fingerprint, GRID_HW, DIM) as writer:
        for first in range(0, len(ids), chunk):
            rows = np.arange(first, min(first + chunk, len(ids)))
            bits = rng.integers(0, 1 << 16, size=(len(rows), L, DIM), dtype=np.uint16)
            # sign and mantissa random; exponent bits 14 and 10 cleared (an even exponent <= 14): finite, in (-1, 1)
            writer.write(rows, (bits & 0xBBFF).view(np.float16))  # (chunk, L, D)
            writer.end_batch()
    seconds = time.perf_counter() - start
    size = (directory / "grids.f16").stat().st_size
    return {"shape": [len(ids), L, DIM], "dtype": "float16", "gb": size / 1e9, "write_s": seconds,
            "write_mb_per_s": size / MB / seconds,
            "allocated_gb": os.stat(directory / "grids.f16").st_blocks * 512 / 1e9}  # == gb: not sparse


def drop_page_cache(path: Path) -> None:
    """Evict ``path``'s pages from the page cache (they are clean), so the next reads come from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- measurements


def proc_status(pid: int | str = "self") -> dict[str, float]:
    """A process's memory in MB: VmHWM (peak RSS), VmRSS, RssAnon (anonymous memory) and RssFile (mapped file
    pages: shared page cache) from /proc/PID/status; and from smaps_rollup its Private pages (a forked worker's
    RssAnon also counts the pages it still shares with its parent; Private counts only its own copies)."""
    fields = {}
    for name, keys in (("status", ("VmHWM", "VmRSS", "RssAnon", "RssFile")),
                       ("smaps_rollup", ("Private_Clean", "Private_Dirty"))):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in keys:
                fields[key] = int(value.split()[0]) / 1024  # kB -> MB
    fields["Private"] = fields.pop("Private_Clean") + fields.pop("Private_Dirty")
    return fields


def open_data(folder: Path) -> tuple[dict, object, object]:
    """Read the records and build the vocabulary, the training dataset and the cache, timing each.
    Returns (timings, the vocabulary, the training GridCaptionDataset)."""
    from captioner.config import DataConfig
    from captioner.data.datasets import GridCaptionDataset, build_vocab, load_records
    from captioner.data.features import FeatureCache

    data = DataConfig(format="karpathy", root=str(folder / "images"), captions=str(folder / "dataset_coco.json"))
    times, start = {}, time.perf_counter()
    train = load_records(data, "train")  # train + restval
    times["train_records_s"] = time.perf_counter() - start
    start = time.perf_counter()
    load_records(data, "val")
    times["val_records_s"] = time.perf_counter() - start
    start = time.perf_counter()
    vocab = build_vocab(train, min_count=MIN_COUNT)
    times["vocab_s"] = time.perf_counter() - start
    start = time.perf_counter()
    cache = FeatureCache.open(folder / "cache")
    times["cache_open_s"] = time.perf_counter() - start
    start = time.perf_counter()
    dataset = GridCaptionDataset(train, vocab, MAX_LENGTH, cache=cache, preload_bytes=0)  # COCO's 14 GB: no
    times["dataset_s"] = time.perf_counter() - start
    times.update(train_images=len(train), train_captions=len(dataset), vocab_words=len(vocab))
    return times, vocab, dataset


def loader_rate(dataset, workers: int, batches: int, grids_file: Path) -> dict:
    """Batches/s of the training loader (epoch 0, seed 0) with ``workers`` workers from a cold page cache: the
    first batch (workers starting) timed apart, then ``batches`` more; each worker's memory at the end."""
    from captioner.training.inputs import epoch_loader

    drop_page_cache(grids_file)
    loader = epoch_loader(dataset, BATCH, epoch=0, seed=0, rank=0, world=1, shuffle=True, num_workers=workers,
                          pin_memory=False)
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    assert first.inputs.dtype == torch.float16  # the rows travel as cached; CaptionBatch.to widens them
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    worker_memory = [proc_status(w.pid) for w in getattr(iterator, "_workers", [])]
    del iterator
    rate = batches / seconds
    return {"batches_per_s": rate, "per_worker_batches_per_s": rate / workers if workers else None,
            "first_batch_s": first_s, "mb_per_s": rate * BATCH * first.inputs[0].nbytes / MB,
            "worker_memory_mb": worker_memory}


def loader_epoch(dataset, workers: int, grids_file: Path) -> dict:
    """One whole epoch of the training loader from a cold page cache: its time, and the memory of the main
    process and of each worker at the last batch (before the workers exit)."""
    from captioner.training.inputs import epoch_loader

    drop_page_cache(grids_file)
    loader = epoch_loader(dataset, BATCH, epoch=0, seed=0, rank=0, world=1, shuffle=True, num_workers=workers,
                          pin_memory=False)
    start = time.perf_counter()
    iterator = iter(loader)
    for _ in range(len(loader) - 1):
        next(iterator)
    worker_memory = [proc_status(w.pid) for w in getattr(iterator, "_workers", [])]
    next(iterator)
    seconds = time.perf_counter() - start
    del iterator
    return {"workers": workers, "batches": len(loader), "seconds": seconds, "batches_per_s": len(loader) / seconds,
            "main_memory_mb": proc_status(), "worker_memory_mb": worker_memory}


COCO_VOCAB = 9_487  # COCO's Karpathy vocabulary at min_count 5: the output layer a quick run's model is given
STEP_BATCHES = (64, 256)


def step_model(vocab, tiny: bool, device: str, compile_mode: str = "off"):
    """configs/coco_soft.yaml's soft-attention model at its real sizes (``tiny``: hidden 32, for the tests), with
    COCO's vocabulary size (a quick data set's own is smaller: the padded words are never drawn), its optimizer
    and its config."""
    from captioner.api import build_model
    from captioner.config import load_config
    from captioner.data.vocab import Vocab
    from captioner.training.optim import build_optimizer

    overrides = ["model.encoder.pretrained=false"]  # the encoder is frozen: its weights do not change the step
    if tiny:
        overrides += ["model.decoder.embed_dim=32", "model.decoder.hidden_dim=32", "model.attention.attention_dim=32"]
    cfg = load_config(ROOT / "configs" / "coco_soft.yaml", overrides)
    if len(vocab) < COCO_VOCAB:
        vocab = Vocab(vocab.words + [f"<pad-word-{i}>" for i in range(COCO_VOCAB - len(vocab))], vocab.min_count)
    torch.manual_seed(0)
    model = build_model(cfg, vocab).to(device).train()
    if compile_mode != "off":  # train.compile: the decoder's step compiled over static shapes
        model.decoder.compile_steps(compile_mode, setting="--compile")
    assert tuple(model.encoder.cache_shape) == (*GRID_HW, DIM), model.encoder.cache_shape  # reads this cache
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, build_optimizer(cfg.train.optimizer, params, lr=cfg.train.lr), cfg


def _train_step(model, params, optimizer, cfg, batch, device: str) -> None:
    """One float32 step as training takes it: the batch crosses to ``device`` (float16 rows widened there),
    forward, soft-attention loss, backward, clipping, Adam."""
    from captioner.training.losses import soft_attention_loss

    batch = batch.to(device)
    out = model(model.grid_from(batch.inputs, images=False), batch.captions, batch.lengths)
    loss = soft_attention_loss(out, batch.captions[:, 1:], alpha_c=cfg.train.objective.alpha_c,
                               alpha_entropy=cfg.train.objective.alpha_entropy).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
    optimizer.step()


class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen operations that reach the backends (below autograd: the backward's too)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(step) -> int:
    """Operations dispatched by one call of ``step`` (a view or a copy counts as one, as a launch would)."""
    with _OpCounter() as counter:
        step()
    return counter.ops


def gpu_busy_share(step, step_s: float, steps: int = 3) -> dict:
    """On CUDA: the share of a step the GPU spends in kernels (their summed durations from torch.profiler over
    ``steps`` steps after a synchronise, per step, over ``step_s``: the step's time measured *without* the profiler,
    whose own overhead would lengthen the step and understate the share), the kernels run per step, and the CPU's
    launches per step, counted apart: kernel launches (cudaLaunchKernel and kin) and CUDA-graph replays
    (cudaGraphLaunch: one replays a whole captured step). A compiled step that silently fell back to eager shows as
    no replays and as many launches as kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    replays = [e for e in events if "GraphLaunch" in e.name]  # the CPU's calls
    launches = [e for e in events if "LaunchKernel" in e.name]
    busy_us = sum(e.device_time for e in kernels) / steps  # microseconds per step; one stream: no overlap
    return {"gpu_busy_share": busy_us / (step_s * 1e6), "kernels_per_step": len(kernels) / steps,
            "launches_per_step": len(launches) / steps, "graph_replays_per_step": len(replays) / steps}


def step_verdict(r: dict) -> str:
    """One line per measured training step: ok, or what is wrong (a compiled step that replays no CUDA graph has
    fallen back to eager; a GPU idle most of the step is bound by the CPU's launches)."""
    name = f"step batch {r['batch']} {'eager' if r['compile'] == 'off' else r['compile']}"
    if r["gpu_busy_share"] is None:
        return f"verdict: {name}: ok ({r['batches_per_s']:.2f} batches/s on {r['device']})"
    problems = []
    if r["compile"] == "cudagraphs" and not r["graph_replays_per_step"]:
        problems.append("no CUDA-graph replay: fell back to eager")
    if r["gpu_busy_share"] < 0.5:
        problems.append(f"GPU busy only {100 * r['gpu_busy_share']:.0f} % of the step")
    figures = (f"{r['batches_per_s']:.2f} batches/s, busy {100 * r['gpu_busy_share']:.0f} %, "
               f"{r['launches_per_step']:.0f} launches and {r['graph_replays_per_step']:.0f} graph replays per step")
    return f"verdict: {name}: {'; '.join(problems) if problems else 'ok'} ({figures})"


def step_rate(vocab, dataset, tiny: bool, steps: int, warmup: int, device: str = "cpu",
              batch_size: int = BATCH, compile_mode: str = "off") -> dict:
    """The float32 training step of configs/coco_soft.yaml's model at ``batch_size``: its rate (median step time
    over ``steps`` after ``warmup``, on the training loader's batches), the operations it dispatches, the peak
    memory (CUDA), and on CUDA the share of the step the GPU was busy."""
    from captioner.training.inputs import epoch_loader

    model, params, optimizer, cfg = step_model(vocab, tiny, device, compile_mode)
    loader = epoch_loader(dataset, batch_size, epoch=1, seed=0, rank=0, world=1, shuffle=True, num_workers=0,
                          pin_memory=device.startswith("cuda"))
    batches = [b for _, b in zip(range(warmup + steps), loader)]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i, batch in enumerate(batches):
        _sync(device)
        start = time.perf_counter()
        _train_step(model, params, optimizer, cfg, batch, device)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    result = {"batch": batch_size, "compile": compile_mode, "batches_per_s": 1.0 / step_s, "step_s": step_s,
              "steps": steps,
              "threads": torch.get_num_threads(), "device": device, "vocab": model.decoder.vocab_size,
              "hidden_dim": cfg.model.decoder.hidden_dim,
              # below autograd, eager only: torch.compile does not run under a dispatch mode (on CUDA compare the
              # launches per step instead)
              "ops_per_step": None if compile_mode != "off" else ops_per_step(
                  lambda: _train_step(model, params, optimizer, cfg, batches[0], device)),
              "gpu_memory_gb": None, "gpu_busy_share": None, "kernels_per_step": None, "launches_per_step": None,
              "graph_replays_per_step": None}
    if device.startswith("cuda"):
        result["gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
        result.update(gpu_busy_share(lambda: _train_step(model, params, optimizer, cfg, batches[-1], device), step_s))
    return result


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- one and two processes


def rank_main(rank: int, world: int, job: dict) -> None:
    """One process of the RSS measurement (torch.multiprocessing.spawn: a fresh interpreter, its own peak):
    read the records, build the dataset as training does, read ``job["batches"]`` batches of its shard."""
    import torch.distributed as dist

    from captioner.training.inputs import epoch_loader

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank, world_size=world)
    _, _, dataset = open_data(Path(job["folder"]))
    if job["read"] == "memmap":  # the reads before this change: a gather through the cache's memmap
        cache = dataset.cache
        cache.read_rows = lambda rows: cache.grids[np.asarray(rows, dtype=np.int64)]
    after_setup = proc_status()
    loader = epoch_loader(dataset, BATCH, epoch=0, seed=0, rank=rank, world=world, shuffle=True, num_workers=0,
                          pin_memory=False)
    start = time.perf_counter()
    for _, batch in zip(range(job["batches"]), loader):
        batch.to("cpu")
    seconds = time.perf_counter() - start
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    result = {"rank": rank, "setup_rss_anon_mb": after_setup["RssAnon"], **proc_status(),
              "batches_per_s": job["batches"] / seconds}
    Path(job["out"]).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_runs(folder: Path, quick: bool, batches: int, reads: tuple[str, ...]) -> dict:
    """{read: {world: [per-rank memory]}} for one process and for two (gloo), each rank ``batches`` batches."""
    import torch.multiprocessing as mp

    results: dict = {}
    for read in reads:
        for world in (1, 2):
            drop_page_cache(folder / "cache" / "grids.f16")
            out = folder / f"rss-{read}-{world}"
            job = {"folder": str(folder), "quick": quick, "read": read, "batches": batches, "port": _free_port(),
                   "out": str(out)}
            mp.spawn(rank_main, args=(world, job), nprocs=world, join=True)
            results.setdefault(read, {})[str(world)] = [
                json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(world)]
    return results


# --------------------------------------------------------------------------- the report


def project(results: dict) -> dict:
    """The epoch on this device (train captions / min(loader, step at batch 64) in captions/s), COCO's epoch at
    each measured batch from the step alone (from a quick run's data set, a projection), and the workers a GPU
    needs."""
    captions = results["open"]["train_captions"]
    step = results["steps"][str(BATCH)]["batches_per_s"]
    loader = results["loader"]
    per_worker = loader["2"]["per_worker_batches_per_s"]
    epoch = {w: captions / BATCH / min(loader[w]["batches_per_s"], step) / 3600 for w in loader}
    coco = {b: COCO_TRAIN_CAPTIONS / int(b) / s["batches_per_s"] / 60 for b, s in results["steps"].items()}
    row_bytes = GRID_HW[0] * GRID_HW[1] * DIM * 2  # one float16 grid
    gpu = {str(n): {"workers": math.ceil(n / per_worker), "mb_per_s": n * BATCH * row_bytes / MB}
           for n in (5, 10, 20, 40)}
    two = results["rss"].get("pread", {}).get("2", [])
    return {"epoch_hours_by_workers": epoch, "loader2_over_step": loader["2"]["batches_per_s"] / step,
            "coco_epoch_minutes_by_batch": coco, "coco_epoch_projected_from_quick_data": results["quick"],
            "loader_epoch_minutes": results["epoch"]["seconds"] / 60,
            "gpu_steps_per_s": gpu, "max_vmhwm_gb_two_processes": max((r["VmHWM"] for r in two), default=0) / 1024}


def _step_line(r: dict) -> str:
    compiled = "" if r["compile"] == "off" else f", compiled: {r['compile']}"
    line = (f"training step (float32{compiled}, batch {r['batch']}, hidden {r['hidden_dim']}, "
            f"vocabulary {r['vocab']:,}, "
            f"{r['device']}): {r['batches_per_s']:.2f} batches/s ({r['step_s']:.3f} s/step)"
            + (f", {r['ops_per_step']:,} operations dispatched per step" if r["ops_per_step"] is not None else ""))
    if r["gpu_busy_share"] is not None:
        line += (f", {r['launches_per_step']:.0f} kernel launches, {r['graph_replays_per_step']:.0f} graph replays, "
                 f"{r['kernels_per_step']:.0f} kernels"
                 f", GPU busy {100 * r['gpu_busy_share']:.0f} % of the step, "
                 f"peak GPU memory {r['gpu_memory_gb']:.2f} GB")
    return line


def format_report(results: dict) -> str:
    if "projection" not in results:  # --steps-only
        steps = [*results["steps"].values(), *results.get("compiled_steps", {}).values()]
        return "\n".join([*(_step_line(r) for r in steps), *(step_verdict(r) for r in steps)])
    d, c, o, s, p = (results[k] for k in ("dataset", "cache", "open", "steps", "projection"))
    lines = [f"data set: {d['images']:,} images, {d['captions']:,} captions ({d['captions_per_image']:.3f} per image, "
             f"{d['mean_words']:.2f} words), {d['json_mb']:.0f} MB JSON; vocabulary {o['vocab_words']:,} words",
             f"cache: {c['shape']} {c['dtype']}, {c['gb']:.2f} GB ({c['allocated_gb']:.2f} GB allocated), written in "
             f"{c['write_s']:.0f} s ({c['write_mb_per_s']:.0f} MB/s)",
             f"open: train records {o['train_records_s']:.1f} s, val {o['val_records_s']:.1f} s, vocabulary "
             f"{o['vocab_s']:.1f} s, dataset {o['dataset_s']:.1f} s, cache {o['cache_open_s']:.2f} s",
             *(_step_line(r) for r in s.values()),
             *(_step_line(r) for r in results.get("compiled_steps", {}).values())]
    for w, r in results["loader"].items():
        own = "/".join(f"{m['Private']:.0f}" for m in r["worker_memory_mb"])
        lines.append(f"loader, {w} workers: {r['batches_per_s']:.1f} batches/s ({r['mb_per_s']:.0f} MB/s, first batch "
                     f"{r['first_batch_s']:.1f} s){f', worker private MB {own}' if own else ''}")
    for read, worlds in results["rss"].items():
        for world, ranks in worlds.items():
            for r in ranks:
                lines.append(f"{read}, {world} process(es), rank {r['rank']}: VmHWM {r['VmHWM']:.0f} MB, RssAnon "
                             f"{r['RssAnon']:.0f} MB, RssFile {r['RssFile']:.0f} MB, "
                             f"{r['batches_per_s']:.1f} batches/s")
    e = results["epoch"]
    lines.append(f"one epoch, loader alone, {e['workers']} workers: {e['batches']:,} batches in {e['seconds']:.0f} s "
                 f"({e['batches_per_s']:.1f}/s); at its end worker private MB "
                 + "/".join(f"{m['Private']:.0f}" for m in e["worker_memory_mb"])
                 + f", main process RssAnon {e['main_memory_mb']['RssAnon']:.0f} MB")
    lines.append(f"loader (2 workers) / step: {p['loader2_over_step']:.1f}x; epoch on this CPU: "
                 + ", ".join(f"{h:.2f} h ({w} workers)" for w, h in p["epoch_hours_by_workers"].items()))
    lines.append(("COCO epoch, step alone" + (" (projected: the step ran on the quick data set)" if results["quick"]
                  else "") + ": ") + ", ".join(f"{m:.1f} min at batch {b}"
                                               for b, m in p["coco_epoch_minutes_by_batch"].items()))
    lines.append("a GPU at N steps/s needs: " + ", ".join(
        f"{n}/s -> {g['workers']} workers, {g['mb_per_s']:.0f} MB/s" for n, g in p["gpu_steps_per_s"].items()))
    return "\n".join(lines)


def run(folder: Path, quick: bool, log=print, device: str = "cpu", tiny: bool = False,
        compile_mode: str = "off", steps_only: bool = False, on_part=lambda results: None) -> dict:
    """Every measurement, or with ``steps_only`` the training steps alone (the GPU check: the loader and the
    processes' memory are the CPU's business); ``on_part(results)`` after each part, so that a run stopped by a
    time limit keeps what it measured."""
    sizes = QUICK if quick else COCO
    rng = np.random.default_rng(0)
    results: dict = {"quick": quick, "cpu_threads": torch.get_num_threads()}
    log("writing the captions ...")
    results["dataset"] = write_captions(folder, sizes, rng)
    log("writing the feature cache ...")
    results["cache"] = write_cache(folder / "cache", image_ids(sizes), rng)
    log("opening the data set ...")
    results["open"], vocab, dataset = open_data(folder)
    batches = 10 if quick else 200
    results["loader"] = {}
    for workers in () if steps_only else WORKERS:
        log(f"loader, {workers} workers ...")
        results["loader"][str(workers)] = loader_rate(dataset, workers, batches, folder / "cache" / "grids.f16")
        on_part(results)
    if not steps_only:
        log("one epoch, 2 workers ...")
        results["epoch"] = loader_epoch(dataset, 2, folder / "cache" / "grids.f16")
        on_part(results)
    log("training step ...")
    results["steps"], results["compiled_steps"] = {}, {}
    for batch in STEP_BATCHES:
        log(f"training step, batch {batch} ...")
        results["steps"][str(batch)] = step_rate(vocab, dataset, tiny, steps=2 if tiny else 6,
                                                 warmup=1 if tiny else 2, device=device, batch_size=batch)
        log(step_verdict(results["steps"][str(batch)]))
        on_part(results)
        if compile_mode != "off":  # the same step with train.compile (its warm-up compiles)
            log(f"training step, batch {batch}, compiled ({compile_mode}) ...")
            results["compiled_steps"][str(batch)] = step_rate(vocab, dataset, tiny, steps=2 if tiny else 6,
                                                              warmup=3, device=device, batch_size=batch,
                                                              compile_mode=compile_mode)
            log(step_verdict(results["compiled_steps"][str(batch)]))
            on_part(results)
    if steps_only:
        return results
    del dataset, vocab  # the processes below hold their own
    log("one and two processes ...")
    results["rss"] = rss_runs(folder, quick, batches=10 if quick else 300, reads=("pread", "memmap"))
    results["projection"] = project(results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 images instead of COCO's 123,287 (tests)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a new folder inside it)")
    parser.add_argument("--keep", action="store_true", help="keep the data set and the cache")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON to this file")
    parser.add_argument("--tiny-model", action="store_true",
                        help="step a hidden-32 model instead of configs/coco_soft.yaml's sizes (the tests)")
    parser.add_argument("--compile", default="off", choices=("off", "inductor", "cudagraphs"),
                        help="also step with train.compile set to this (on a GPU: cudagraphs), eager against compiled")
    parser.add_argument("--device", default="cpu", help="where the training step runs: cpu (default) or cuda")
    parser.add_argument("--steps-only", action="store_true",
                        help="only the training steps, eager and compiled (the GPU check; no loader, no processes)")
    args = parser.parse_args(argv)
    from captioner.runtime import resolve_device

    device = str(resolve_device(args.device))  # cuda without CUDA: refused, naming --device
    if device.startswith("cuda"):  # float32 matmuls in TF32, as training runs them there (train.tf32's default)
        enable_tf32(True)
    keep_freed_memory()  # as the `captioner` command does
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: measured
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench_scale-", dir=args.dir))
    free_gb = shutil.disk_usage(folder).free / 1e9
    need_gb = 1.0 if args.quick else 17.0
    if free_gb < need_gb:
        print(f"bench_scale: {folder} has {free_gb:.0f} GB free; the run needs about {need_gb:.0f} GB", file=sys.stderr)
        shutil.rmtree(folder)
        return 1
    try:
        def write(partial: dict) -> None:  # each part as it ends: a time limit keeps what was measured
            if args.out is not None:
                args.out.write_text(json.dumps(partial, indent=1))

        results = run(folder, args.quick, log=lambda m: print(m, file=sys.stderr, flush=True), device=device,
                      tiny=args.tiny_model, compile_mode=args.compile, steps_only=args.steps_only, on_part=write)
        results["folder"] = str(folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1) if args.json else format_report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
