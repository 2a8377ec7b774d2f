"""Running a recipe (recipes.py) stage by stage, resumable, and the records it writes (issue 72).

Each stage's run folder holds the stage's record, ``stage.json`` (``RunDir.stage``): its inputs (the resolved
config it trains with, and the identity of the weights it starts from: the file and its sha256), written before its
run starts, and once the run ended, its run id (``run.json``), the command and the wall time of its sessions.
``run_recipe`` walks the stages in order:

- a stage done, with the same inputs and the same run still in its folder, is skipped;
- a stage started and interrupted (its record without an end, and its last.pt) continues from its last.pt, with the
  same command and ``--resume RUN_DIR`` (`captioner train` continues it exactly: training/resume.py); a run folder
  the recipe did not start but whose config.yaml is the stage's is taken over the same way;
- a stage whose inputs changed since its record (its config, after an edit of the recipe or a config file; the
  weights it starts from) is refused, naming what changed, unless ``--redo`` names it or a stage before it: it then
  trains afresh (training moves the earlier run's files to previous-*/), and so does every stage after it, since
  each starts from the weights of the one before.

Then the last stage's weights are evaluated (`captioner evaluate --json`) and the recipe's record written: the
scores and every figure the evaluation printed, each stage's command and wall time, the evaluation's, the CPU model,
the commit and the date. A record that holds the same evaluation of the same weights is kept: a finished recipe run
again does nothing, and says so. captioner/reports/recipes.py makes the table of the records found.

Every command runs as a child process (``python -m captioner ...``, in the working folder), the same command a
person would type; a SIGTERM or SIGUSR1 (a scheduler's preemption notice) is passed on to the child, which saves
and stops as training does (training/preemption.py), and the recipe exits with the child's code.
"""

from __future__ import annotations

import json
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from captioner.atomic import write_text_atomic
from captioner.config import config_to_dict
from captioner.store.hub import sha256_of
from captioner.training.provenance import commit, cpu_model, now
from captioner.training.recipes import (
    EVALUATE,
    GVD_BEAMS,
    PlannedStage,
    Recipe,
    RecipeError,
    command_line,
    evaluated_weights,
    evaluation_argv,
    format_duration,
    load_recipes,
    plan,
    results_file,
    shipped_recipes,
)

FORWARDED_SIGNALS = ("SIGTERM", "SIGUSR1")  # what training saves and stops on (training/preemption.py)
MAX_CHANGES_SHOWN = 12


def weights_identity(init: str) -> dict | None:
    """Which weights ``init`` names, read as ``train.init`` reads it (store/locate.py: a run folder stands for its
    best.pt, else last.pt; a model folder for its weights file): {"init", "file", "sha256"}; None for no init. A path
    that names nothing yet has no file and no digest."""
    if not init:
        return None
    from captioner.store.checkpoint import CheckpointError
    from captioner.store.hub import WEIGHTS_FILE
    from captioner.store.locate import locate

    try:
        found = locate(init, prefer="best", hub=False)
    except (CheckpointError, ValueError):
        return {"init": init, "file": None, "sha256": None}
    file = found.path if found.kind == "checkpoint" else found.path / WEIGHTS_FILE
    return {"init": init, "file": file.name, "sha256": sha256_of(file) if file.is_file() else None}


def stage_inputs(p: PlannedStage) -> dict:
    """What a stage's result depends on: its resolved config and the weights it starts from."""
    return {"config": config_to_dict(p.cfg), "init": weights_identity(p.cfg.train.init)}


