"""The training loop: epochs, validation by real decoding, checkpoints, exact resume, DDP.

Trains a Show-Attend-Tell captioner (Xu et al. 2015) with the objective ``train.objective.kind`` names
(captioner/training/objectives/): soft attention by backpropagation (§4.2, Eq. 14), hard attention by the paper's
REINFORCE (§4.1, Eq. 10-12), its leave-one-out or straight-through Gumbel-softmax estimators, or self-critical
sequence training. A step asks the objective for its loss and tells it when the step was taken; the objective
keeps its own state (a moving baseline, a temperature schedule), saved in every checkpoint.

- ``train()`` reads top to bottom: ``_set_up`` (data, model, optimizer; with ``--resume`` their saved
  state), then per epoch ``_train_epoch`` and ``_end_epoch`` (validate, select, checkpoint).
- ``data.use_cache``: a frozen encoder's grids are extracted once into the feature cache and training reads
  them (no CNN in the loop: what makes CPU training fast). Fine-tuning the last blocks (``finetune_blocks > 0``,
  their own ``encoder_lr`` group) caches the activations below them and runs only the top blocks per step;
  ``data.use_cache: false`` reads images on the fly instead. The datasets and loaders are
  captioner/training/inputs.py's.
- Validation decodes greedily and scores BLEU-4 / CIDEr-D on the raw references; ``best.pt``
  follows ``train.val_metric`` and early stopping uses ``train.patience``. The teacher-forced
  validation loss is logged, never used to choose.
- ``last.pt`` after every epoch holds everything needed to continue bit for bit: weights,
  optimizer, scheduler, fp16's gradient scaler, every rank's RNG states, the objective's state
  and the metrics. The shuffling order of epoch e depends only on (seed, e). ``--resume`` takes the
  run's latest state only (its directory or last.pt: an earlier checkpoint such as best.pt would
  rewrite metrics.jsonl without the later epochs; the refusal says how to branch a copy from it) and
  the same number of processes (each rank's data shard and random streams depend on it). A run killed at
  any moment resumes to the same epochs, files and weights: what is written when, and a new run's clean
  folder and id, are captioner/training/run_files.py's.
- DDP under torchrun: one process per device, DistributedSampler, rank 0 validates and writes;
  the objective hears of each step with the all-reduced batch reward, so its state is the same on
  every rank. Per-process batch size is ``train.batch_size``.

The ``captioner train`` command (its flags, errors and exit status) is captioner/commands/train.py.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn

from captioner import fast as fast_paths
from captioner.atomic import write_text_atomic
from captioner.config import Config, config_to_dict, save_config
from captioner.data.datasets import CaptionDataset, build_vocab, mirrored_records
from captioner.data.vocab import Vocab
from captioner.runtime import describe_device, enable_tf32, keep_freed_memory
from captioner.store.rundir import RunDir
from captioner.training.distributed import (
    barrier,
    broadcast_flag,
    gather_rng_states,
    max_over_ranks,
    seed_everything,
    set_rng_state,
    setup_distributed,
)
from captioner.training.errors import TrainingError
from captioner.training.inputs import epoch_loader, load_split_records, make_datasets
from captioner.training.losses import LossOutput
from captioner.training.objectives.base import Objective
from captioner.training.objectives.registry import build_objective
from captioner.training.optim import optimizer_for, scheduler_for
from captioner.training.preemption import PREEMPTION
from captioner.training.progress import Progress
from captioner.training.resume import check_resumed_inside_epoch, init_weights, load_init, resume_payload
from captioner.training.run_files import (
    new_run_id,
    restore_missing_snapshot,
    save_epoch,
    start_clean,
    write_average,
    write_run_file,
)
from captioner.training.run_files import write_metrics as _write_metrics
from captioner.training.run_logs import epoch_summary
from captioner.training.validation import validate

log = logging.getLogger(__name__)

# Set to anything: every rank writes the SHA-256 of its final weights to RUN_DIR/weights-rank<R>.sha256
# (how the DDP test checks the ranks stayed in lockstep).
WEIGHTS_HASH_ENV = "CAPTIONER_DEBUG_WEIGHTS_HASH"
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------------------- model step


class _TrainForward(nn.Module):
    """Grid preparation (or encoding) + teacher-forced decoding as one forward, so DDP sees every
    trainable parameter (projection, self-attention, encoder blocks) in the call it wraps."""

    def __init__(self, model: nn.Module, from_images: bool) -> None:
        super().__init__()
        self.model = model
        self.from_images = from_images

    def forward(self, inputs: torch.Tensor, captions: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
                sample: dict | None = None, rows: torch.Tensor | None = None, **read: Any):
        """Teacher-forced decoding of captions, or with ``sample`` (decoder.sample's arguments) captions
        drawn from the model with their log-probabilities (SCST). ``rows`` (N,): the grid row each caption
        reads (several captions may read one image's grid, encoded once); they share dropout masks.
        ``read``: how the teacher-forced decoder reads (Captioner.forward's attention_mode, expectation_mask,
        temperature, sample_prob)."""
        grid = self.model.grid_from(inputs, self.from_images)  # (B, L, D)
        if rows is not None:
            grid = grid.index_select(0, rows)  # (N, L, D)
        if sample is not None:
            return self.model.decoder.sample(grid, **sample)
        # the captions that read one grid row are copies of one caption: they share their dropout masks
        return self.model(grid, captions, lengths, dropout_rows=rows, **read)


def _weights_hash(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _all_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# --------------------------------------------------------------------------- the loop


def _train_step(run: "_Run", objective: Objective, batch: Any) -> LossOutput | None:
    """One optimizer step on ``objective``'s loss; None when skipped for a non-finite loss or gradient (the weights
    are untouched)."""
    t, progress, optimizer, scaler = run.cfg.train, run.progress, run.optimizer, run.scaler
    with run.amp():
        res = objective.total_loss(run.forward, batch)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(res.loss).backward()
    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip if t.grad_clip > 0 else math.inf)
    # Every rank must take the same decision (and average the same rewards) or DDP desyncs: one all-reduce.
    bad = (~torch.isfinite(res.loss.detach())).float()
    if not scaler.is_enabled():  # with fp16 the scaler owns overflowing gradients
        bad = bad + (~torch.isfinite(grad_norm)).float()
    zero = bad.new_zeros(())
    reduced = torch.stack([bad, zero if res.reward_sum is None else res.reward_sum.float(),
                           zero if res.reward_count is None else res.reward_count.float()])
    if run.world > 1:
        dist.all_reduce(reduced)
    bad_total, reward_sum, reward_count = reduced.tolist()
    progress.step += 1
    if bad_total > 0:
        progress.nonfinite_run += 1
        optimizer.zero_grad(set_to_none=True)
        if scaler.is_enabled():
            scaler.update()  # closes this step's unscale_, else the next one refuses to run
        if progress.nonfinite_run >= t.max_nonfinite_steps:
            raise TrainingError(
                f"{progress.nonfinite_run} consecutive steps had a non-finite loss or gradient (epoch "
                f"{progress.epoch + 1}, step {progress.step}); stopped without saving these weights ("
                + (f"last good checkpoint: {RunDir(t.run_dir).last}" if RunDir(t.run_dir).last.is_file() else
                   "no checkpoint yet: the run had not finished an epoch")
                + "). Try a lower train.lr, train.grad_clip > 0 or train.amp=none")
        return None
    progress.nonfinite_run = 0
    scaler.step(optimizer)
    scaler.update()
    objective.after_step(reward_sum / reward_count if reward_count > 0 else None)
    return res


@dataclass
class _Run:
    """One training run as ``_set_up`` builds (or resumes) it: what every epoch reads and updates."""

    cfg: Config
    run_dir: RunDir
    rank: int
    world: int
    device: torch.device
    vocab: Vocab
    model: nn.Module
    from_images: bool  # batches carry images (the encoder runs) rather than cached backbone grids
    train_set: CaptionDataset
    val_loss_set: CaptionDataset | None  # rank 0 only (inputs.make_datasets): the other ranks never validate
    val_decode_set: CaptionDataset | None
    objective: Objective
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    progress: Progress
    started: float  # time.monotonic() at the start, moved back by the run's earlier sessions
    forward: nn.Module | None = None  # _TrainForward, DDP-wrapped when world > 1
    scaler: Any = None
    amp: Callable[[], ContextManager] = nullcontext
    writer: Any = None
    stopped: bool = False  # resumed after its last epoch (patience, time budget): nothing more to train

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class _EpochStats:
    """What one epoch of training leaves for its end-of-epoch entry."""

    sums: dict[str, torch.Tensor]  # summed loss parts over the steps taken
    n_steps: int
    skipped: int
    lr: float  # the learning rate this epoch trained with (the scheduler has stepped since)
    start: float  # time.monotonic() when the epoch began
    train_time: float
    items: int  # examples this rank saw


def _set_up(cfg: Config, resume: str | None, started: float) -> _Run:
    """Data, vocabulary, model, datasets, optimizer and schedule; with ``resume`` their saved state."""
    from captioner.api import build_model

    t = cfg.train
    if t.num_threads > 0:
        torch.set_num_threads(t.num_threads)
    rank, world, device = setup_distributed(t.device, t.ddp_timeout_min, t.ddp_backend)
    if device.type == "cuda":
        enable_tf32(t.tf32)
    if rank == 0:
        log.info("training on %s", describe_device(device, t.device))
    payload = resume_payload(cfg, resume, world)
    train_records = load_split_records(cfg, "train", rank, world)
    val_records = load_split_records(cfg, "val", rank, world)
    if t.val_max_images:
        val_records = val_records[: t.val_max_images]
    init = load_init(t.init) if t.init and payload is None else None  # a run directory: its best.pt
    if payload is not None or init is not None:
        vocab = Vocab.from_dict((payload or init)["vocab"])
    else:
        vocab = build_vocab(train_records, cfg.data.min_count)
    if cfg.data.mirror:  # after the vocabulary, which counts the photos' own captions
        train_records = train_records + mirrored_records(train_records)

    seed_everything(t.seed)  # identical initial weights on every rank
    model = build_model(cfg, vocab).to(device)
    if t.compile != "off":  # the decoder's step compiled (the config refused it where it would not run)
        model.decoder.compile_steps(t.compile, setting="train.compile")
    from_images = not cfg.data.use_cache
    if init is not None:
        init_weights(cfg, model, init)
    train_set, val_loss_set, val_decode_set = make_datasets(cfg, model, vocab, train_records, val_records,
                                                             from_images, rank, world)
    if payload is not None:  # a checkpoint saved inside an epoch continues that epoch's order: it must be the same
        check_resumed_inside_epoch(payload, cfg, len(train_set), world, resume)
    objective = build_objective(cfg, model, train_set, from_images)
    optimizer = optimizer_for(cfg, model)
    run = _Run(cfg, RunDir(t.run_dir), rank, world, device, vocab, model, from_images, train_set, val_loss_set,
               val_decode_set, objective, optimizer, scheduler_for(cfg, optimizer),
               Progress(best={"metric": t.val_metric, "value": None, "epoch": 0}, run_id=new_run_id()), started)
    # The training stream starts here, so it does not depend on whether feature extraction (which
    # draws on the global RNG) just ran; each rank gets its own dropout masks and attention samples.
    seed_everything(t.seed + rank)
    if payload is not None:
        _restore(run, payload)
    _open_run_dir(run, payload)
    _prepare_steps(run)
    if payload is not None:
        _restore_scaler(run, payload)
    return run


def _restore(run: _Run, payload: dict) -> None:
    """Weights, optimizer, schedule, progress and this rank's RNG streams from ``last.pt``."""
    run.model.load_state_dict(payload["model"])
    run.optimizer.load_state_dict(payload["optimizer"])
    run.scheduler.load_state_dict(payload["scheduler"])
    # a checkpoint saved before objectives kept their state held REINFORCE's baseline among the progress
    run.objective.load_state_dict(payload.get("objective", {"baseline": payload.get("baseline")}))
    run.progress = Progress.from_payload(payload)
    run.started -= run.progress.elapsed_s  # the time budget counts the run's earlier sessions too
    t, saved = run.cfg.train, payload["config"]["train"]  # .get below: a config saved before the time budget
    run.stopped = run.progress.stopped_already(t.patience, t.time_budget_s, saved.get("time_budget_s", 0.0))
    if run.stopped and run.is_main:
        log.info("the run had stopped after epoch %d (%s): nothing more to train (raise train.patience or "
                 "train.time_budget_s to go on)", run.progress.epoch, run.progress.stop)
    set_rng_state(payload["rng"]["ranks"][run.rank], run.device)  # last: nothing draws after (one per rank: checked)
    log.info("resuming %s after epoch %d (step %d)", run.run_dir, run.progress.epoch, run.progress.step)


def _open_run_dir(run: _Run, payload: dict | None) -> None:
    """Rank 0 moves an earlier run's files aside (a new run) or restores a lost snapshot (a resume: run_files.py),
    writes run.json, config.yaml, vocab.json and the metrics log, and opens TensorBoard and W&B."""
    if not run.is_main:
        return
    from captioner.training.run_logs import open_run_logs

    if payload is None:
        start_clean(run.run_dir)
    else:
        restore_missing_snapshot(run.run_dir, payload)
    run.run_dir.root.mkdir(parents=True, exist_ok=True)
    write_run_file(run.run_dir, run.progress.run_id)
    save_config(run.cfg, run.run_dir.config)
    run.vocab.save(run.run_dir.vocab)
    # The checkpoint's history is the log's source of truth: a resumed run rewrites the log from
    # it, so an epoch logged after the checkpoint (then lost to a kill) is dropped, never
    # duplicated, and an epoch checkpointed but not yet logged is not lost.
    _write_metrics(run.run_dir.metrics, run.progress.history)
    run.writer = open_run_logs(run.run_dir.root, run.cfg.train.tensorboard, run.cfg.train.wandb,
                               config_to_dict(run.cfg), resumed=run.progress.epoch > 0)


def _prepare_steps(run: _Run) -> None:
    """The forward that steps call (DDP-wrapped across processes), mixed precision and its scaler. ``train.amp``
    runs under autocast on whatever device trains, the CPU included (bf16; fp16 where torch's CPU autocast has it),
    so the test suite covers the same code a GPU runs."""
    t, device = run.cfg.train, run.device
    run.forward = _TrainForward(run.model, run.from_images)
    if run.world > 1:
        run.forward = nn.parallel.DistributedDataParallel(
            run.forward, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=run.objective.may_leave_parameters_out,
            broadcast_buffers=_buffers_change(run.cfg))
    use_amp = t.amp != "none"
    if use_amp:
        run.amp = lambda: torch.autocast(device.type, dtype=AMP_DTYPES[t.amp])
    run.scaler = _make_scaler(device, enabled=use_amp and t.amp == "fp16")


def _buffers_change(cfg: Config) -> bool:
    """Whether training changes a buffer (the fine-tuned blocks' batch-norm statistics with update_bn_stats), so DDP
    must broadcast rank 0's every step; a frozen encoder's never change."""
    enc = cfg.model.encoder
    return enc.finetune_blocks > 0 and enc.update_bn_stats


def _make_scaler(device: torch.device, enabled: bool) -> torch.amp.GradScaler:
    """fp16's loss scaler (a no-op when disabled); its state travels in the checkpoint."""
    return torch.amp.GradScaler(device.type, enabled=enabled)


def _restore_scaler(run: _Run, payload: dict) -> None:
    """The saved loss scale and growth tracker, so an fp16 resume scales as the uninterrupted run would. A
    checkpoint without them (written with amp off, or before they were saved) leaves a fresh scaler."""
    state = payload.get("scaler") or {}
    if run.scaler.is_enabled() and state:
        run.scaler.load_state_dict(state)
    elif run.scaler.is_enabled():
        log.warning("%s holds no gradient-scaler state: fp16 loss scaling restarts from its initial scale",
                    run.run_dir.last)


def _train_epoch(run: _Run, epoch: int) -> _EpochStats:
    """One pass over the training set (steps, running means on the bar and TensorBoard), then the schedule's step.
    A checkpoint saved inside this epoch (``progress.in_epoch``) continues it from its next batch, with its running
    sums; ``train.save_every_min`` and a preemption signal (SIGTERM, SIGUSR1) to any rank save one
    (``_save_inside_epoch``), the signal then stopping every rank."""
    from tqdm import tqdm

    t, model, progress = run.cfg.train, run.model, run.progress
    model.train()
    part = progress.in_epoch if progress.in_epoch and progress.in_epoch["epoch"] == epoch else None
    progress.in_epoch = None
    done = part["batches"] if part else 0  # batches of this epoch already trained (a resume inside it)
    # grids read from the cache file: workers overlap the reads with the step; preloaded grids are a RAM gather
    num_workers = 0 if getattr(run.train_set, "preloaded", False) else run.cfg.data.num_workers
    loader = epoch_loader(run.train_set, t.batch_size, epoch, t.seed, run.rank, run.world, shuffle=True,
                          num_workers=num_workers, pin_memory=run.device.type == "cuda", skip_batches=done)
    sums: dict[str, torch.Tensor] = {k: torch.tensor(v, dtype=torch.float32, device=run.device)
                                     for k, v in (part["sums"] if part else {}).items()}
    n_steps, skipped = (part["n_steps"], part["skipped"]) if part else (0, 0)
    run.objective.on_epoch(epoch)
    epoch_start = time.monotonic() - (part["train_time"] if part else 0.0)
    last_save = time.monotonic()
    items = part["items"] if part else len(loader.sampler)  # examples of the whole epoch (this rank's)
    n_batches = done + len(loader)
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{t.epochs}", disable=not run.is_main, mininterval=1.0,
               dynamic_ncols=True, leave=False, initial=done, total=n_batches)
    for batch in bar:
        res = _train_step(run, run.objective, batch.to(run.device))
        done += 1
        if res is None:
            skipped += 1
        else:
            n_steps += 1
            for name, value in {**res.parts, "loss": res.loss.detach()}.items():
                sums[name] = sums.get(name, 0.0) + value.float()  # tensors: no per-step sync
            if run.is_main and n_steps % t.log_every == 0:
                bar.set_postfix({k: f"{float(v) / n_steps:.3f}" for k, v in sums.items()
                                 if k in ("loss", "xe", "reward")})
                if run.writer is not None:
                    run.writer.step({**res.parts, "loss": res.loss.detach()}, run.optimizer.param_groups[0]["lr"],
                                    progress.step)
        if done == n_batches:
            continue  # the epoch's last batch: its end saves anyway (and hears of a signal: train())
        # One decision of the whole job, in one all-reduce: a signal that reached any rank (Slurm may signal one
        # process only), a save any rank's clock calls for. Rank 0's flag alone would lose the others' signals, and
        # a rank that stopped on its own signal would leave the rest waiting at their next collective.
        due_here = t.save_every_min > 0 and time.monotonic() - last_save >= 60.0 * t.save_every_min
        job_signal, due = max_over_ranks([PREEMPTION.number, due_here], run.world, run.device)
        if job_signal or due:
            _save_inside_epoch(run, {"epoch": epoch, "batches": done, "n_steps": n_steps, "skipped": skipped,
                                     "sums": {k: float(v) for k, v in sums.items()},
                                     "train_time": time.monotonic() - epoch_start, "items": items,
                                     "train_items": len(run.train_set)})
            last_save = time.monotonic()
            PREEMPTION.stop_if_noted(run.run_dir, f"inside epoch {epoch + 1}, after its batch {done}", job_signal)
    bar.close()
    trained_lr = run.optimizer.param_groups[0]["lr"]  # the rate this epoch trained with (logged below)
    run.scheduler.step()
    train_time = time.monotonic() - epoch_start
    progress.epoch = epoch + 1
    return _EpochStats(sums, n_steps, skipped, trained_lr, epoch_start, train_time, items)


