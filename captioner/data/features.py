"""The feature cache: precomputed backbone grids a = {a_1..a_L} (Xu et al. 2015, Sec. 3.1.1) on disk.

A frozen encoder gives every image the same grid in every epoch, so it is computed once. An encoder whose last
blocks fine-tune (``model.encoder.finetune_blocks``) caches the activations below them instead (the same format,
(N, l, C) rows; ``Encoder.cache_features``), and its fingerprint names the split point. One cache directory
holds every split of a data set for one encoder fingerprint:
- ``grids.f16``: a raw float16 memmap of shape (N, L, D), one row per image (backbone output: the trainable
  projection is applied after the cache, so it never enters it);
- ``index.json``: written once (rewritten only when new images are appended): format version, the encoder
  fingerprint, grid_hw, dim and ``rows`` {image_id: row};
- ``progress.json``: rewritten atomically (temp file + os.replace) at every commit (``CacheWriter``: every 50
  batches or 30 s, and when extraction ends or stops on an error): the ``done`` bitmap and the images that
  failed to load with the reason.
A row counts as done only after it has been written and the memmap flushed, so a killed extraction resumes
from its last commit (recomputing at most the rows since) and never trusts a half-written row.
Rows are read with ``os.preadv`` at their offsets, not through a memmap: the bytes are the same, but a
memmap's pages count in the reader's RSS (a COCO-sized cache is 15 GB), pread's stay in the page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from captioner.atomic import raise_if_disk_full, write_text_atomic

log = logging.getLogger(__name__)

GRIDS_FILE = "grids.f16"
INDEX_FILE = "index.json"
PROGRESS_FILE = "progress.json"
FORMAT_VERSION = 1
_FIX = "re-run `captioner extract --config <your config>` (it writes a cache per encoder fingerprint)"


class FeatureCacheError(RuntimeError):
    """A feature cache is missing, damaged, made by another encoder, or extraction failed too often."""


def _write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data))  # readers see the old file or the new one, never a mix


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise FeatureCacheError(f"{path}: unreadable ({err}); delete the cache directory and {_FIX}") from err


def fingerprint_differences(cached: dict, expected: dict) -> list[str]:
    """Human-readable 'field: cache X, expected Y' lines for every differing fingerprint field."""
    return [f"{k}: cache {cached.get(k)!r}, expected {expected.get(k)!r}"
            for k in sorted(set(cached) | set(expected)) if cached.get(k) != expected.get(k)]


def cache_dir_for(data: Any, encoder_fingerprint: dict) -> Path:
    """``data.features_dir`` when set, else ``<data.root>/features/<encoder name>-<short fingerprint hash>``."""
    if data.features_dir:
        return Path(data.features_dir)
    digest = hashlib.sha256(json.dumps(encoder_fingerprint, sort_keys=True).encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(encoder_fingerprint.get("name", "encoder")))
    return Path(data.root) / "features" / f"{name}-{digest}"


class FeatureCache:
    """Read access to a cache directory: ``get(image_id)`` -> (L, D) float16 grid.

    Only completed rows are visible: ``image_id in cache`` is False for images not yet extracted or unreadable
    (``failures`` says why). The memmap opens lazily, so a cache pickles cheaply into DataLoader workers.
    """

    def __init__(self, directory: Path, index: dict, done: np.ndarray, failures: dict[str, str]):
        self.directory = Path(directory)
        self.fingerprint: dict = index["fingerprint"]
        self.grid_hw: tuple[int, int] = tuple(index["grid_hw"])
        self.dim: int = int(index["dim"])
        self.rows: dict[str, int] = index["rows"]
        self.done = done  # (N,) bool
        self.failures = failures  # image_id -> reason
        self.stats: dict[str, float] = {}  # filled by extract_features: processed, failed, seconds, images_per_s
        self._grids: np.memmap | None = None
        self._fd: int | None = None  # grids.f16 opened for pread, per process

    @classmethod
    def open(cls, directory: str | Path, expected_fingerprint: dict | None = None) -> "FeatureCache":
        """Open ``directory``; with ``expected_fingerprint``, refuse a cache made by a different encoder."""
        directory = Path(directory)
        index_path = directory / INDEX_FILE
        if not index_path.is_file():
            raise FeatureCacheError(f"no feature cache in {directory} ({INDEX_FILE} missing); {_FIX}")
        index = _read_json(index_path)
        if index.get("format_version") != FORMAT_VERSION:
            raise FeatureCacheError(f"{directory}: cache format {index.get('format_version')!r}, this code reads "
                                    f"{FORMAT_VERSION}; delete the directory and {_FIX}")
        if expected_fingerprint is not None and index["fingerprint"] != expected_fingerprint:
            diff = "; ".join(fingerprint_differences(index["fingerprint"], expected_fingerprint))
            raise FeatureCacheError(f"feature cache {directory} was made by a different encoder ({diff}). "
                                    f"Fix: {_FIX}, or point data.features_dir at an empty directory.")
        n = len(index["rows"])
        H, W = index["grid_hw"]
        expected_bytes = n * H * W * int(index["dim"]) * 2
        grids = directory / GRIDS_FILE
        if not grids.is_file() or grids.stat().st_size < expected_bytes:
            raise FeatureCacheError(f"{grids}: missing or shorter than {expected_bytes} bytes; "
                                    f"delete the directory and {_FIX}")
        done, failures = np.zeros(n, dtype=bool), {}
        progress_path = directory / PROGRESS_FILE
        if progress_path.is_file():
            progress = _read_json(progress_path)
            bits = np.unpackbits(np.frombuffer(bytes.fromhex(progress["done"]), dtype=np.uint8))
            done[: min(n, bits.size)] = bits[:n].astype(bool)
            failures = dict(progress["failed"])
        return cls(directory, index, done, failures)

    # -- reading -------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.rows), self.grid_hw[0] * self.grid_hw[1], self.dim)  # (N, L, D)

    @property
    def grids(self) -> np.memmap:
        if self._grids is None:
            self._grids = np.memmap(self.directory / GRIDS_FILE, dtype=np.float16, mode="r", shape=self.shape)
        return self._grids

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_grids"] = state["_fd"] = None  # reopened in the worker instead of copying the array
        return state

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            with contextlib.suppress(Exception):  # at interpreter exit os may already be gone
                os.close(fd)

    def read_rows(self, rows: Sequence[int]) -> np.ndarray:
        """Rows ``rows`` (B,) of the file, (B, L, D) float16, in that order: one pread per row into the result.

        The same bytes as the memmap's ``grids[rows]``; but pages a memmap touches stay mapped and count as the
        reader's RSS (every worker and rank of a 15 GB cache), while pread leaves them in the shared page cache.
        """
        out = np.empty((len(rows),) + self.shape[1:], dtype=np.float16)  # (B, L, D)
        if not hasattr(os, "preadv"):  # no pread on this platform (Windows): gather through the memmap
            out[:] = self.grids[np.asarray(rows, dtype=np.int64)]
            return out
        if self._fd is None:
            self._fd = os.open(self.directory / GRIDS_FILE, os.O_RDONLY)
        row_bytes = out[0].nbytes if len(out) else 0
        for k, row in enumerate(rows):
            if os.preadv(self._fd, [out[k]], int(row) * row_bytes) != row_bytes:
                raise FeatureCacheError(f"{self.directory / GRIDS_FILE}: short read at row {row}; "
                                        f"delete the directory and {_FIX}")
        return out

    def __len__(self) -> int:
        return int(self.done.sum())

    def __contains__(self, image_id: object) -> bool:
        row = self.rows.get(image_id)  # type: ignore[arg-type]
        return row is not None and bool(self.done[row])

    @property
    def complete(self) -> bool:
        return bool(self.done.all())

    def _row(self, image_id: str) -> int:
        if image_id not in self:
            why = self.failures.get(image_id, "not extracted yet" if image_id in self.rows else "unknown image id")
            raise KeyError(f"{image_id!r} has no grid in {self.directory}: {why}")
        return self.rows[image_id]

    def get(self, image_id: str) -> np.ndarray:
        """The grid of one image, (L, D) float16 (a copy, detached from the file)."""
        return self.read_rows([self._row(image_id)])[0]

    def get_batch(self, image_ids: Sequence[str]) -> np.ndarray:
        """Grids of several images, (B, L, D) float16."""
        return self.read_rows([self._row(i) for i in image_ids])


# ---------------------------------------------------------------------------------------------------------
# Extraction


def open_complete_cache(directory: str | Path, records: Iterable[Any], fingerprint: dict) -> "FeatureCache | None":
    """The cache in ``directory`` when it was made by this encoder and holds a grid for every record;
    None when it is missing, incomplete or another encoder's (extraction then resumes or redoes it)."""
    if not (Path(directory) / INDEX_FILE).exists():
        return None
    try:
        cache = FeatureCache.open(directory, expected_fingerprint=fingerprint)
    except FeatureCacheError:
        return None
    return cache if all(r.image_id in cache for r in records) else None