def changes(old: dict, new: dict) -> list[str]:
    """What differs between two stages' inputs, one line each: "train.lr: 0.001 -> 0.002", and the weights started
    from. Only the parts both hold are compared (a check before the weights exist compares the config alone)."""
    out: list[str] = []
    if "config" in old and "config" in new:
        old_leaves, new_leaves = _leaves(old["config"]), _leaves(new["config"])
        for key in sorted(set(old_leaves) | set(new_leaves)):
            if old_leaves.get(key, "(unset)") != new_leaves.get(key, "(unset)"):
                out.append(f"{key}: {old_leaves.get(key, '(unset)')!r} -> {new_leaves.get(key, '(unset)')!r}")
    if "init" in old and "init" in new and _weights_key(old["init"]) != _weights_key(new["init"]):
        out.append(f"the weights it starts from: {_weights_text(old['init'])} -> {_weights_text(new['init'])}")
    return out


def _leaves(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.update(_leaves(value, path) if isinstance(value, dict) and value else {path: value})
    return out


def _weights_key(identity: dict | None) -> tuple:
    return (None, None) if identity is None else (identity.get("init"), identity.get("sha256"))


def _weights_text(identity: dict | None) -> str:
    if identity is None:
        return "none (scratch)"
    digest = identity.get("sha256")
    return f"{identity['init']} ({identity.get('file')}, sha256 {digest[:12]})" if digest else \
        f"{identity['init']} (not there)"


# --------------------------------------------------------------------------- a stage's state


@dataclass
class StageState:
    """Where a stage stands: ``kind`` one of "new" (train it), "resume" (continue its last.pt), "done" (skip it),
    "changed" (refused: ``why``); ``record``: its stage.json."""

    kind: str
    why: list[str] = field(default_factory=list)
    record: dict | None = None


def read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RecipeError(f"{path}: not valid JSON ({err}); move it away to start again") from None
    return data if isinstance(data, dict) else None


def stage_state(p: PlannedStage, inputs: dict) -> StageState:
    """Where ``p`` stands against its ``inputs`` (``stage_inputs``, or ``{"config": ...}`` alone before the weights it
    starts from exist)."""
    run = p.run
    record = read_json(run.stage)
    if record is None:
        if not run.last.is_file():
            return StageState("new")
        saved = yaml.safe_load(run.config.read_text()) if run.config.is_file() else None
        differ = changes({"config": saved or {}}, {"config": inputs["config"]})
        differ = [d for d in differ if not d.startswith(("train.run_dir:", "train.init:"))]
        if differ:
            return StageState("changed", [f"{run} holds a run this recipe did not start, trained with another "
                                          f"config ({run.config}):", *differ])
        return StageState("resume")  # the same config: taken over, continued from its last.pt
    differ = changes(record.get("inputs", {}), inputs)
    if differ:
        return StageState("changed", differ, record)
    if record.get("finished"):
        held = (read_json(run.run_file) or {}).get("run_id")
        if held != record.get("run_id"):
            return StageState("changed", [f"{run.run_file}: the folder holds run {held}, not the run "
                                          f"{record.get('run_id')} the record finished (trained again outside the "
                                          "recipe?)"], record)
        return StageState("done", record=record)
    return StageState("resume" if run.last.is_file() else "new", record=record)


# --------------------------------------------------------------------------- child processes


@dataclass
class Child:
    code: int
    stdout: str
    wall_s: float
    signal: int | None  # the signal passed on to it, if any


def run_child(argv: tuple[str, ...] | list[str], capture: bool = False) -> Child:
    """``python -m captioner ARGV`` in the working folder, its stderr (and stdout, unless ``capture``) shown as it
    runs. A SIGTERM or SIGUSR1 reaching this process meanwhile is passed on to the child, which decides what to do
    (training saves and stops); the exit code is the child's (128 + the signal where it was killed by one)."""
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "captioner", *argv], text=True,
                             stdout=subprocess.PIPE if capture else None)
    received: list[int] = []

    def forward(signum: int, frame) -> None:
        received.append(signum)
        child.send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():  # only there can Python install handlers
        for name in FORWARDED_SIGNALS:
            if hasattr(signal, name):
                number = getattr(signal, name)
                previous[number] = signal.signal(number, forward)
    try:
        out, _ = child.communicate()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    code = child.returncode if child.returncode >= 0 else 128 - child.returncode
    return Child(code, out or "", time.monotonic() - started, received[0] if received else None)