def _checkpoint(run: _Run, rng: list) -> dict:
    """What last.pt holds: everything an exact resume needs."""
    return {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(), "scaler": run.scaler.state_dict(), "rng": {"ranks": rng},
            "objective": run.objective.state_dict(),
            "config": config_to_dict(run.cfg),
            "vocab": run.vocab.to_dict(), **run.progress.payload()}


def _save_inside_epoch(run: _Run, part: dict) -> None:
    """last.pt inside an epoch (atomic, as every save): the weights, optimizer, schedule, objective, scaler and
    every rank's RNG streams after the batch ``part["batches"]``, and the epoch's running sums; a resume continues
    from the next batch as if never stopped. Snapshots, best.pt and the metrics log wait for the epoch's end.
    Rank 0 writes; a failure there (a full disk, non-finite weights) is raised on every rank (``_fail_together``),
    and that broadcast also keeps every rank here until the file is written, so none stops before it exists."""
    rng = gather_rng_states(run.world, run.device)  # a collective: every rank
    failure = None
    if run.is_main:
        try:
            _write_inside_epoch(run, part, rng)
        except Exception as err:  # noqa: BLE001 - every rank hears of it (_fail_together), then it is raised
            failure = err
    _fail_together(run, failure, f"saving last.pt inside epoch {part['epoch'] + 1}")