class _ImageFiles(Dataset):
    """(row, transformed image, error) per image; decoding runs in DataLoader workers. Rows whose ``flips``
    entry is True get the image mirrored left-right after the transform (which treats both sides alike)."""

    def __init__(self, rows: Sequence[int], paths: Sequence[str], transform: Callable, size: int,
                 flips: Sequence[bool] | None = None):
        self.rows, self.paths, self.transform, self.size = list(rows), list(paths), transform, size
        self.flips = list(flips) if flips is not None else [False] * len(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, str]:
        from captioner.data.images import ImageLoadError, load_image  # lazy: owned by data-foundation

        try:
            image = self.transform(load_image(self.paths[i]))
            return self.rows[i], image.flip(-1) if self.flips[i] else image, ""
        except ImageLoadError as err:
            # a placeholder keeps the batch shape; the empty-vs-filled error string says which rows to drop
            return self.rows[i], torch.zeros(3, self.size, self.size), str(err) or "unreadable"


def _prepare_cache(directory: Path, ids: list[str], fingerprint: dict, grid_hw: tuple[int, int], dim: int) -> dict:
    """Create the cache, or reopen it (same fingerprint) and append rows for ids it has not seen."""
    directory.mkdir(parents=True, exist_ok=True)
    index_path, grids = directory / INDEX_FILE, directory / GRIDS_FILE
    L = grid_hw[0] * grid_hw[1]
    if index_path.is_file():
        index = FeatureCache.open(directory, expected_fingerprint=fingerprint)  # validates
        rows = dict(index.rows)
    else:
        rows = {}
    new = [i for i in ids if i not in rows]
    if new or not index_path.is_file():
        for image_id in new:
            rows[image_id] = len(rows)
        # grow the file before the index names the new rows (a crash in between leaves spare bytes), and reserve
        # its blocks: a memmap store into a sparse file on a full disk kills the process with SIGBUS, while the
        # reservation fails here, with ENOSPC, named (atomic.DiskFullError)
        size = len(rows) * L * dim * 2
        existed = grids.is_file()
        before = grids.stat().st_size if existed else 0
        try:
            with open(grids, "ab") as f:
                f.truncate(max(os.fstat(f.fileno()).st_size, size))
                if hasattr(os, "posix_fallocate") and size:
                    os.posix_fallocate(f.fileno(), 0, size)
        except OSError as err:
            # nothing half made stays: a new file goes, an old one returns to its size (its rows are intact)
            with contextlib.suppress(OSError):
                if existed:
                    os.truncate(grids, before)
                else:
                    grids.unlink()
            raise_if_disk_full(err, grids, action="reserve the feature cache", needed=max(size - before, 0))
            raise
        _write_json_atomic(index_path, {"format_version": FORMAT_VERSION, "fingerprint": fingerprint,
                                        "grid_hw": list(grid_hw), "dim": dim, "dtype": "float16", "rows": rows})
    return rows