# --------------------------------------------------------------------------- running a recipe


@dataclass
class _Run:
    """One `captioner recipe run`: the plan, what was asked, and where it stands."""

    recipe: Recipe
    planned: list[PlannedStage]
    say: Callable[[str], None]
    redo_from: int  # the first stage (1-based) to train afresh; past the last: none
    dry_run: bool
    trained: bool = False  # a stage ran (or would, in a dry run) in this call

    @property
    def recipe_argument(self) -> str:
        """How a command names this recipe: a shipped one by its name, another by its path; a study's variant with
        --variant."""
        shipped = shipped_recipes().get(self.recipe.name)
        named = self.recipe.name if shipped == self.recipe.path else shlex.quote(str(self.recipe.path))
        return named if self.recipe.variant is None else f"{named} --variant {self.recipe.variant}"

    def tell(self, text: str) -> None:
        """A line about the run (a dry run's are shell comments: its output is the commands, runnable as a script)."""
        self.say(f"{'# ' if self.dry_run else ''}[recipe {self.recipe.title}] {text}")


def run_recipe(recipe: Recipe, only: str | None = None, redo: str | None = None, dry_run: bool = False,
               say: Callable[[str], None] = print) -> int:
    """Run ``recipe``'s stages that are not done, then its evaluation; ``only``: that stage (or ``EVALUATE``) alone,
    the ones before it done; ``redo``: train that stage afresh, and those after it (``EVALUATE``: evaluate again);
    ``dry_run``: print the commands that would run, run nothing. Returns the exit code: 0, 1 for a refusal, or
    the code of the command that failed or was stopped."""
    planned = plan(recipe)
    steps = [p.name for p in planned] + [EVALUATE]
    for flag, name in (("--only", only), ("--redo", redo)):
        if name is not None and name not in steps:
            raise RecipeError(f"{flag} {name}: no such stage in {recipe.path} (its stages: {', '.join(steps)})")
    redo_from = steps.index(redo) + 1 if redo is not None else len(steps) + 1
    run = _Run(recipe, planned, say, redo_from, dry_run)
    kept = _kept_record(run) if only is None and redo is None else None
    if kept:
        run.tell(kept)
        return 0
    refused = _refusals_before_running(run, only)
    if refused:
        for line in refused:
            run.tell(line)
        return 1
    for p in planned:
        if only not in (None, p.name):
            continue
        code = _run_stage(run, p)
        if code:
            return code
    if only not in (None, EVALUATE):
        return 0
    return _evaluate(run)


def run_recipes(recipes: list[Recipe], only: str | None = None, redo: str | None = None, dry_run: bool = False,
                say: Callable[[str], None] = print) -> int:
    """``run_recipe`` for each of ``recipes`` (a study's variants) in turn, up to the first that fails."""
    for recipe in recipes:
        code = run_recipe(recipe, only=only, redo=redo, dry_run=dry_run, say=say)
        if code:
            return code
    return 0


def _kept_record(run: _Run) -> str | None:
    """Why a recipe whose record exists is left as it is, though its stages' records cannot say it is done: the
    record was written before recipes existed (by a study's driver), or its run folders are not in this working
    folder (a committed record, its runs trained elsewhere). None: the stages decide."""
    path = Path(run.recipe.record)
    record = read_json(path)
    if record is None:
        return None
    if "evaluation" not in record:
        return (f"recorded before recipes existed ({path}): kept; `captioner recipe run {run.recipe_argument} "
                f"--redo {run.planned[0].name if run.planned else EVALUATE}` measures it again")
    if run.planned and not any(p.run.root.exists() for p in run.planned):
        return (f"recorded ({path}, {str(record.get('provenance', {}).get('date', '?'))[:10]}); its run folders are "
                f"not here: kept; `captioner recipe run {run.recipe_argument} --redo {run.planned[0].name}` trains "
                "it again")
    return None


