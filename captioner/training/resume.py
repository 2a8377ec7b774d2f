"""What a run starts from, checked: ``--resume``'s latest state (``resume_payload``) and ``train.init``'s weights
(``load_init``, ``init_weights``).

A resumed run must continue the same run: its config's model and data sections unchanged (only ``train.*`` may
change, and of those not the optimizer's schedule, nor ``train.epochs`` when a schedule spans it: the cosine rate, the
Gumbel temperature; ``check_resumed_schedule``), its latest ``last.pt`` (an earlier checkpoint would rewrite the
metrics log without the later epochs; the refusal says how to branch a copy; a folder without one, or a run folder's
path or bare name that does not exist yet, has nothing to resume: ``nothing_to_resume``, which `captioner train
--resume` starts from its first epoch) and the same number of processes. A ``last.pt`` saved inside an epoch also
needs that epoch's order: the same ``train.batch_size``, ``train.seed`` and training set
(``check_resumed_inside_epoch``). A run that starts from another's weights
(``train.init``) must share its model and data sections except the few ``INIT_MAY_DIFFER`` names (the attention
kind, dropouts, the encoder's trained top).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from torch import nn

from captioner.config import Config, ConfigError, config_to_dict
from captioner.store.checkpoint import load_checkpoint
from captioner.store.hub import is_model_folder, read_model_folder
from captioner.store.locate import load_weights, locate
from captioner.store.rundir import RunDir
from captioner.store.saved_config import read_saved_config
from captioner.store.zoo import is_shipped_name
from captioner.training.errors import TrainingError

log = logging.getLogger(__name__)


INIT_MAY_DIFFER = (("data", "entities"), ("model", "attention", "attention"), ("model", "decoder", "dropout"),
                   ("model", "decoder", "feature_dropout"), ("model", "encoder", "finetune_blocks"),
                   ("model", "encoder", "update_bn_stats"))


# the decoder's scene (show_attend_tell.py): a model without it may start one with it, its new weights zero
SCENE_PATH = ("model", "decoder", "scene")
# the visual sentinel (show_attend_tell.py): a model without it may start one with it (with_sentinel)
SENTINEL_PATH = ("model", "decoder", "sentinel")


def _scene_widened(weights: dict, cfg: Config, change: str) -> dict:
    """``weights`` of a decoder without the scene, widened for one with it (show_attend_tell.widen_for_scene: the
    same function at the start); the other direction would drop trained weights, and is refused."""
    from captioner.models.decoders.show_attend_tell import widen_for_scene

    if cfg.model.decoder.scene != "mean":  # the scene changed, so the saved model's was "mean" and ours "none"
        raise ConfigError(f"train.init={cfg.train.init}: {change}; only a model without the scene may start one "
                          f"with it (its weights for the scene start at zero)")
    feature_dim = weights["decoder.init_h.0.weight"].shape[1]  # f_init,h reads the grid's mean (B, D)
    return widen_for_scene(weights, feature_dim)


def _without(section: dict, path: tuple[str, ...]) -> dict:
    """A copy of ``section`` with the key at ``path`` (below the section) removed."""
    section = json.loads(json.dumps(section))
    node = section
    for key in path[:-1]:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node.pop(path[-1], None)
    return section


def require_same_sections(saved_config: dict, cfg: Config, what: str, advice: str,
                           may_differ: tuple[tuple[str, ...], ...] = ()) -> list[str]:
    """The data and model sections (what weights and vocabulary depend on) must equal the checkpoint's
    (read as a config first, so what an earlier version saved compares in today's format:
    store/saved_config.py), except at the ``may_differ`` paths (section, key, ...). Returns those that
    differ, as "model.attention.attention: 'soft' -> 'hard'"."""
    try:
        saved_config = config_to_dict(read_saved_config(saved_config))
    except ConfigError:
        pass  # compared as stored: it differs, and the message says which section
    ours = config_to_dict(cfg)
    for section in ("data", "model"):
        theirs, mine = saved_config.get(section), ours[section]
        for path in (p[1:] for p in may_differ if p[0] == section):
            if isinstance(theirs, dict):
                theirs, mine = _without(theirs, path), _without(mine, path)
        if theirs != mine:
            raise ConfigError(f"{what}: the config's {section!r} section differs from the checkpoint's; {advice}")
    changed = []
    for path in may_differ:
        old, new = saved_config, ours
        for key in path:
            old = old.get(key) if isinstance(old, dict) else None
            new = new.get(key) if isinstance(new, dict) else None
        if old != new:
            changed.append(f"{'.'.join(path)}: {old!r} -> {new!r}")
    return changed


def load_init(init: str) -> dict:
    """train.init as a checkpoint payload, read from what ``init`` names by the rule captioning uses
    (``store.locate.locate``): a model folder (a shipped model's name, what ``captioner export`` wrote, or a hub
    model id ``owner/name`` in the Hugging Face cache, fetched first unless the hub is offline: its weights, config
    and vocabulary; the frozen backbone is the installed one, as when it captions), a checkpoint file, or a run
    directory (its best.pt, else its last.pt)."""
    source = locate(init, prefer="best")
    if source.kind == "checkpoint":
        return load_checkpoint(source.path)
    _, _, tensors, meta = read_model_folder(source.path)
    return {"config": meta["config"], "vocab": meta["vocab"], "model": tensors, "epoch": None, "folder": meta}


def init_weights(cfg: Config, model: nn.Module, payload: dict) -> None:
    """Start from the weights of ``train.init`` (``load_init``), which must have been trained with the same
    data and model sections (and so the same vocabulary), except for the attention kind and the boxes' folder
    (INIT_MAY_DIFFER): a soft model may start a hard one, a model trained without boxes a supervised one. The
    state dict is checked tensor by tensor either way (``load_weights``)."""
    changed = require_same_sections(payload["config"], cfg, f"train.init={cfg.train.init}",
                                     "start from a run trained with the same data and model settings (only "
                                     "data.entities, model.attention.attention, the decoder's dropout rates, "
                                     "the encoder's finetune_blocks / update_bn_stats, model.decoder.scene "
                                     "none -> mean and model.decoder.sentinel false -> true may differ)",
                                     may_differ=INIT_MAY_DIFFER + (SCENE_PATH, SENTINEL_PATH))
    weights = payload["model"]
    scene_change = next((c for c in changed if c.startswith(".".join(SCENE_PATH) + ":")), None)
    if scene_change is not None:
        weights = _scene_widened(weights, cfg, scene_change)
    sentinel_change = next((c for c in changed if c.startswith(".".join(SENTINEL_PATH) + ":")), None)
    if sentinel_change is not None:
        from captioner.models.decoders.show_attend_tell import with_sentinel

        if not cfg.model.decoder.sentinel:
            raise ConfigError(f"train.init={cfg.train.init}: {sentinel_change}; only a model without the sentinel may "
                              f"start one with it")
        weights = with_sentinel(weights, model.state_dict())
    load_weights(model, weights, cfg.train.init, folder=payload.get("folder"))  # a folder: its config.json
    log.info("initialised from %s (epoch %s)%s", cfg.train.init, payload.get("epoch"),
             "".join(f"; {c} (the same weights, read the new way)" for c in changed))


def resume_payload(cfg: Config, resume: str | None, world: int) -> dict | None:
    """The ``last.pt`` to continue from (``train.run_dir`` becomes its directory), checked against the config,
    the run's history and the number of processes. ``resume`` is read as captioning reads a model path
    (``store.locate.locate``), but a run folder stands for its last.pt alone, and a hub id is not looked up: a
    model folder (shipped, exported or a hub's) holds no training state to continue, and is refused saying so."""
    if resume is None:
        return None
    if Path(resume).is_dir() and nothing_to_resume(resume):  # the command starts such a run there (train.py)
        raise TrainingError(f"--resume {resume}: {RunDir(resume)} holds no {RunDir(resume).last.name} yet, so "
                            "there is nothing to resume; start the run without resume (`captioner train --config "
                            f"CONFIG --resume {resume}` does that by itself)")
    source = locate(resume, prefer="last", hub=False)
    if source.kind != "checkpoint":  # without hub ids: a shipped model or a model folder
        what = (f"the shipped model {source.path.name}" if source.kind == "shipped"
                else f"the model folder {source.path}")
        raise TrainingError(
            f"--resume {resume}: {what} holds a model's weights, config and vocabulary, not the state "
            f"of a training run (optimizer, schedule, random streams, metrics log), so there is nothing to resume. "
            f"Start a new run from its weights: captioner train --config CONFIG --init {resume}")
    ckpt_file = source.path
    payload = load_checkpoint(ckpt_file)
    _require_latest_state(ckpt_file, payload, resume)
    _require_same_process_count(payload, world, resume)
    cfg.train.run_dir = str(ckpt_file.parent)
    require_same_sections(payload["config"], cfg, f"--resume {resume}",
                           "resume with the run's own config.yaml (only train.* may change)")
    check_resumed_schedule(payload["config"].get("train", {}), cfg, resume)
    return payload


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")  # a missing path ending so is a checkpoint file not found


def nothing_to_resume(resume: str) -> bool:
    """Whether ``--resume`` names a run folder that holds no last.pt yet: a job preempted before its first epoch
    ended, or one its scheduler has not started (the folder may not exist). A scheduler's requeue passes the same
    ``--resume`` every time, so such a run starts from its first epoch there (commands/train.py) instead of being
    refused. A checkpoint file, a model folder or a shipped name is not a run folder: resume_payload says what it
    is."""
    run = RunDir(resume)
    if run.root.is_dir():
        return not run.last.is_file() and not is_model_folder(run.root)
    if run.root.exists():
        return False  # a file: a checkpoint (resume_payload reads it)
    # Missing: a run folder to start, whether written runs/x or a bare name (what train.run_dir holds), unless it
    # is a shipped model's name or looks like a checkpoint file, whose absence resume_payload reports
    return not is_shipped_name(resume) and Path(resume).suffix not in CHECKPOINT_SUFFIXES



def _require_latest_state(ckpt_file: Path, payload: dict, resume: str) -> None:
    """Refuse a checkpoint older than its run's last.pt: resuming from it would rewrite the metrics log from
    its history, losing the later epochs. The message says how to branch a copy of the run from it."""
    latest = RunDir(ckpt_file.parent).last
    if not latest.is_file() or latest.samefile(ckpt_file):
        return
    epoch, latest_epoch = int(payload["epoch"]), int(load_checkpoint(latest)["epoch"])
    if epoch >= latest_epoch:
        return  # the same state (best.pt written by the run's last epoch)
    run_dir = ckpt_file.parent
    branch = run_dir.with_name(f"{run_dir.name}-from-{ckpt_file.stem}")
    raise TrainingError(
        f"--resume {resume}: {ckpt_file.name} holds the state after epoch {epoch}, but the run went on to epoch "
        f"{latest_epoch} ({latest}); resuming from it would rewrite {RunDir(run_dir).metrics} without epochs "
        f"{epoch + 1}-{latest_epoch}. To continue the run, resume from its latest state: --resume {run_dir}. "
        f"To continue from {ckpt_file.name} and keep this run's history, branch a copy: cp -r {run_dir} {branch} "
        f"&& cp {ckpt_file} {RunDir(branch).last} && captioner train --resume {branch}")


def _require_same_process_count(payload: dict, world: int, resume: str) -> None:
    """One saved RNG state per process: a resume with another count would share or drop streams, and the
    data shards change with it, so it could not continue exactly."""
    saved = len(payload["rng"]["ranks"])
    if saved != world:
        raise TrainingError(
            f"--resume {resume}: the run was saved by {saved} process(es) and this resume runs {world}; each "
            f"process's data shard and random streams depend on the count, so it cannot continue exactly. Resume "
            f"with {saved} process(es) ({'no torchrun' if saved == 1 else f'torchrun --nproc_per_node={saved}'}), "
            "or start a new run from its weights with --init")


EPOCH_ORDER_KEYS = ("batch_size", "seed")  # with the training set: which items an epoch's first n batches hold


def check_resumed_inside_epoch(payload: dict, cfg: Config, train_items: int, world: int, resume: str) -> None:
    """Refuse to continue a checkpoint saved inside an epoch (``in_epoch``) with another ``train.batch_size``,
    ``train.seed`` or training set (``train_items``: the training dataset's length now; the data section is already
    the run's, but its files or ``train.objective.kind``, per image or per caption, may change it), naming each that
    differs. The resume skips the epoch's first ``batches x batch_size`` items of the order that (seed, epoch) draws
    over the training set: with any of them changed, it would skip other items than those trained and train some
    twice. A checkpoint saved at an epoch's end starts a new order and may change them."""
    part = payload.get("in_epoch")
    if not part:
        return
    saved, t = payload["config"].get("train", {}), cfg.train
    differ = [f"train.{key} is {getattr(t, key)!r} but the epoch began with {saved[key]!r}"
              for key in EPOCH_ORDER_KEYS if key in saved and saved[key] != getattr(t, key)]
    if "train_items" in part:
        if part["train_items"] != train_items:
            differ.append(f"the training set holds {train_items} items but the epoch began with {part['train_items']}")
    elif part["items"] != math.ceil(train_items / world):  # saved before train_items: this rank's share of them
        differ.append(f"the training set gives each process {math.ceil(train_items / world)} items but the epoch "
                      f"began with {part['items']}")
    if differ:
        raise ConfigError(
            f"--resume {resume}: last.pt was saved inside epoch {part['epoch'] + 1}, after its batch "
            f"{part['batches']}, and continues that epoch's order, but {'; '.join(differ)}: it would skip other items "
            "than those trained. Resume with the values the epoch began with until it ends; a last.pt saved at an "
            "epoch's end may change train.batch_size, train.seed and the training set")


SCHEDULE_KEYS = ("optimizer", "lr", "encoder_lr", "weight_decay", "lr_schedule", "lr_step_epochs", "lr_gamma")


def check_resumed_schedule(saved: dict, cfg: Config, resume: str) -> None:
    """Refuse a resume whose optimizer or schedule settings differ from the run's (``saved``: its train section),
    naming the key: the optimizer and schedule resume as they were, so a new value would be ignored. ``train.epochs``
    too where a schedule spans it: the cosine rate (a longer horizon would restart it from its end), and the Gumbel
    estimator's temperature (losses.gumbel_temperature anneals over train.epochs: a new total moves τ back up)."""
    t = cfg.train
    for key in SCHEDULE_KEYS:
        if key in saved and saved[key] != getattr(t, key):
            raise ConfigError(
                f"--resume {resume}: train.{key} is {getattr(t, key)!r} but the run was trained with {saved[key]!r}; "
                f"the optimizer and learning-rate schedule resume as they were, so the new value would be ignored. "
                f"Resume with train.{key}={saved[key]!r}, or start a new run from this one with --init")
    spans = _schedules_over_epochs(saved, cfg)
    if spans and "epochs" in saved and saved["epochs"] != t.epochs:
        raise ConfigError(
            f"--resume {resume}: train.epochs is {t.epochs!r} but the run was trained with {saved['epochs']!r}, and "
            f"{spans} spans train.epochs, so a new total would change it mid-run. Resume with "
            f"train.epochs={saved['epochs']!r}, or start a new run from this one with --init")


def _schedules_over_epochs(saved: dict, cfg: Config) -> str | None:
    """What in this run is scheduled over train.epochs (None: nothing)."""
    if saved.get("lr_schedule") == "cosine":
        return "the cosine learning-rate schedule"
    return cfg.train.objective.SPANS_EPOCHS
