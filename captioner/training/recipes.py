"""Recipes: the chain of runs behind a model, declared once (issue 72), and the exact commands that rebuild it.

A recipe is a YAML file, shipped in captioner/recipes/ as the configs are in captioner/configs/ (by name:
``captioner recipe list``), or any file by path. It names its stages in order, each a config with its overrides;
each stage after the first starts from the weights of the one before (``--init``: its run folder, which stands for
its best.pt, or its averaged.pt where it averages its last epochs); then the evaluation of the last stage's weights,
and where the record of that evaluation goes::

    description: one line: what the recipe rebuilds
    set: {train.num_threads: 1}          # optional: a --set for every stage (before each stage's own)
    stages:
      - config: flickr8k_soft            # a shipped config's name, or a .yaml path (relative to the recipe file)
      - config: flickr8k_soft_scst
        name: scst                       # optional: the stage's name (default: its config's file name)
        set: {train.lr: 1.0e-4}          # optional: each key=value a --set of `captioner train`
        average_last: 2                  # optional: averaged.pt, the mean of its last 2 epochs (what comes next reads)
    evaluate: {split: val, beam: 3, attention_mode: argmax, mirror_check: true,
               entities: data/flickr8k/flickr30k_entities, meteor: true,     # all optional; EVALUATION_DEFAULTS
               compare: flickr8k_soft}   # also evaluates this model alike: the record gives the paired intervals
    record: runs/recipes/NAME/record.json   # optional (this is the default)

A study is a recipe file with ``variants``: the runs of one table (the attention family, the grounding runs, the
training options), each a recipe of its own that writes its record to ``records/VARIANT.json``::

    description: ...
    set: {...}; stages: [...]; evaluate: {...}   # what every variant shares (a variant's own replace or extend them)
    records: docs/grounding/rows                 # the folder of the variants' records
    variants:
      probe_ft_w10:
        info: {label: ...}                       # optional: copied into its record (what its table calls it)
        set: {train.run_dir: "runs/grounding/{variant}"}   # added to every stage; {variant} is its name
        stages: [{config: flickr8k_soft_pointing_finetune}] # optional: instead of the shared stages
        evaluate: {gvd: true, default: shipped_soft}       # optional: over the shared evaluation
      shipped_soft:
        stages: []
        evaluate: {model: flickr8k_soft}         # no training: a model evaluated as it is

As in big_vision, where a config is code that names its pieces, and Hydra, whose configs compose named files with
overrides, a recipe only names: its stages are shipped configs plus ``--set``s, so an ablation of a recipe reads as a
diff, and the configs keep their own commands. A stage's config is a shipped config's name, or a file's path ending
in .yaml, relative to the recipe file (``config_file``); run folders, data, the boxes and the record belong to the
working folder, as for ``captioner train``.

This module reads a recipe, every key checked (an error names the file and the key, or the valid names), and plans
it: each stage's resolved config and command line (``plan``, ``describe``). Running the plan, stage by stage, with its
records, is recipe_runs.py's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from captioner.config import Config, ConfigError, load_config
from captioner.config_files import shipped_configs
from captioner.names import DECODING_MODES, SPLITS
from captioner.store.rundir import RunDir

# The recipes shipped with the package (pyproject.toml's package-data), usable by name.
RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"
EVALUATE = "evaluate"  # the step after the stages: what --only and --redo call the evaluation
RECORD_DEFAULT = "runs/recipes/{name}/record.json"
TOP_KEYS = ("description", "set", "stages", "evaluate", "record", "variants", "records")
STAGE_KEYS = ("config", "name", "set", "average_last")
VARIANT_KEYS = ("info", "set", "stages", "evaluate")
VARIANT = "{variant}"  # in a study's set values: the variant's name (its run folders)
STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RecipeError(ValueError):
    """A recipe that cannot be read or run as written: the message names the file and the key, or the valid names."""


@dataclass(frozen=True)
class Stage:
    """One training run of a recipe: ``config`` (as written) with ``sets`` (``key=value`` texts, the recipe's own
    first); ``average_last``: the recipe's word on averaging (None: the config's ``train.average_last``)."""

    name: str
    config: str
    sets: tuple[str, ...] = ()
    average_last: int | None = None


@dataclass(frozen=True)
class Evaluation:
    """How the last stage's weights are evaluated (``captioner evaluate``): ``attention_mode`` None decodes as the
    model's config says, ``entities`` a Flickr30k Entities folder for the box figures (None: the model's
    ``data.entities``, if any), ``meteor`` False skips METEOR (its Java start-up). ``model``: what a recipe without
    stages evaluates (a shipped model's name or a path). ``gvd``: GVD's exact figures too, at beam 3 and beam 1
    (GVD decodes with 1), each evaluation writing its per-photo results file (needs ``entities``). ``default``: the
    variant of the same study whose beam-3 results file the paired intervals compare against (needs ``gvd`` on
    both), with ``references`` the captions file they score against (None: the last stage's ``data.captions``).
    ``compare``: a model (a shipped name or a path) evaluated with the same arguments, both evaluations writing their
    per-photo results files, the record keeping its figures and the paired intervals (this recipe's − its): what a
    shipped model's recipe compares its rebuild with."""

    split: str = "val"
    beam: int = 3
    attention_mode: str | None = None
    mirror_check: bool = False
    entities: str | None = None
    meteor: bool = True
    model: str | None = None
    gvd: bool = False
    default: str | None = None
    references: str | None = None
    compare: str | None = None


EVALUATION_DEFAULTS = Evaluation()


@dataclass(frozen=True)
class Recipe:
    """One chain of runs and its evaluation: a recipe file's, or one variant of a study's (``variant`` its name)."""

    name: str  # the file's name (e.g. "flickr8k_soft", "grounding")
    path: Path
    description: str
    stages: tuple[Stage, ...]
    evaluation: Evaluation
    record: str  # the record's path, relative to the working folder unless absolute
    variant: str | None = None
    info: tuple[tuple[str, Any], ...] = ()  # a study variant's info: copied into its record

    @property
    def title(self) -> str:
        """How messages name it: "flickr8k_soft", or "grounding/probe_ft_w10" for a study's variant."""
        return self.name if self.variant is None else f"{self.name}/{self.variant}"

    @property
    def results_dir(self) -> Path:
        """Where its per-photo results files go (``evaluate.gvd``): runs/recipes/NAME/results, kept out of the tree."""
        return Path("runs/recipes") / self.name / "results"


def shipped_recipes() -> dict[str, Path]:
    """Name -> file of every recipe shipped with the package (e.g. "flickr8k_soft")."""
    return {p.stem: p for p in sorted(RECIPE_DIR.glob("*.yaml"))}


def find_recipe(text: str | Path) -> Path:
    """A recipe file: a path that exists, else a shipped recipe's name (``flickr8k_soft`` or ``flickr8k_soft.yaml``)."""
    path = Path(text)
    if path.is_file():
        return path
    shipped = shipped_recipes()
    name = path.stem if path.suffix in (".yaml", ".yml") and len(path.parts) == 1 else str(text)
    if name in shipped:
        return shipped[name]
    raise RecipeError(f"recipe not found: {text} (a file, or a shipped recipe: {', '.join(shipped)})")


def load_recipe(text: str | Path) -> Recipe:
    """The recipe ``text`` names (a file or a shipped name), every key checked; a study (a file with variants) is
    refused here: ``load_recipes`` reads its variants."""
    recipes = load_recipes(text)
    if recipes[0].variant is not None:
        raise RecipeError(f"{recipes[0].path}: a study of {len(recipes)} variants ({', '.join(_names(recipes))}); "
                          "name one with --variant")
    return recipes[0]


def load_recipes(text: str | Path, variants: list[str] | None = None) -> list[Recipe]:
    """The recipes a file holds: itself, or each of its variants (those named in ``variants``, in the file's
    order), every key checked."""
    path = find_recipe(text)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML ({err})") from None
    where = _Where(path)
    data = where.mapping(data, "the top level")
    where.known_keys(data, TOP_KEYS, "the top level")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise RecipeError(f"{path}: description: expected one line of text, got {description!r}")
    shared = _override_texts(where, data.get("set") or {}, "set")
    evaluate = where.mapping(data.get("evaluate") or {}, EVALUATE)
    if "variants" not in data:
        if "records" in data:
            raise RecipeError(f"{path}: records: a folder of variants' records, but the recipe has no variants "
                              "(its one record: record)")
        if variants:
            raise RecipeError(f"{path}: --variant {variants[0]}: the recipe has no variants")
        record = data.get("record", RECORD_DEFAULT.format(name=path.stem))
        if not isinstance(record, str) or not record.strip():
            raise RecipeError(f"{path}: record: expected the path of the record file, got {record!r}")
        stages = _read_stages(where, data.get("stages"), "stages", shared, evaluate)
        return [Recipe(path.stem, path, description, stages, _read_evaluation(where, evaluate, EVALUATE), record)]
    if "record" in data:
        raise RecipeError(f"{path}: record: a study writes one record per variant, in its records folder")
    records = data.get("records")
    if not isinstance(records, str) or not records.strip():
        raise RecipeError(f"{path}: records: expected the folder of the variants' records, got {records!r}")
    table = where.mapping(data["variants"], "variants")
    if not table:
        raise RecipeError(f"{path}: variants: expected at least one")
    unknown = [v for v in variants or [] if v not in table]
    if unknown:
        raise RecipeError(f"{path}: no variant is named {', '.join(map(repr, unknown))} (its variants: "
                          f"{', '.join(map(str, table))})")
    out = []
    for name, item in table.items():
        what = f"variants.{name}"
        if not isinstance(name, str) or not STAGE_NAME.match(name):
            raise RecipeError(f"{path}: {what}: {name!r} is no variant name (letters, digits, _ . -)")
        if variants and name not in variants:
            continue
        item = where.mapping(item or {}, what)
        where.known_keys(item, VARIANT_KEYS, what)
        own = shared + _override_texts(where, item.get("set") or {}, f"{what}.set")
        own = tuple(text.replace(VARIANT, name) for text in own)
        merged = {**evaluate, **where.mapping(item.get("evaluate") or {}, f"{what}.{EVALUATE}")}
        stages = _read_stages(where, item.get("stages", data.get("stages")), f"{what}.stages", own, merged)
        stages = tuple(dataclasses.replace(stage, sets=tuple(text.replace(VARIANT, name) for text in stage.sets))
                       for stage in stages)
        info = where.mapping(item.get("info") or {}, f"{what}.info")
        out.append(Recipe(path.stem, path, description, stages, _read_evaluation(where, merged, f"{what}.{EVALUATE}"),
                          str(Path(records) / f"{name}.json"), name, tuple(info.items())))
    for recipe in out:
        default = recipe.evaluation.default
        if default is not None and default not in table:
            raise RecipeError(f"{path}: variants.{recipe.variant}.{EVALUATE}.default: no variant is named "
                              f"{default!r}")
    return out


def _names(recipes: list[Recipe]) -> list[str]:
    return [r.variant or r.name for r in recipes]


def _read_stages(where: "_Where", stages_data: Any, what: str, shared: tuple[str, ...],
                 evaluate: dict) -> tuple[Stage, ...]:
    """A recipe's stages; none only where its evaluation names the model (``evaluate.model``)."""
    if stages_data == [] and evaluate.get("model"):
        return ()
    if not isinstance(stages_data, list) or not stages_data:
        raise RecipeError(f"{where.path}: {what}: expected a list of stages, each a mapping with a config (got "
                          f"{stages_data!r}; none at all only with {EVALUATE}.model, the model evaluated)")
    if evaluate.get("model"):
        raise RecipeError(f"{where.path}: {EVALUATE}.model: evaluates a given model, so the recipe has no stages "
                          f"(stages: []), but {what} lists {len(stages_data)}")
    stages = tuple(_read_stage(where, item, f"{what}[{i}]", shared) for i, item in enumerate(stages_data))
    names = [s.name for s in stages]
    for name in names:
        if names.count(name) > 1:
            raise RecipeError(f"{where.path}: {what}: two stages are named {name!r}; give each a name of its own "
                              "(name:)")
    return stages


@dataclass(frozen=True)
class _Where:
    """The recipe file being read: its errors name it."""

    path: Path

    def mapping(self, value: Any, what: str) -> dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{self.path}: {what}: expected a mapping, got {value!r}")
        return value

    def known_keys(self, data: dict, valid: tuple[str, ...], what: str) -> None:
        unknown = [str(k) for k in data if k not in valid]
        if unknown:
            raise RecipeError(f"{self.path}: {what}: unknown key {', '.join(map(repr, unknown))} (valid: "
                              f"{', '.join(valid)})")


def _read_stage(where: _Where, item: Any, what: str, shared: tuple[str, ...]) -> Stage:
    data = where.mapping(item, what)
    where.known_keys(data, STAGE_KEYS, what)
    config = data.get("config")
    if not isinstance(config, str) or not config:
        raise RecipeError(f"{where.path}: {what}.config: expected a config's name or path, got {config!r}")
    name = data.get("name", Path(config).stem)
    if not isinstance(name, str) or not STAGE_NAME.match(name) or name == EVALUATE:
        raise RecipeError(f"{where.path}: {what}.name: {name!r} is no stage name (letters, digits, _ . -; not "
                          f"{EVALUATE!r}, the evaluation's)")
    average = data.get("average_last")
    if average is not None and (isinstance(average, bool) or not isinstance(average, int) or average < 0):
        raise RecipeError(f"{where.path}: {what}.average_last: expected how many last epochs to average (0: none), "
                          f"got {average!r}")
    return Stage(name, config, shared + _override_texts(where, data.get("set") or {}, f"{what}.set"), average)


def _override_texts(where: _Where, sets: Any, what: str) -> tuple[str, ...]:
    """A ``set`` mapping (dotted key -> value) as ``--set`` texts, each value written as YAML reads it back."""
    sets = where.mapping(sets, what)
    texts = []
    for key, value in sets.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise RecipeError(f"{where.path}: {what}: {key!r} is no dotted config key (e.g. train.lr)")
        texts.append(f"{key}={_value_text(value)}")
    return tuple(texts)


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _read_evaluation(where: _Where, data: Any, what: str) -> Evaluation:
    data = where.mapping(data, what)
    keys = tuple(f.name for f in dataclasses.fields(Evaluation))
    where.known_keys(data, keys, what)
    evaluation = dataclasses.replace(EVALUATION_DEFAULTS, **data)
    beam = evaluation.beam
    checks = {"split": evaluation.split in SPLITS,
              "beam": isinstance(beam, int) and not isinstance(beam, bool) and beam > 0,
              "attention_mode": evaluation.attention_mode in (None, *DECODING_MODES),
              "mirror_check": isinstance(evaluation.mirror_check, bool),
              "entities": evaluation.entities is None or isinstance(evaluation.entities, str) and evaluation.entities,
              "meteor": isinstance(evaluation.meteor, bool),
              "model": evaluation.model is None or isinstance(evaluation.model, str) and evaluation.model,
              "gvd": isinstance(evaluation.gvd, bool) and (not evaluation.gvd or evaluation.entities),
              "default": evaluation.default is None or isinstance(evaluation.default, str) and evaluation.gvd,
              "references": evaluation.references is None or isinstance(evaluation.references, str)
              and evaluation.references,
              "compare": evaluation.compare is None or isinstance(evaluation.compare, str) and evaluation.compare}
    expected = {"split": f"one of {', '.join(SPLITS)}", "beam": "a beam width of 1 or more",
                "attention_mode": f"one of {', '.join(DECODING_MODES)} (or none: the model's)",
                "mirror_check": "true or false", "entities": "a Flickr30k Entities folder", "meteor": "true or false",
                "model": "a model's name or path", "gvd": "true or false (true needs entities: the boxes)",
                "default": "a variant's name (and gvd: true, whose results files the intervals read)",
                "references": "a captions file (the data set's, e.g. data/flickr8k/dataset_flickr8k.json)",
                "compare": "a model's name or path (the shipped model a recipe rebuilds)"}
    for key, ok in checks.items():
        if not ok:
            raise RecipeError(f"{where.path}: {what}.{key}: expected {expected[key]}, got "
                              f"{getattr(evaluation, key)!r}")
    return evaluation


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class PlannedStage:
    """A stage resolved: its config file, the config it trains with (the stage's ``--set``s and ``--init``
    applied, as `captioner train` applies them), and its command line (after ``captioner``)."""

    index: int  # 1-based
    stage: Stage
    config_file: Path
    cfg: Config
    init: str | None  # --init: the previous stage's weights (None: the first stage, its config's own train.init)
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.stage.name

    @property
    def run(self) -> RunDir:
        return RunDir(self.cfg.train.run_dir)

    @property
    def weights(self) -> str:
        """What the next stage starts from and the evaluation reads: averaged.pt when the run averages its last
        epochs, else the run folder (its best.pt)."""
        return str(self.run.averaged) if self.cfg.train.average_last else str(self.run)

    def resume_argv(self) -> tuple[str, ...]:
        """The command that continues this stage from its last.pt."""
        return (*self.argv, "--resume", str(self.run))


def plan(recipe: Recipe) -> list[PlannedStage]:
    """Every stage of ``recipe`` resolved, in order; a config that does not load, or two stages writing one run
    folder, is a RecipeError naming the stage."""
    planned: list[PlannedStage] = []
    for index, stage in enumerate(recipe.stages, 1):
        what = f"{recipe.path}: stage {stage.name!r} (config {stage.config})"
        try:
            file = config_file(stage.config, recipe.path)
            sets = list(stage.sets)
            cfg = load_config(file, sets)
            if stage.average_last is not None and _averaging_differs(cfg, stage.average_last):
                sets += (["train.keep_epochs=true"] if stage.average_last and not cfg.train.keep_epochs else []) + [
                    f"train.average_last={stage.average_last}"]
                cfg = load_config(file, sets)
        except ConfigError as err:
            raise RecipeError(f"{what}: {err}") from None
        if not cfg.train.run_dir:
            raise RecipeError(f"{what}: train.run_dir is empty; a stage needs a run folder of its own")
        init = planned[-1].weights if planned else None
        if init is not None:
            cfg.train.init = init  # as `captioner train --init` sets it
        for earlier in planned:
            if Path(earlier.cfg.train.run_dir) == Path(cfg.train.run_dir):
                raise RecipeError(f"{what}: writes {cfg.train.run_dir} (train.run_dir), as stage {earlier.name!r} "
                                  "does; give one a train.run_dir of its own in its set")
        argv = ("train", "--config", _config_argument(file), *[a for s in sets for a in ("--set", s)],
                *(("--init", init) if init is not None else ()))
        planned.append(PlannedStage(index, stage, file, cfg, init, argv))
    return planned


def config_file(text: str, recipe_path: Path) -> Path:
    """A stage's config: a file path (one ending in .yaml or .yml, or holding a folder), relative to the recipe file
    unless absolute; else a shipped config's name."""
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        path = path if path.is_absolute() else recipe_path.parent / path
        if not path.is_file():
            raise ConfigError(f"config file not found: {path} (a path in a recipe is relative to the recipe file)")
        return path
    shipped = shipped_configs()
    if text not in shipped:
        raise ConfigError(f"no shipped config is named {text!r} (shipped: {', '.join(shipped)}; a file: its path, "
                          "relative to the recipe file, ending in .yaml)")
    return shipped[text]


def _averaging_differs(cfg: Config, average_last: int) -> bool:
    t = cfg.train
    return t.average_last != average_last or bool(average_last) and not t.keep_epochs


def _config_argument(file: Path) -> str:
    """What ``--config`` says for ``file``: a shipped config by its name (it means the same from any folder), another
    file by its path (relative to the working folder when it lies under it)."""
    if shipped_configs().get(file.stem) == file:
        return file.stem
    return _shown_path(file)


def _shown_path(path: Path) -> str:
    path = path.resolve()
    cwd = Path.cwd().resolve()
    return os.path.relpath(path, cwd) if path.is_relative_to(cwd) else str(path)


def evaluated_weights(recipe: Recipe, planned: list[PlannedStage]) -> str:
    """What the evaluation reads: the last stage's weights, or the model a recipe without stages names."""
    return planned[-1].weights if planned else str(recipe.evaluation.model)


GVD_BEAMS = (3, 1)  # evaluate.gvd's beams: the reported one, and GVD's own


def results_file(recipe: Recipe, beam: int, compared: bool = False) -> Path:
    """The per-photo results file of a recipe's evaluation at ``beam`` (``evaluate.gvd``, ``evaluate.compare``);
    ``compared``: the compared model's."""
    return recipe.results_dir / f"{'compared' if compared else recipe.variant or recipe.name}.beam{beam}.json"


def evaluation_argv(recipe: Recipe, weights: str, gvd_beam: int | None = None,
                    compared: bool = False) -> tuple[str, ...]:
    """``captioner evaluate``'s arguments for the recipe's evaluation of ``weights`` (its JSON on stdout), with its
    results file where ``evaluate.compare`` reads it; ``gvd_beam``: one of ``evaluate.gvd``'s evaluations instead, at
    that beam with its results file and no mirror check; ``compared``: ``evaluate.compare``'s model instead of
    ``weights``, evaluated alike."""
    e = recipe.evaluation
    beam = e.beam if gvd_beam is None else gvd_beam
    results = (results_file(recipe, gvd_beam) if gvd_beam is not None
               else results_file(recipe, beam, compared) if e.compare else None)
    return ("evaluate", "--checkpoint", e.compare if compared else weights, "--split", e.split, "--beam", str(beam),
            *(("--attention-mode", e.attention_mode) if e.attention_mode else ()),
            *(("--mirror-check",) if e.mirror_check and gvd_beam is None else ()),
            *(("--entities", e.entities) if e.entities else ()),
            *(("--results-file", str(results)) if results is not None else ()),
            *(() if e.meteor else ("--no-meteor",)), "--json")


def command_line(argv: tuple[str, ...] | list[str]) -> str:
    """``argv`` as the command a person types (`captioner train ...`), quoted for a shell."""
    return "captioner " + shlex.join(argv)


def format_duration(seconds: float) -> str:
    """``3600`` -> "1 h 0 min", ``1400`` -> "23 min 20 s", ``5.2`` -> "5 s"."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def describe(recipe: Recipe, planned: list[PlannedStage]) -> str:
    """What ``captioner recipe show`` prints: every stage's config, overrides, run folder, start, budget, averaging
    and command; the evaluation's command; the record."""
    lines = [f"{recipe.title}: {recipe.description}", f"  file     {recipe.path}"]
    for p in planned:
        t = p.cfg.train
        start = (f"the weights of stage {planned[p.index - 2].name!r}: {p.init}" if p.init is not None
                 else f"train.init {t.init}" if t.init else "scratch")
        lines += [f"stage {p.index}/{len(planned)} {p.name}",
                  f"  config   {p.config_file}",
                  *[f"  set      {s}" for s in p.stage.sets],
                  f"  run      {p.run}",
                  f"  starts   from {start}",
                  f"  budget   {format_duration(t.time_budget_s) if t.time_budget_s else 'none'} "
                  f"(train.time_budget_s), at most {t.epochs} epoch{'s' if t.epochs != 1 else ''}",
                  f"  averages {f'the last {t.average_last} epochs: {p.run.averaged}' if t.average_last else 'no'}",
                  f"  command  {command_line(p.argv)}"]
    weights = evaluated_weights(recipe, planned)
    lines += [EVALUATE, f"  command  {command_line(evaluation_argv(recipe, weights))}",
              *[f"  gvd      {command_line(evaluation_argv(recipe, weights, beam))}"
                for beam in (GVD_BEAMS if recipe.evaluation.gvd else ())],
              *([f"  paired   against variant {recipe.evaluation.default!r} (its beam-3 results file)"]
                if recipe.evaluation.default else []),
              *([f"  compare  {command_line(evaluation_argv(recipe, weights, compared=True))}",
                 f"  paired   against {recipe.evaluation.compare} (both results files)"]
                if recipe.evaluation.compare else []),
              f"record     {recipe.record}"]
    return "\n".join(lines)