def _refusals_before_running(run: _Run, only: str | None) -> list[str]:
    """Before anything trains: the stages whose config changed since their record (and are not redone), and, with
    --only, a stage before it that is not done."""
    out = []
    for p in run.planned:
        if p.index >= run.redo_from:
            continue
        state = stage_state(p, {"config": config_to_dict(p.cfg)})
        if state.kind == "changed":
            out += _refusal(run, p, state)
    if only is not None and not out:
        for p in run.planned[: [q.name for q in run.planned].index(only) if only != EVALUATE else None]:
            if p.index < run.redo_from and stage_state(p, stage_inputs(p)).kind != "done":
                out.append(f"--only {only}: stage {p.name!r} before it is not done; run it first "
                           f"(captioner recipe run {run.recipe_argument} --only {p.name}, or without --only)")
                break
    return out


def _refusal(run: _Run, p: PlannedStage, state: StageState) -> list[str]:
    shown = state.why[:MAX_CHANGES_SHOWN] + ([f"... and {len(state.why) - MAX_CHANGES_SHOWN} more"]
                                             if len(state.why) > MAX_CHANGES_SHOWN else [])
    return ([f"stage {p.name!r}: refused: its inputs changed since its record ({p.run.stage}):"]
            + [f"  {line}" for line in shown]
            + [f"to train it again with the new inputs (and the stages after it, which start from its weights): "
               f"captioner recipe run {run.recipe_argument} --redo {p.name}"])


def _run_stage(run: _Run, p: PlannedStage) -> int:
    """One stage: skipped when done, else trained or continued; 0, 1 (refused) or the training's exit code."""
    head = f"stage {p.index}/{len(run.planned)} {p.name}"
    fresh = p.index >= run.redo_from
    if run.trained and run.dry_run:  # after a stage that would train: this one would start from new weights
        inputs, state = None, stage_state(p, {"config": config_to_dict(p.cfg)})
    else:
        inputs = stage_inputs(p)
        state = StageState("new") if fresh else stage_state(p, inputs)
    if run.trained and state.kind == "done":  # the weights it started from are being trained again
        state = StageState("changed", [f"stage {run.planned[p.index - 2].name!r} before it trains in this run: "
                                       "its record was made from earlier weights"], state.record)
    if state.kind == "done":
        run.tell(f"{head}: done ({format_duration(state.record.get('wall_s', 0.0))}, {p.run.stage}), skipped")
        return 0
    if state.kind == "changed":
        for line in _refusal(run, p, state):
            run.tell(line)
        return 1
    resume = state.kind == "resume"
    argv = p.resume_argv() if resume else p.argv
    run.trained = True
    if run.dry_run:
        run.tell(f"{head}: would {'continue from ' + str(p.run.last) if resume else 'train'}; "
                 f"{_budget_text(p, resume)}")
        run.say(command_line(argv))
        return 0
    run.tell(f"{head}: {'continues from ' + str(p.run.last) if resume else 'trains'}; {_budget_text(p, resume)}"
             + _later_budgets(run, p))
    run.tell(command_line(argv))
    record = {"stage": p.name, "recipe": str(run.recipe.path), "command": command_line(p.argv), "inputs": inputs,
              "started": now(), "wall_s": (state.record or {}).get("wall_s", 0.0) if resume else 0.0,
              "sessions": ((state.record or {}).get("sessions", []) if resume else [])}
    write_text_atomic(p.run.stage, json.dumps(record, indent=2))
    ran = commit()  # the checkout the child starts from (looked up after it, a checkout changed meanwhile would show)
    child = run_child(argv)
    record["wall_s"] += child.wall_s
    record["sessions"].append({"command": command_line(argv), "wall_s": child.wall_s, "exit": child.code,
                               "commit": ran})
    if child.code == 0:
        record.update(finished=now(), run_id=(read_json(p.run.run_file) or {}).get("run_id"))
    write_text_atomic(p.run.stage, json.dumps(record, indent=2))
    if child.code:
        why = f"stopped by {signal.Signals(child.signal).name}" if child.signal else f"failed (exit {child.code})"
        again = "continues it from its last.pt" if p.run.last.is_file() else "starts it again"
        run.tell(f"{head}: {why} after {format_duration(child.wall_s)}; `captioner recipe run {run.recipe_argument}` "
                 f"{again}")
        return child.code
    run.tell(f"{head}: done in {format_duration(child.wall_s)}")
    return 0