def _write_inside_epoch(run: _Run, part: dict, rng: list) -> None:
    """Rank 0's half of ``_save_inside_epoch``: no collective inside."""
    from captioner.store.checkpoint import save_checkpoint

    if not _all_finite(run.model):
        raise TrainingError(f"non-finite weights inside epoch {part['epoch'] + 1}; not saving them")
    run.progress.elapsed_s = time.monotonic() - run.started
    run.progress.in_epoch = part
    try:
        run.run_dir.root.mkdir(parents=True, exist_ok=True)
        save_checkpoint(run.run_dir.last, _checkpoint(run, rng))
    finally:
        run.progress.in_epoch = None


def _epoch_entry(run: _Run, epoch: int, stats: _EpochStats) -> dict[str, Any]:
    """The metrics log's line for this epoch: training means, validation scores, timings."""
    entry: dict[str, Any] = {"epoch": epoch + 1, "step": run.progress.step}
    entry.update({f"train_{k}": float(v) / max(stats.n_steps, 1) for k, v in stats.sums.items()})
    entry.update({"skipped_steps": stats.skipped, "lr": stats.lr, **run.objective.epoch_figures()})
    entry.update(validate(run.model, run.cfg, run.val_loss_set, run.val_decode_set, run.device, run.from_images,
                          run.amp))
    entry.update({"train_time_s": round(stats.train_time, 2), "time_s": round(time.monotonic() - stats.start, 2),
                  "items_per_s": round(stats.items / max(stats.train_time, 1e-9), 1)})
    return entry