def _save_progress(directory: Path, done: np.ndarray, failures: dict[str, str]) -> None:
    _write_json_atomic(directory / PROGRESS_FILE, {"done": np.packbits(done).tobytes().hex(),
                                                   "n_done": int(done.sum()), "failed": failures})


class CacheWriter:
    """Writes rows into a cache directory and commits them: the memmap flushed first, then ``progress.json``
    naming the rows, so the progress file never claims a row that is not on disk.

    A commit comes after ``commit_every`` batches or ``commit_seconds``, whichever first, and when the ``with``
    block ends, on success or on an error raised outside a commit (Ctrl-C or a failing batch keeps the rows
    written so far). Per batch, a commit (msync of the whole map, fsync of progress.json) costs more as the
    cache grows; a kill between commits costs at most the rows since the last one, which a resumed run redoes.

    Args:
        directory: the cache directory, created or reopened (``image_ids`` it has not seen get new rows).
        image_ids: the images about to be written; their earlier failures are forgotten (tried again).
        fingerprint, grid_hw, dim: the encoder's fingerprint and the row shape (H, W) x D.
        commit_every: batches (``end_batch`` calls) between commits.
        commit_seconds: the longest time between commits while batches keep coming.
    """

    def __init__(self, directory: str | Path, image_ids: Sequence[str], fingerprint: dict,
                 grid_hw: tuple[int, int], dim: int, commit_every: int = 50, commit_seconds: float = 30.0) -> None:
        self.directory = Path(directory)
        self.rows = _prepare_cache(self.directory, list(image_ids), fingerprint, grid_hw, dim)
        cache = FeatureCache.open(self.directory)
        self.done = cache.done.copy()  # (N,) bool: committed rows only
        wanted = set(image_ids)
        self.failures = {i: why for i, why in cache.failures.items() if i not in wanted}
        self.grids = np.memmap(self.directory / GRIDS_FILE, dtype=np.float16, mode="r+", shape=cache.shape)
        self.commit_every, self.commit_seconds = commit_every, commit_seconds
        self.n_commits = 0
        self._written: list[np.ndarray] = []  # rows written since the last commit
        self._batches, self._last_commit = 0, time.monotonic()
        self._changed = self._committing = False

    def write(self, rows: np.ndarray, grids: np.ndarray) -> None:
        """Put ``grids`` (B, L, D) into ``rows`` (B,); they count as done at the next commit."""
        self.grids[rows] = grids
        self._written.append(np.asarray(rows, dtype=np.int64))
        self._changed = True

    def fail(self, image_id: str, reason: str) -> None:
        self.failures[image_id] = reason
        self._changed = True

    @property
    def n_written(self) -> int:
        """Rows done: committed, or written and waiting for the next commit."""
        return int(self.done.sum()) + sum(len(r) for r in self._written)

    def end_batch(self) -> None:
        """One batch is written: commit when ``commit_every`` batches or ``commit_seconds`` have passed."""
        self._batches += 1
        if self._batches >= self.commit_every or time.monotonic() - self._last_commit >= self.commit_seconds:
            self.commit()

    def commit(self) -> None:
        self._committing = True
        try:
            self.grids.flush()  # rows on disk before the progress file says so
        except OSError as err:
            raise_if_disk_full(err, self.directory / GRIDS_FILE, action="flush the feature cache")
            raise
        for rows in self._written:
            self.done[rows] = True
        _save_progress(self.directory, self.done, self.failures)
        self._written, self._batches, self._last_commit = [], 0, time.monotonic()
        self._changed = False
        self.n_commits += 1
        self._committing = False

    def __enter__(self) -> "CacheWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None and self._changed:
                self.commit()
            elif self._changed and not self._committing:  # a failed commit is not retried: it was what stopped
                try:
                    self.commit()
                except Exception:  # noqa: BLE001 - the error that stopped extraction is the one to report
                    log.exception("could not commit the rows written before %s", exc_type.__name__)
        finally:
            del self.grids  # unmaps the file


