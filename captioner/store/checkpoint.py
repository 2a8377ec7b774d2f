"""Checkpoint files: atomic save, safe load, version and compatibility checks.

Owns the on-disk format of everything the training loop (`training/loop.py`) writes and `load_captioner` reads.
A checkpoint is one `torch.save` file holding a plain dict:

    {"format_version": 2, "model": state_dict, "optimizer": ..., "scheduler": ..., "scaler": ...,
     "rng": ..., "epoch": int, "step": int, "objective": its state, "config": plain dict,
     "vocab": Vocab.to_dict(), "metrics": dict, "payload_sha256": str}

Four guarantees, each tested in tests/test_checkpoint.py:

- Saving is atomic. The bytes go to a hidden temp file in the target's directory
  (`.NAME.tmp-PID-RANDOM`), are fsync'ed, and `os.replace` swaps it onto the target, so
  a crash, SIGKILL or full disk mid-save leaves the previous checkpoint intact. A killed
  save can leave its temp file behind; the name starts with a dot and does not end in
  `.pt`, so nothing here mistakes it for a checkpoint, and it is safe to delete.
- Nothing unloadable is ever written: the payload may only hold what
  `torch.load(weights_only=True)` reads back (tensors, dicts, lists, tuples, str, int,
  float, bool, None, ...); anything else (a numpy array, a custom object) is refused
  with the key path that holds it.
- Loading never runs code from the file (`weights_only=True`): a file whose unpickling
  would import a callable is refused, as are truncated, corrupted, foreign and
  newer-format files, each with an error naming the file and the reason.
- A changed byte is refused. torch's zip container has no checksum over tensor data, so a
  flipped bit inside a saved tensor would load silently with the changed value; every save
  stores the SHA-256 of the payload's contents (`payload_digest`: keys, types, plain values,
  tensors' dtype, shape and bytes) under "payload_sha256", and every load recomputes it.
  Format 1 files (written before digests) still load, unchecked.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from captioner.atomic import DiskFullError, disk_free, fsync_directory, is_disk_full, temp_name
from captioner.store.rundir import RunDir
from captioner.store.saved_config import upgrade_saved_config

FORMAT_VERSION = 2  # 2: the payload's SHA-256 is stored under DIGEST_KEY and checked on load
DIGEST_KEY = "payload_sha256"


# Leaf types torch.load(weights_only=True) reads back (checked by exact type: a
# subclass such as numpy.float64 or an IntEnum is pickled by reference and refused on load).
# Not bytes: protocol 2 pickles b"" as a call to builtins.bytes, which the loader refuses.
_SAFE_LEAVES = (str, int, float, bool, type(None), torch.dtype, torch.device)
_SAFE_TENSORS = (torch.Tensor, torch.nn.Parameter)
_SAFE_MAPPINGS = (dict, collections.OrderedDict)
_SAFE_SEQUENCES = (list, tuple, torch.Size)
# At most this many offending values are listed in one error message.
_MAX_REPORTED = 5


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read or used; the message names the file or key."""


class CheckpointDiskFullError(DiskFullError, CheckpointError):
    """A checkpoint save that ran out of disk: the one full-disk error (atomic.DiskFullError, naming the file and
    the free space), and still a CheckpointError for the callers that catch those."""