def _select(run: _Run, entry: dict[str, Any], epoch: int, stats: _EpochStats) -> tuple[bool, bool]:
    """Record the entry; (whether it is the best so far by ``train.val_metric``, whether to stop)."""
    t, progress = run.cfg.train, run.progress
    progress.history.append(entry)
    value = entry.get(t.val_metric)
    if value is None:
        raise TrainingError(
            f"validation produced no {t.val_metric} score (epoch {epoch + 1}), so no checkpoint can be "
            f"chosen by train.val_metric={t.val_metric}" + (" (METEOR needs Java on PATH)"
                                                             if t.val_metric == "METEOR" else ""))
    improved = progress.best["value"] is None or value > progress.best["value"]
    if improved:
        progress.best = {"metric": t.val_metric, "value": value, "epoch": epoch + 1}
        progress.bad_epochs = 0
    else:
        progress.bad_epochs += 1
    # the reason is saved with the epoch: a resume after a kill before the run's end stops there too
    stop = progress.decide_stop(t.patience, t.time_budget_s, time.monotonic() - run.started,
                                time.monotonic() - stats.start)
    return improved, stop


def _save(run: _Run, entry: dict[str, Any], rng: list, improved: bool) -> None:
    """The epoch's snapshot (train.keep_epochs), best.pt when improved, last.pt (everything an exact resume needs),
    the metrics log, in that order (run_files.save_epoch), and a summary line."""
    if not _all_finite(run.model):  # belt and braces: skipped steps should make this impossible
        raise TrainingError(f"non-finite weights after epoch {entry['epoch']}; not saving them")
    run.progress.elapsed_s = time.monotonic() - run.started
    ckpt = _checkpoint(run, rng)
    save_epoch(run.run_dir, ckpt, entry["epoch"], improved, run.cfg.train.keep_epochs, run.progress.history)
    print(epoch_summary(entry, run.cfg.train.val_metric, improved), flush=True)