def _budget_text(p: PlannedStage, resume: bool) -> str:
    """The stage's time budget and what is left of it (a resumed run's earlier sessions count: Progress.elapsed_s),
    and its epochs (done, when resumed)."""
    t = p.cfg.train
    spent, done = 0.0, 0
    if resume:
        from captioner.store.checkpoint import load_checkpoint

        payload = load_checkpoint(p.run.last)
        spent, done = float(payload.get("elapsed_s", 0.0)), int(payload.get("epoch", 0))
    epochs = (f"{done} of at most {t.epochs} epochs done" if resume
              else f"at most {t.epochs} epoch{'s' if t.epochs != 1 else ''}")
    if not t.time_budget_s:
        return f"no time budget (train.time_budget_s 0), {epochs}"
    left = format_duration(max(t.time_budget_s - spent, 0.0))
    return (f"budget {format_duration(t.time_budget_s)} (train.time_budget_s), {left} left"
            + (f" ({format_duration(spent)} spent)" if resume else "") + f", {epochs}")


def _later_budgets(run: _Run, p: PlannedStage) -> str:
    later = [q.cfg.train.time_budget_s for q in run.planned[p.index:]]
    if not later:
        return ""
    budgets = (f"time budgets of {format_duration(sum(later))} in all" if all(later)
               else f"time budgets of {format_duration(sum(later))} and {later.count(0)} without" if any(later)
               else "no time budget")
    return f"; after it {len(later)} stage{'s' if len(later) > 1 else ''}, {budgets}"