# ---------------------------------------------------------------------------- saving


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write `payload` to `path` atomically, with "format_version" (the current format) and the
    payload's digest under DIGEST_KEY added.

    The previous file at `path`, if any, stays intact until the new one is completely
    on disk (temp file in the same directory, fsync, os.replace, fsync of the directory).
    The caller's dict is not modified. Missing parent directories are created.

    Raises:
        CheckpointError: the payload holds something `load_checkpoint` could not read
            back (message names the key path), or the file cannot be written; a full disk is a
            CheckpointDiskFullError (also an atomic.DiskFullError) naming the file and the free space.
    """
    path = Path(path)
    if not isinstance(payload, dict):
        raise CheckpointError(f"cannot save checkpoint {path}: payload must be a dict, got {type(payload).__name__}")
    payload = dict(payload)
    payload.pop(DIGEST_KEY, None)
    payload["format_version"] = FORMAT_VERSION  # the writer decides the format: it is what the digest vouches for
    problems = find_unsafe_values(payload)
    if problems:
        listed = "; ".join(problems)
        raise CheckpointError(
            f"cannot save checkpoint {path}: {listed}. A checkpoint may only hold tensors, dicts, lists, "
            "tuples, str, int, float, bool and None, so that torch.load(weights_only=True) "
            "reads it back; convert these values (e.g. numpy -> torch.from_numpy or .tolist())"
        )
    payload[DIGEST_KEY] = payload_digest(payload)

    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"cannot save checkpoint {path}: cannot create directory {directory} ({err})") from err
    # Same directory as the target so os.replace is a rename within one file system;
    # O_EXCL so two writers never share a temp file; mode 0o666 so the umask applies
    # as it would for an ordinary file (tempfile would force 0o600).
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as err:
        raise CheckpointError(f"cannot save checkpoint {path}: cannot create temp file {tmp} ({err})") from err
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:  # also KeyboardInterrupt: never leave a half-written temp file on purpose
        free = disk_free(directory) if is_disk_full(err) else None  # measured while the partial file is there
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        if is_disk_full(err):  # ENOSPC, or torch's zip writer's "unexpected pos" after a short write
            raise CheckpointDiskFullError(path, free, err, action="save checkpoint") from err
        if isinstance(err, (OSError, RuntimeError)):  # EIO, torch's other stream writer failures
            raise CheckpointError(f"cannot save checkpoint {path}: {err}") from err
        raise
    fsync_directory(directory)  # the rename itself durable: a power cut cannot lose the new entry


def payload_digest(payload: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of a checkpoint payload's contents, DIGEST_KEY left out: every key, the type of every
    value, plain values by repr, tensors by dtype, shape and bytes. Equal before a save and after its load;
    any changed tensor element or value changes it."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in payload.items() if k != DIGEST_KEY})
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    kind = type(value)
    if kind in _SAFE_TENSORS:
        t = value.detach().cpu().contiguous()
        digest.update(f"tensor {t.dtype} {tuple(t.shape)}:".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().data)  # the elements' bytes, as saved
    elif kind in _SAFE_MAPPINGS:
        digest.update(f"map {len(value)}:".encode())
        for key, item in value.items():  # pickle keeps insertion order, so the load sees the same order
            digest.update(f"{type(key).__name__} {key!r}=".encode())
            _feed(digest, item)
    elif kind in _SAFE_SEQUENCES:
        digest.update(f"{kind.__name__} {len(value)}:".encode())
        for item in value:
            _feed(digest, item)
    else:  # str, int, float, bool, None, dtype, device: repr round-trips each exactly
        digest.update(f"{kind.__name__} {value!r};".encode())


def find_unsafe_values(payload: Any, limit: int = _MAX_REPORTED) -> list[str]:
    """Return up to `limit` descriptions like 'payload["rng"]["numpy"][1] is a numpy.ndarray'.

    An empty list means `torch.load(weights_only=True)` can read the payload back.
    """
    problems: list[str] = []
    _walk(payload, "payload", problems, limit)
    return problems


def _walk(value: Any, where: str, problems: list[str], limit: int) -> None:
    if len(problems) >= limit:
        return
    kind = type(value)
    if kind in _SAFE_TENSORS or kind in _SAFE_LEAVES:
        return
    if kind in _SAFE_MAPPINGS:
        for key, item in value.items():
            if not _is_safe_key(key):
                problems.append(f"{where} has a key {key!r} of type {_type_name(key)}")
                if len(problems) >= limit:
                    return
                continue
            _walk(item, f"{where}[{key!r}]", problems, limit)
        return
    if kind in _SAFE_SEQUENCES:
        for i, item in enumerate(value):
            _walk(item, f"{where}[{i}]", problems, limit)
        return
    problems.append(f"{where} is a {_type_name(value)}")


def _is_safe_key(key: Any) -> bool:
    if type(key) is tuple:
        return all(_is_safe_key(k) for k in key)
    return type(key) in _SAFE_LEAVES


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


# --------------------------------------------------------------------------- loading


def resolve_checkpoint_path(path: str | Path, prefer: str = "best") -> Path:
    """Return the checkpoint file for `path`: the file itself, or for a run directory
    its best.pt, else its last.pt (`prefer="last"`: its last.pt alone; RunDir.candidates).

    Raises:
        CheckpointError: "checkpoint not found: PATH", or a directory holding none of those files.
    """
    path = Path(path)
    if path.is_dir():  # the best model is what inference wants; a run stopped before validating has last.pt
        run = RunDir(path)
        found = run.checkpoint(prefer)
        if found is None:
            raise CheckpointError(f"checkpoint not found: {path} is a directory without "
                                  f"{' or '.join(run.names(prefer))}")
        return found
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict:
    """Read a checkpoint written by `save_checkpoint`, without running code from the file.

    Args:
        path: a checkpoint file, or a run directory (`train` writes RUN_DIR/best.pt and
            RUN_DIR/last.pt): then best.pt is loaded, or last.pt if there is no best.pt.
            To resume training, pass RUN_DIR/last.pt explicitly.
        map_location: passed to torch.load; the default puts every tensor on the CPU.

    Raises:
        CheckpointError: the file is missing, unreadable, truncated or corrupted; holds
            objects other than plain weights and data (refused, never executed); is not a
            captioner checkpoint; or was written by a newer format version.
    """
    path = resolve_checkpoint_path(path)
    try:
        f = open(path, "rb")
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from err
    with f:
        try:
            payload = torch.load(f, map_location=map_location, weights_only=True)
        except MemoryError:
            raise
        except Exception as err:
            forbidden = _forbidden_global(err)
            if forbidden is not None:
                raise CheckpointError(
                    f"{path} contains objects that are not plain weights/data; refusing to load "
                    f"(it asks to import {forbidden}; only load it with weights_only=False if you "
                    "fully trust where it came from)"
                ) from err
            raise CheckpointError(f"{path} is truncated or corrupted ({_first_line(err)})") from err
    payload = _check_payload(payload, path)
    _check_digest(payload, path)
    return payload


def _check_digest(payload: dict, path: Path) -> None:
    """Refuse a format-2 file whose contents differ from what its writer hashed; removes DIGEST_KEY so the
    caller sees the payload as it was saved."""
    if payload["format_version"] < 2:
        return  # written before digests: nothing to check against
    stored = payload.pop(DIGEST_KEY, None)
    if not isinstance(stored, str):
        raise CheckpointError(f"{path} is corrupted: a format {payload['format_version']} checkpoint must hold "
                              f"its payload's SHA-256 under {DIGEST_KEY!r}, and this one does not")
    if payload_digest(payload) != stored:
        raise CheckpointError(
            f"{path} is corrupted: its contents do not match the SHA-256 saved with them (a changed byte in a "
            "tensor or value, from the disk, a copy or an edit); refusing to load it. Use an intact copy or "
            "another checkpoint of the run (last.pt / best.pt)")


def _forbidden_global(err: Exception) -> str | None:
    # torch's weights-only unpickler reports a blocked import as "unsupported GLOBAL x.y"
    # (blocked module) or "Unsupported global: GLOBAL x.y" (not allow-listed); any other
    # unpickling failure ("Unsupported operand 7", EOF, bad zip) means damaged bytes.
    match = re.search(r"unsupported (?:global: )?global ([\w.]+)", str(err), flags=re.IGNORECASE)
    return match.group(1) if match else None


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    detail = text[0] if text else ""
    detail = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
    return detail if len(detail) <= 200 else detail[:197] + "..."


def _check_payload(payload: Any, path: Path) -> dict:
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"{path} is not a captioner checkpoint: it holds a {_type_name(payload)}, not a dict "
            "with a 'format_version' key"
        )
    if "format_version" not in payload:
        keys = ", ".join(sorted(map(str, payload))[:10])
        raise CheckpointError(
            f"{path} is not a captioner checkpoint: no 'format_version' key (keys: {keys or 'none'})"
        )
    version = payload["format_version"]
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{path} has an invalid format_version {version!r} (expected an int >= 1)")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written with checkpoint format {version}, newer than this captioner "
            f"supports ({FORMAT_VERSION}); upgrade captioner to load it"
        )
    return payload


# ------------------------------------------------------------------- compatibility


def check_state_dict(checkpoint_state: Mapping[str, Any], model_state: Mapping[str, Any],
                     source: str | Path | None = None) -> None:
    """Raise CheckpointError naming every key that keeps `checkpoint_state` from loading
    into a model whose state_dict is `model_state`: missing keys, unexpected keys and
    shape mismatches such as
    "decoder.embedding.weight: checkpoint (10000, 512) vs model (9000, 512)".
    Either side may hold shapes instead of tensors (a model built on the meta device, a file's header), so the
    check can run before the model is built; `source` (the file) starts the message when given.
    """
    problem = state_dict_mismatch(checkpoint_state, model_state)
    if problem:
        where = f"{source}: " if source is not None else ""
        raise CheckpointError(f"{where}checkpoint weights do not fit this model (was it built with a different "
                              f"config or vocabulary?); {problem}")


def state_dict_mismatch(found: Mapping[str, Any], wanted: Mapping[str, Any], found_name: str = "checkpoint",
                        wanted_name: str = "model") -> str | None:
    """What keeps `found` (tensors or shapes by key) from loading where `wanted` is expected, or None: shape
    mismatches ("KEY: checkpoint (a, b) vs model (c, d)"), keys missing from `found`, keys `wanted` lacks."""
    missing = [k for k in wanted if k not in found]
    unexpected = [k for k in found if k not in wanted]
    mismatched = []
    for key, wanted_value in wanted.items():
        if key not in found:
            continue
        found_shape, wanted_shape = _shape(found[key]), _shape(wanted_value)
        if found_shape != wanted_shape:
            mismatched.append(f"{key}: {found_name} {_fmt_shape(found_shape)} vs {wanted_name} "
                              f"{_fmt_shape(wanted_shape)}")
    parts = []
    if mismatched:
        parts.append(f"shape mismatch: {_listing(mismatched)}")
    if missing:
        parts.append(f"missing from {found_name}: {_listing(missing)}")
    if unexpected:
        parts.append(f"not in {wanted_name}: {_listing(unexpected)}")
    return "; ".join(parts) or None


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list, torch.Size)) and all(type(n) is int for n in value):
        return tuple(value)
    return None


def _fmt_shape(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "(not a tensor)"
    return "(" + ", ".join(map(str, shape)) + ")" if len(shape) != 1 else f"({shape[0]},)"


def _listing(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def check_vocab(checkpoint_vocab: Any, vocab: Any) -> None:
    """Raise CheckpointError unless both vocabularies hold the same words in the same order.

    Each argument may be a Vocab (anything with a `words` list), its `to_dict()` (a dict
    with a "words" list) or a list of words. The message gives both sizes and the first
    id whose word differs, since a shifted id silently scrambles every caption.
    """
    ckpt_words, words = _words_of(checkpoint_vocab, "checkpoint"), _words_of(vocab, "given")
    if ckpt_words == words:
        return
    size = f"checkpoint has {len(ckpt_words)} words, the given vocabulary {len(words)}"
    for i, (a, b) in enumerate(zip(ckpt_words, words)):
        if a != b:
            raise CheckpointError(f"vocabulary mismatch: {size}; first difference at id {i}: "
                                  f"checkpoint {a!r} vs given {b!r}")
    raise CheckpointError(f"vocabulary mismatch: {size}; the shorter one is a prefix of the longer")


def _words_of(vocab: Any, which: str) -> list[str]:
    if isinstance(vocab, Mapping):
        if "words" not in vocab:
            raise CheckpointError(f"{which} vocabulary dict has no 'words' key (keys: {', '.join(map(str, vocab))})")
        words = vocab["words"]
    elif hasattr(vocab, "words"):
        words = vocab.words
    else:
        words = vocab
    if isinstance(words, (str, bytes)) or not isinstance(words, Iterable):
        raise CheckpointError(f"{which} vocabulary is a {_type_name(vocab)}, not a Vocab, its dict or a word list")
    return list(words)


# ------------------------------------------------------------------- averaging


# Batch norm's step counter: it differs between epochs of a run whose fine-tuned batch norms update their
# statistics, and is not a weight to average (average_checkpoints keeps the last file's).
COUNTER_SUFFIX = "num_batches_tracked"


def _model_section(payload: dict) -> Any:
    """A checkpoint's saved model section in the current format, with the defaults of keys added since (two
    versions' snapshots compare equal); as stored, upgraded, when it does not read as a config."""
    from captioner.config import ConfigError, config_to_dict  # a floor below: imported here to keep this light
    from captioner.store.saved_config import read_saved_config

    try:
        return config_to_dict(read_saved_config(payload["config"]))["model"]
    except ConfigError:
        return upgrade_saved_config(payload["config"]).get("model")


def average_checkpoints(paths: Sequence[str | Path]) -> dict:
    """The mean of several checkpoints' weights (checkpoint averaging: e.g. the last k epochs of one run, which
    ``train.keep_epochs`` keeps), as a weights-only checkpoint payload with the last file's config, vocabulary
    and epoch, and ``averaged_from`` naming the files.

    Floating-point tensors are averaged in float64 and stored in their own dtype: the weights, and batch norm's
    running statistics when fine-tuned blocks update them (``model.encoder.update_bn_stats``), as SWA-style
    averaging does. Batch norm's counters (``num_batches_tracked``, COUNTER_SUFFIX) grow every step: the average
    takes the last file's, how many batches the latest statistics have seen. Any other integer tensor must be
    equal in every file. Every file must hold the same tensors (names and shapes), the same vocabulary and the
    same model section of the config; the error names the file that differs.
    """
    if not paths:
        raise CheckpointError("checkpoint averaging needs at least one checkpoint")
    payloads = [(Path(p), load_checkpoint(p)) for p in paths]
    for path, payload in payloads:
        missing = [key for key in ("model", "config", "vocab") if key not in payload]
        if missing:
            raise CheckpointError(f"{path}: checkpoint has no {', '.join(map(repr, missing))} entry to average")
    first_path, first = payloads[0]
    sums = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path, payload in payloads[1:]:
        try:
            check_state_dict(payload["model"], first["model"])
            check_vocab(payload["vocab"], first["vocab"])
        except CheckpointError as err:
            raise CheckpointError(f"{path} cannot be averaged with {first_path}: {err}") from None
        if _model_section(payload) != _model_section(first):
            raise CheckpointError(f"{path} cannot be averaged with {first_path}: their model sections differ")
        for key, value in payload["model"].items():
            if value.is_floating_point():
                sums[key] += value.double()
            elif key.endswith(COUNTER_SUFFIX):
                sums[key] = value  # a counter: the last file's
            elif not torch.equal(value, sums[key]):
                raise CheckpointError(f"{path} cannot be averaged with {first_path}: the integer tensor {key!r} "
                                      "differs")
    n = len(payloads)
    model = {k: (v / n).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in sums.items()}
    last = payloads[-1][1]
    return {"model": model, "config": last["config"], "vocab": last["vocab"], "epoch": last.get("epoch"),
            "step": last.get("step"), "run_id": last.get("run_id"), "averaged_from": [str(p) for p, _ in payloads]}


# ------------------------------------------------------------------- a run's kept epochs


def run_identity(run_dir: str | Path) -> tuple[str | None, int | None]:
    """(run_id, latest epoch) of the run a folder holds, for choosing its kept epochs (``last_snapshots``): from its
    last.pt; without one, run.json's id and no latest epoch. A run started by a version before run ids has none
    (None): see ``last_snapshots``."""
    run = RunDir(run_dir)
    if run.last.is_file():
        payload = load_checkpoint(run.last)
        return payload.get("run_id"), int(payload["epoch"])  # .get: last.pt of a version before run ids
    if run.run_file.is_file():
        try:
            return json.loads(run.run_file.read_text())["run_id"], None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{run.run_file} is unreadable ({err}); it names the run the folder holds") from err
    return None, None


def last_snapshots(run_dir: str | Path, k: int, run_id: str | None, latest_epoch: int | None, what: str) -> list[Path]:
    """The last ``k`` kept epochs (RUN/epochs/epoch-NNN.pt) of the run ``run_id``, oldest first (k = 0: all of
    them), for averaging. A snapshot is the run's when it carries the run's id and its epoch is at most the run's
    latest (``latest_epoch``, last.pt's; None: no bound): another run's file, or one written just before an
    interruption that a --resume redoes, is skipped. A run without an id (started by a version before ids) takes
    the snapshots without one up to its latest epoch. Fewer than ``k`` is refused (``what``: the setting or flag
    that asked), naming the files taken and skipped, rather than averaging fewer or other epochs."""
    run = RunDir(run_dir)
    kept = run.epoch_snapshots()
    if not kept:
        raise CheckpointError(f"{what}: {run} has no kept epochs ({run.epochs}/epoch-*.pt); train with "
                              "train.keep_epochs=true")
    mine: list[Path] = []
    skipped: list[str] = []
    for path in reversed(kept):
        if k and len(mine) == k:
            break
        why = _not_the_runs(load_checkpoint(path), run_id, latest_epoch)
        if why:
            skipped.append(f"{path.name} ({why})")
        else:
            mine.append(path)
    if len(mine) < max(k, 1):
        taken = ", ".join(p.name for p in reversed(mine)) or "none"
        raise CheckpointError(
            f"{what}: {run} kept only {len(mine)} epochs of its run (run_id {run_id or 'none'}), {k or 1} needed; "
            f"this run's: {taken}" + (f"; skipped: {', '.join(reversed(skipped))}" if skipped else "")
            + ". Average fewer epochs, or name the files: captioner average FILE... --out OUT")
    return mine[::-1]


def _not_the_runs(payload: dict, run_id: str | None, latest_epoch: int | None) -> str | None:
    """Why a kept epoch's payload is not the run's (None: it is)."""
    theirs, epoch = payload.get("run_id"), payload.get("epoch")  # .get: snapshots of a version before run ids
    if theirs != run_id:
        return f"another run's, run_id {theirs}" if theirs else "written by a version before run ids, by another run"
    if latest_epoch is not None and isinstance(epoch, int) and epoch > latest_epoch:
        return f"epoch {epoch}, after the run's latest state (epoch {latest_epoch}): a --resume trains it again"
    return None