def _end_epoch(run: _Run, epoch: int, stats: _EpochStats) -> bool:
    """Validate, select and checkpoint (rank 0, on the bare model: no collectives inside, the other
    ranks wait); returns whether every rank stops here (patience or the time budget)."""
    improved = stop = False
    entry: dict[str, Any] = {}
    failure = None
    if run.is_main:
        try:
            entry = _epoch_entry(run, epoch, stats)
            improved, stop = _select(run, entry, epoch, stats)
            if run.writer is not None:
                run.writer.epoch(entry, epoch + 1)
                run.writer.images(run.model, run.val_decode_set.records[: run.cfg.train.tensorboard_images],
                                  epoch + 1)
        except Exception as err:  # noqa: BLE001 - every rank hears of it (_fail_together), then it is raised
            failure = err
    _fail_together(run, failure, f"validating epoch {epoch + 1}")
    rng = gather_rng_states(run.world, run.device)  # a collective: every rank, every epoch
    if run.is_main:
        try:
            _save(run, entry, rng, improved)
        except Exception as err:  # noqa: BLE001 - a full disk, non-finite weights: every rank stops
            failure = err
    _fail_together(run, failure, f"saving epoch {epoch + 1}")
    if not broadcast_flag(stop, run.world, run.device):
        return False
    if run.is_main:
        log.info("stopping after epoch %d (%s)", epoch + 1, run.progress.stop)
    return True