def extract_features(encoder: Any, records: Iterable[Any], out_dir: str | Path, batch_size: int = 32,
                     num_workers: int = 2, max_failure_share: float = 0.05, progress: bool = True,
                     device: str | torch.device | None = None, amp: bool = False,
                     on_batch: Callable[[int, int], None] | None = None, commit_every: int = 50,
                     commit_seconds: float = 30.0) -> FeatureCache:
    """Fill ``out_dir`` with the backbone grids of ``records`` (objects with ``image_id`` and ``path``).

    Resumable: rows already committed are skipped (``CacheWriter``: a commit every ``commit_every`` batches or
    ``commit_seconds``, and at the end or on an error). Unreadable images are recorded (``cache.failures``) and
    skipped; once they exceed ``max_failure_share`` of the records, extraction stops with FeatureCacheError.

    Args:
        encoder: a captioner.models.encoder.Encoder (moved to ``device``, channels_last, eval mode): a frozen
            one's grids are cached, a fine-tuned one's activations below its trainable blocks (``cache_features``).
        records: ImageRecord-like objects; a repeated image_id must name the same path. A record whose
            ``mirrored`` attribute is True is encoded flipped left-right (its id names the copy, e.g.
            ``<id>#mirror``, so its row sits beside the original's in the same cache).
        out_dir: the cache directory (see ``cache_dir_for``).
        batch_size: images per forward pass.
        num_workers: DataLoader processes that decode and transform images (0: in this process).
        max_failure_share: largest tolerated share of unreadable images.
        progress: show a tqdm bar.
        device: where the encoder runs (default: its current device).
        amp: run the backbone under autocast: float16 on CUDA, bfloat16 on CPU (fast only where the CPU has
            bf16 units, e.g. AMX; grids then differ from float32 by about 1e-2 relative).
        on_batch: called as on_batch(batch_index, rows_done_so_far) after each batch is written (its rows
            are committed at the next commit, or when extraction stops).
        commit_every, commit_seconds: how often rows are committed (``CacheWriter``).
    """
    paths, mirrored = _paths_by_id(records)
    h, w, dim = encoder.cache_shape  # a frozen encoder's grid, or a fine-tuned one's activations below its top
    device = torch.device(device) if device is not None else next(encoder.parameters()).device
    encoder.to(device=device, memory_format=torch.channels_last).eval()
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16  # CPUs autocast to bfloat16 only
    processed, n_failed, start = 0, 0, time.perf_counter()
    with CacheWriter(out_dir, list(paths), encoder.cache_fingerprint(), (h, w), dim, commit_every=commit_every,
                     commit_seconds=commit_seconds) as writer:
        todo = sorted((writer.rows[i], i) for i in paths if not writer.done[writer.rows[i]])
        id_of_row = dict(todo)
        files = _ImageFiles([r for r, _ in todo], [paths[i] for _, i in todo], encoder.transform,
                            encoder.input_size, flips=[i in mirrored for _, i in todo])
        loader = DataLoader(files, batch_size=batch_size, num_workers=num_workers,
                            pin_memory=device.type == "cuda", prefetch_factor=4 if num_workers else None)
        from tqdm.auto import tqdm

        with tqdm(total=len(todo), disable=not progress, unit="img", desc="extract") as bar:
            for batch_index, (batch_rows, images, errors) in enumerate(loader):
                batch_rows = batch_rows.numpy()
                ok = np.array([not e for e in errors])
                for row, err in zip(batch_rows, errors):
                    if err:
                        writer.fail(id_of_row[int(row)], err)
                        n_failed += 1
                if ok.any():
                    x = images if ok.all() else images[torch.from_numpy(ok)]
                    x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)  # (B, 3, S, S)
                    with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
                        grid = encoder.cache_features(x)  # (B, l, C)
                    writer.write(batch_rows[ok], grid.to(torch.float16).cpu().numpy())
                    processed += int(ok.sum())
                writer.end_batch()
                bar.update(len(batch_rows))
                if on_batch is not None:
                    on_batch(batch_index, writer.n_written)
                if n_failed > max_failure_share * len(paths):
                    raise _too_many_failures(n_failed, writer.failures, paths, max_failure_share)
    return _reopen_with_stats(Path(out_dir), paths, processed, time.perf_counter() - start)


