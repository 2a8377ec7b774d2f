"""What a training run writes into its folder (captioner/store/rundir.py names the files), and in which order, so
that a kill at any moment, a rerun in the same folder or a resume never leaves numbers from another run or epoch.

- **A new run starts in a folder of its own.** Without ``--resume``, whatever an earlier run left in ``train.run_dir``
  (checkpoints, kept epochs, logs: ``RunDir.run_outputs``) is moved into ``RUN/previous-YYYYMMDD-HHMMSS/`` first,
  with a warning that names it (``start_clean``). Before, a rerun that stopped earlier than the run before it
  (patience, fewer epochs, a time budget) averaged the earlier run's last epochs as its own.
- **A run knows which run it is.** ``new_run_id`` gives a fresh run its id: RUN/run.json holds it, and last.pt,
  best.pt and every epoch snapshot carry it (``Progress.run_id``, captioner/training/progress.py), kept across
  --resume. Averaging takes this run's snapshots only (``checkpoint.last_snapshots``).
- **Each epoch's files in an order a kill cannot break** (``save_epoch``): the snapshot, then best.pt, then last.pt,
  then the metrics log. last.pt, what --resume continues from, so never claims an epoch whose snapshot or best.pt is
  missing; a kill before it makes the resume train that epoch again, and rewrite the same files. The metrics log,
  after it, is rewritten from last.pt's history by a resume. Every write is atomic (store/checkpoint.py,
  captioner/atomic.py): a kill during one leaves the previous file whole.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path

from captioner.atomic import fsync_directory, write_text_atomic
from captioner.store.rundir import RunDir

log = logging.getLogger(__name__)

RESUME_ONLY = ("optimizer", "scheduler", "scaler", "rng")  # what a snapshot leaves out of last.pt


def new_run_id() -> str:
    """A fresh run's id. From the OS's randomness: drawing it leaves torch's and Python's generators untouched, so
    a run's numbers do not depend on it."""
    return uuid.uuid4().hex


def start_clean(run_dir: RunDir) -> Path | None:
    """Move what an earlier run left in ``run_dir`` into ``run_dir/previous-<time>/`` (returned; None: nothing
    there), so that nothing this run writes mixes with it. Run by rank 0 before it writes anything."""
    found = run_dir.run_outputs()
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir.previous(stamp), 1
    while target.exists():  # two fresh starts within a second
        n += 1
        target = run_dir.previous(f"{stamp}-{n}")
    target.mkdir(parents=True)
    for path in found:
        os.replace(path, target / path.name)
    fsync_directory(run_dir.root)
    # the advice must lead somewhere: --resume continues a moved run with a last.pt, and starts one without one
    # there from its first epoch (its config.yaml, run_dir set to that folder: commands/train.py)
    moved = RunDir(target)
    what = ("to continue that run instead" if moved.last.is_file() else
            "it had no last.pt: to start that run again in its own folder" if moved.config.is_file() else None)
    log.warning("%s held an earlier run's files (%s); this new run starts clean and moved them to %s%s", run_dir,
                ", ".join(p.name for p in found), target,
                f" ({what}: captioner train --resume {target})" if what else "")
    return target


def write_run_file(run_dir: RunDir, run_id: str | None) -> None:
    """RUN/run.json: which run the folder holds. A run started by a version before run ids has none to write."""
    if run_id is not None:
        write_text_atomic(run_dir.run_file, json.dumps({"run_id": run_id}) + "\n")


def write_metrics(path: Path, entries: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(e) + "\n" for e in entries))


def snapshot_of(ckpt: dict) -> dict:
    """An epoch's snapshot: last.pt's payload without what only a resume needs (weights, config, vocabulary,
    progress and run id: what decoding, ensembles and averaging read)."""
    return {k: v for k, v in ckpt.items() if k not in RESUME_ONLY}


def save_epoch(run_dir: RunDir, ckpt: dict, epoch: int, improved: bool, keep_epochs: bool,
               history: list[dict]) -> None:
    """The end of an epoch on disk, in the module docstring's order: snapshot, best.pt, last.pt, metrics log."""
    from captioner.store.checkpoint import save_checkpoint

    if keep_epochs:
        save_checkpoint(run_dir.epoch(epoch), snapshot_of(ckpt))
    if improved:
        save_checkpoint(run_dir.best, ckpt)
    save_checkpoint(run_dir.last, ckpt)
    write_metrics(run_dir.metrics, history)


def restore_missing_snapshot(run_dir: RunDir, payload: dict) -> None:
    """A resumed run whose last.pt epoch kept no snapshot although the run keeps them (a kill between the two writes
    of a version that wrote last.pt first) gets it back from last.pt's weights, which are that epoch's."""
    from captioner.store.checkpoint import save_checkpoint

    epoch, kept = int(payload["epoch"]), payload["config"].get("train", {}).get("keep_epochs")
    if payload.get("in_epoch"):  # saved inside the next epoch: its weights are not epoch `epoch`'s
        return
    if kept and epoch > 0 and not run_dir.epoch(epoch).is_file():
        save_checkpoint(run_dir.epoch(epoch), snapshot_of(payload))
        log.warning("%s was missing (interrupted after last.pt): written again from last.pt", run_dir.epoch(epoch))


def write_average(run_dir: RunDir, last: int, run_id: str | None, epoch: int) -> None:
    """``train.average_last``: RUN/averaged.pt, the mean of this run's last ``last`` kept epochs (up to ``epoch``);
    a CheckpointError naming the files when it kept fewer."""
    from captioner.store.checkpoint import average_checkpoints, last_snapshots, save_checkpoint

    snapshots = last_snapshots(run_dir, last, run_id, epoch, what=f"train.average_last={last}")
    save_checkpoint(run_dir.averaged, average_checkpoints(snapshots))
    log.info("%s: the mean of %s", run_dir.averaged, ", ".join(p.name for p in snapshots))