def _evaluate(run: _Run) -> int:
    """The evaluation of the last stage's weights (``evaluate.gvd``: and at GVD's beams, with results files; with
    ``evaluate.default``: the paired intervals against that variant; with ``evaluate.compare``: that model evaluated
    alike, and the paired intervals against it) and the recipe's record; skipped when the record holds the same
    evaluation of the same weights (nothing to do)."""
    recipe = run.recipe
    weights = evaluated_weights(recipe, run.planned)
    argv = evaluation_argv(recipe, weights)
    compare_argv = evaluation_argv(recipe, weights, compared=True) if recipe.evaluation.compare else None
    record_path = Path(recipe.record)
    # what the evaluation reads: the command and the weights (their digest: stages trained in this call changed them)
    inputs = {"command": command_line(argv), "weights": weights_identity(weights)}
    if compare_argv is not None:
        inputs["compare"] = {"command": command_line(compare_argv),
                             "weights": weights_identity(recipe.evaluation.compare)}
    recorded = (read_json(record_path) or {}).get("evaluation", {}).get("inputs") == inputs
    if recorded and not run.trained and run.redo_from > len(run.planned) + 1:
        run.tell(f"every stage done and evaluated ({record_path}): nothing to do")
        return 0
    gvd_argv = [evaluation_argv(recipe, weights, beam) for beam in (GVD_BEAMS if recipe.evaluation.gvd else ())]
    if run.dry_run:
        what = "the last stage's weights" if run.planned else weights
        alike = f", and {recipe.evaluation.compare} alike for the paired intervals" if compare_argv else ""
        run.tell(f"{EVALUATE}: {what}{alike}, then the record {record_path}")
        for line in (argv, *gvd_argv, *([compare_argv] if compare_argv else [])):
            run.say(command_line(line))
        return 0
    if compare_argv is not None:
        recipe.results_dir.mkdir(parents=True, exist_ok=True)
    run.tell(f"{EVALUATE}: {command_line(argv)}")
    child = run_child(argv, capture=True)
    result = _evaluation_json(run, child)
    if result is None:
        return child.code or 1
    extra: dict = {}
    if gvd_argv:
        extra["gvd"] = {}
        for beam, line in zip(GVD_BEAMS, gvd_argv):
            results_file(recipe, beam).parent.mkdir(parents=True, exist_ok=True)
            run.tell(f"{EVALUATE} at beam {beam}, the per-photo results kept: {command_line(line)}")
            gvd_child = run_child(line, capture=True)
            figures = _evaluation_json(run, gvd_child)
            if figures is None:
                return gvd_child.code or 1
            extra["gvd"][f"beam{beam}"] = {**gvd_figures(figures), "command": command_line(line),
                                           "wall_s": gvd_child.wall_s}
    if recipe.evaluation.default is not None and recipe.evaluation.default != recipe.variant:
        extra["vs_default"] = _vs_default(run, result["tokenizer"])
    if compare_argv is not None:
        compared = _compared(run, compare_argv, result["tokenizer"])
        if isinstance(compared, int):
            return compared
        extra["compared"] = compared
    record = _record(run, result, inputs, child.wall_s, extra)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(record_path, json.dumps(record, indent=1) + "\n")
    s = result.get("scores", {})
    against = ""
    if "compared" in extra:
        from captioner.evaluation.paired import interval_text

        against = (f" (− {recipe.evaluation.compare}, paired 95 %: "
                   f"{interval_text(extra['compared']['paired']['CIDEr-D'])})")
    run.tell(f"done: {result.get('split')} beam {result.get('beam_size')}: BLEU-4 {score_text(s.get('BLEU-4'))}, "
             f"METEOR {score_text(s.get('METEOR'))}, CIDEr-D {score_text(s.get('CIDEr-D'))}{against}; stages and "
             f"evaluation {format_duration(record['wall_s'])}; record {record_path}")
    return 0


def _evaluation_json(run: _Run, child: Child) -> dict | None:
    if child.code:
        run.tell(f"{EVALUATE}: failed (exit {child.code})")
        return None
    try:
        return json.loads(child.stdout)
    except json.JSONDecodeError:
        run.tell(f"{EVALUATE}: printed no JSON:\n{child.stdout[-2000:]}")
        return None


def gvd_figures(result: dict) -> dict:
    """What a record keeps of one of ``evaluate.gvd``'s evaluations: scores, pointing, the words by class and GVD's
    exact IoU figures (evaluation/localization.py), the model's and the baselines'."""
    boxes = result.get("boxes") or {}
    loc = boxes.get("localization") or {}
    g = boxes.get("generated") or {}
    keep = ("accuracy", "f1_all", "f1_loc", "precision_all", "recall_all")

    def pick(figures: dict) -> dict:  # the model's figures by setting; a baseline's, flat
        flat = {**figures, **figures.get("teacher_forced", {}), **figures.get("generated", {})}
        return {k: flat.get(k) for k in keep}

    return {"scores": result["scores"], "pointing": g.get("pointing"), "centre_pointing": g.get("centre_pointing"),
            "inside": g.get("inside"), "word_classes": boxes.get("word_classes"),
            "vocabulary": loc.get("vocabulary"), "localization": pick(loc) if loc else None,
            "baselines": {m: pick(b) for m, b in loc.get("baselines", {}).items()} if loc else None}


def _vs_default(run: _Run, tokenizer: str) -> dict:
    """``evaluate.default``: every metric's paired interval against the study's default variant, from the two beam-3
    results files."""
    recipe = run.recipe
    (default,) = load_recipes(recipe.path, [recipe.evaluation.default])
    a = results_file(default, GVD_BEAMS[0])
    if not a.is_file():
        raise RecipeError(f"{a}: the default variant's results file is missing; run `captioner recipe run "
                          f"{run.recipe_argument.split(' --variant ')[0]} --variant {default.variant}` first")
    return _paired(run, a, results_file(recipe, GVD_BEAMS[0]), tokenizer)["metrics"]