def _fail_together(run: _Run, failure: BaseException | None, doing: str) -> None:
    """Rank 0's error (validating, saving at an epoch's end or inside one) reaches every rank within one broadcast,
    rather than after the process group's timeout (train.ddp_timeout_min: an hour), and every rank raises."""
    if not broadcast_flag(failure is not None, run.world, run.device):
        return
    if failure is not None:
        raise failure
    raise TrainingError(f"rank 0 failed while {doing} (its error is in its own output); rank {run.rank} stops too")


def train(cfg: Config, resume: str | None = None) -> Path:
    """Train per ``cfg``; with ``resume`` (a run directory or checkpoint file) continue exactly where
    its ``last.pt`` stopped. Returns the run directory (best.pt, last.pt, config.yaml, vocab.json,
    metrics.jsonl)."""
    started = time.monotonic()  # train.time_budget_s counts data preparation and feature extraction too
    keep_freed_memory()  # every step allocates the same large tensors again (runtime.py)
    with fast_paths.reference(not cfg.train.fast_paths):  # false: every fast path off (captioner/fast)
        run = _set_up(cfg, resume, started)  # a SIGTERM here (extraction, say) ends the process as usual
        with PREEMPTION.listening():  # while training: saved at the next batch's end, then stopped
            for epoch in range(run.progress.epoch, cfg.train.epochs) if not run.stopped else ():
                stats = _train_epoch(run, epoch)
                if _end_epoch(run, epoch, stats):
                    break
                # a signal to any rank during the epoch's last batch, validation or the save: the job stops here
                (job_signal,) = max_over_ranks([PREEMPTION.number], run.world, run.device)
                PREEMPTION.stop_if_noted(run.run_dir, f"after epoch {epoch + 1}", job_signal)
    if os.environ.get(WEIGHTS_HASH_ENV):
        run.run_dir.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run.run_dir.weights_hash(run.rank), _weights_hash(run.model) + "\n")
    _finish(run)
    return run.run_dir.root