def _too_many_failures(n_failed: int, failures: dict[str, str], paths: dict[str, str],
                       max_failure_share: float) -> FeatureCacheError:
    examples = "; ".join([failures[i] for i in paths if i in failures][:5])
    return FeatureCacheError(f"{n_failed} of {len(paths)} images could not be loaded (more than "
                             f"max_failure_share={max_failure_share}); e.g. {examples}")


def _paths_by_id(records: Iterable[Any]) -> tuple[dict[str, str], set[str]]:
    """(image_id -> path of every record, the ids of mirrored copies); a repeated id must name the same file."""
    paths: dict[str, str] = {}
    mirrored: set[str] = set()
    for r in records:
        image_id, path = str(r.image_id), str(r.path)
        if paths.setdefault(image_id, path) != path:
            raise ValueError(f"image id {image_id!r} names two files: {paths[image_id]} and {path}")
        if getattr(r, "mirrored", False):
            mirrored.add(image_id)
    if not paths:
        raise ValueError("extract_features: no records")
    return paths, mirrored


def _reopen_with_stats(directory: Path, paths: dict[str, str], processed: int, seconds: float) -> FeatureCache:
    """The finished cache, its ``stats`` filled in; a warning names images that could not be loaded."""
    cache = FeatureCache.open(directory)
    failed_here = [i for i in paths if i in cache.failures]
    if failed_here:
        log.warning("%d of %d images could not be loaded and have no grid, e.g. %s", len(failed_here), len(paths),
                    "; ".join(cache.failures[i] for i in failed_here[:3]))
    cache.stats = {"processed": processed, "failed": len(failed_here), "seconds": seconds,
                   "images_per_s": processed / seconds if seconds > 0 else 0.0}
    return cache