def _compared(run: _Run, argv: tuple[str, ...], tokenizer: str) -> dict | int:
    """``evaluate.compare``: that model evaluated alike (``argv``), and every metric's paired interval of the
    recipe's results file against its; the exit code where its evaluation failed."""
    e = run.recipe.evaluation
    run.tell(f"{EVALUATE}: {e.compare} alike, for the paired intervals: {command_line(argv)}")
    child = run_child(argv, capture=True)
    result = _evaluation_json(run, child)
    if result is None:
        return child.code or 1
    paired = _paired(run, results_file(run.recipe, e.beam, compared=True), results_file(run.recipe, e.beam), tokenizer)
    return {"model": e.compare, "command": command_line(argv), "wall_s": child.wall_s, "result": result,
            **{k: paired[k] for k in ("A", "B", "references", "n_images", "resamples", "seed")},
            "paired": paired["metrics"]}


def _paired(run: _Run, a: Path, b: Path, tokenizer: str) -> dict:
    """Every metric's paired bootstrap interval of results file ``b`` against ``a`` (evaluation/paired.py: the
    comparison, its ``metrics`` each B − A), tokenized as the evaluation was."""
    from captioner.evaluation.paired import compare_files

    recipe = run.recipe
    references = recipe.evaluation.references or (run.planned[-1].cfg.data.captions if run.planned else None)
    if not references:
        raise RecipeError(f"{recipe.path}: variant {recipe.variant}: the paired intervals need the references: "
                          f"{EVALUATE}.references (a recipe without stages has no data.captions to read)")
    return compare_files(a, b, Path(references), split=recipe.evaluation.split, tokenizer=tokenizer,
                         meteor=recipe.evaluation.meteor)


def _record(run: _Run, result: dict, inputs: dict, wall_s: float, extra: dict) -> dict:
    """The recipe's record: the evaluation's figures (``captioner evaluate --json``'s, at the top), the commands and
    wall times of its stages and evaluation, the last stage's epochs, the machine and commit."""
    stages = []
    for p in run.planned:
        stage = read_json(p.run.stage) or {}
        stages.append({"name": p.name, "command": stage.get("command", command_line(p.argv)),
                       "run_dir": str(p.run), "weights": p.weights, "wall_s": stage.get("wall_s"),
                       "sessions": len(stage.get("sessions", [])), "finished": stage.get("finished"),
                       "commits": sorted({c for s in stage.get("sessions", []) if (c := s.get("commit"))}),
                       "run_id": stage.get("run_id")})
    train_s = sum(s["wall_s"] or 0.0 for s in stages)
    epochs = []
    if run.planned and run.planned[-1].run.metrics.is_file():
        epochs = [json.loads(line) for line in run.planned[-1].run.metrics.read_text().splitlines() if line.strip()]
    recipe = run.recipe
    return {**result, "name": recipe.variant or recipe.name, "recipe": recipe.name, "variant": recipe.variant,
            "recipe_file": str(recipe.path), "description": recipe.description, "info": dict(recipe.info),
            "train_commands": [s["command"] for s in stages], "evaluate_command": inputs["command"],
            "train_wall_s": train_s, "evaluate_wall_s": wall_s, "wall_s": train_s + wall_s,
            "last_stage_epochs": epochs, "stages": stages,
            "evaluation": {"command": inputs["command"], "wall_s": wall_s, "inputs": inputs}, **extra,
            "provenance": {"date": now(), "commit": commit(), "cpu": cpu_model(),
                           "python": platform.python_version()}}


def score_text(value: float | None) -> str:
    """A score to two decimals, "–" where the evaluation gave none (METEOR skipped)."""
    return "–" if value is None else f"{value:.2f}"