def _finish(run: _Run) -> None:
    """The end of a run on every rank: rank 0 writes ``train.average_last``'s average, and its outcome reaches every
    rank in one broadcast (_fail_together), so that all raise together: rank 0 its own error, the refusal of a run
    that kept too few epochs or any other (a full disk), and the others a TrainingError saying so. (A barrier here
    waited for a rank 0 that had raised past it, until the process group's timeout.)"""
    failure: BaseException | None = None
    if run.is_main and run.cfg.train.average_last:
        try:
            failure = _average(run)
        except Exception as err:  # noqa: BLE001 - a full disk, say: every rank hears of it, then it is raised
            failure = err
    if run.writer is not None:
        run.writer.close()
    _fail_together(run, failure, f"writing {run.run_dir.averaged.name}")
    barrier(run.world)  # no rank failed: every rank leaves together, rank 0's files written


def _average(run: _Run) -> TrainingError | None:
    """``train.average_last``: RUN/averaged.pt from this run's last kept epochs (run_files.write_average); the
    refusal, when the run kept fewer, as the error to raise once every rank is done."""
    from captioner.store.checkpoint import CheckpointError

    try:
        write_average(run.run_dir, run.cfg.train.average_last, run.progress.run_id, run.progress.epoch)
    except CheckpointError as err:
        return TrainingError(f"training finished ({run.run_dir.last}: epoch {run.progress.epoch}), but "
                             f"{run.run_dir.averaged.name} was not written: {err}")
    return None
