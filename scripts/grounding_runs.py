"""The runs of issue 52 (attention measured on Flickr30k Entities boxes, and supervised with them), one after another,
resumable: a finished step is skipped, an interrupted training resumes from its last.pt.

    python scripts/grounding_runs.py run [--only NAME ...]   # train and evaluate what is not done yet
    python scripts/grounding_runs.py list                     # the steps and whether each is done
    python scripts/grounding_runs.py report                   # docs/grounding.md's tables from the rows

Each row is trained with `captioner train` and evaluated with
`captioner evaluate --split val --beam 3 --mirror-check --entities data/flickr8k/flickr30k_entities --json`;
its figures, commands and wall times go to docs/grounding/rows/NAME.json (docs/grounding.md is written from them).

The weight sweep trains configs/flickr8k_soft.yaml for 2 epochs (the attention family's budget) at
grounding_weight 0 (the control), 0.3, 1 and 3. The weight for the full recipe is then chosen by one rule, stated
before the sweep ran: the largest pointing figure among the weights whose val CIDEr-D is at most 1 below the
control's (ties: the smaller weight).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "docs" / "grounding" / "rows"
ENTITIES = "data/flickr8k/flickr30k_entities"
CAPTIONER = [sys.executable, "-m", "captioner"]
SWEEP = (0.0, 0.3, 1.0, 3.0)
# issue 71's probes: the shipped default trained on by its second SCST stage with the mass term, one change each
PROBE_BUDGET_S = 1150
PROBES = {
    "probe_ft_w10": ["train.objective.grounding_weight=10"],
    "probe_ft_w3": ["train.objective.grounding_weight=3"],
    # the scene beside the read (model.decoder.scene: mean), its weights widened from the default's at zero
    "probe_ft_w10_scene": ["train.objective.grounding_weight=10", "model.decoder.scene=mean"],
    # the visual sentinel (model.decoder.sentinel), added to the default's weights close to what it computed
    "probe_ft_w10_sentinel": ["train.objective.grounding_weight=10", "model.decoder.sentinel=true"],
}
# after the probes: the nearest candidate (weight 10) trained on for longer, to see where pointing and the captions go
CANDIDATE_BUDGET_S = {"ft_w10_long": 1800}
CANDIDATES = {"ft_w10_long": ["train.objective.grounding_weight=10"]}
# per-photo captions and box figures, beam 3 and beam 1: 200 kB a file, kept out of the tracked tree (its 38 MiB cap);
# the rows keep the intervals computed from them, and their commands write them again
RESULTS = ROOT / "runs" / "grounding" / "results"
DEFAULT_ROW = "shipped_soft"  # what a paired interval compares against


def sweep_name(weight: float) -> str:
    return f"sweep_w{weight:g}"


def chosen_weight() -> float | None:
    """The sweep's rule (module docstring), once every sweep row is done; None before."""
    rows = {w: _read(sweep_name(w)) for w in SWEEP}
    if any(r is None for r in rows.values()):
        return None
    control = rows[0.0]["scores"]["CIDEr-D"]
    fit = [(r["boxes"]["generated"]["pointing"], -w, w) for w, r in rows.items()
           if w > 0 and r["scores"]["CIDEr-D"] >= control - 1.0]
    return max(fit)[2] if fit else min(w for w in SWEEP if w > 0)


def _read(name: str) -> dict | None:
    path = ROWS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def steps() -> list[dict]:
    """Every step: a name, the training commands (none for a shipped model) and the model evaluated."""
    # shipped_hard's row (docs/grounding/rows/shipped_hard.json) is the flickr8k_hard shipped until 2026-12-05,
    # evaluated from its file then; the model shipped since is hard_pointing's, so no step evaluates the name again
    out = [{"name": "shipped_soft", "train": [], "model": "flickr8k_soft"},
           # the shipped model that points (issue 71 reads its words and maps beside the default's)
           {"name": "shipped_grounded", "train": [], "model": "flickr8k_grounded"}]
    for w in SWEEP:
        run = f"runs/grounding/{sweep_name(w)}"
        out.append({"name": sweep_name(w), "model": f"{run}/best.pt", "train": [[
            "train", "--config", "configs/flickr8k_soft.yaml", "--set", f"data.entities={ENTITIES}",
            "--set", f"train.objective.grounding_weight={w}", "--set", "train.epochs=2",
            "--set", f"train.run_dir={run}"]]})
    w = chosen_weight()
    out.append({"name": "soft_grounded", "model": "runs/flickr8k_soft_grounded/best.pt", "needs_weight": True,
                "train": [["train", "--config", "configs/flickr8k_soft_grounded.yaml",
                           "--set", f"train.objective.grounding_weight={w}"]]})
    out.append({"name": "soft_grounded_scst", "model": "runs/flickr8k_soft_grounded_scst/best.pt",
                "needs_weight": True,
                "train": [["train", "--config", "configs/flickr8k_soft_grounded_scst.yaml",
                           "--set", f"train.objective.grounding_weight={w}"]]})
    out.append({"name": "soft_grounded_scst_more", "model": "runs/flickr8k_soft_grounded_scst_more/averaged.pt",
                "needs_weight": True,
                "train": [["train", "--config", "configs/flickr8k_soft_grounded_scst_more.yaml",
                           "--set", f"train.objective.grounding_weight={w}"]]})
    out.append({"name": "hard_grounded", "model": "runs/flickr8k_hard_grounded_from_soft_scst_more/averaged.pt",
                "needs_weight": True,
                "train": [["train", "--config", f"configs/flickr8k_hard_grounded_from_soft{stage}.yaml",
                           "--set", f"train.objective.grounding_weight={w}"]
                          for stage in ("", "_scst", "_scst_more")]})
    # issue 62: the recipe for a default that scores and points (configs/flickr8k_soft_pointing*.yaml)
    out.append({"name": "soft_pointing", "model": "runs/flickr8k_soft_pointing/best.pt",
                "train": [["train", "--config", "configs/flickr8k_soft_pointing.yaml"]]})
    out.append({"name": "soft_pointing_scst_more", "model": "runs/flickr8k_soft_pointing_scst_more/averaged.pt",
                "train": [["train", "--config", f"configs/flickr8k_soft_pointing{stage}.yaml"]
                          for stage in ("", "_scst", "_scst_more")]})
    out.append({"name": "soft_pointing_finetune", "model": "runs/flickr8k_soft_pointing_finetune/averaged.pt",
                "train": [["train", "--config", "configs/flickr8k_soft_pointing_finetune.yaml"]]})
    # issue 71's probes: at most 20 minutes each (train.time_budget_s), the mean of the last 2 epochs
    for name, sets in {**PROBES, **CANDIDATES}.items():
        run = f"runs/grounding/{name}"
        budget = CANDIDATE_BUDGET_S.get(name, PROBE_BUDGET_S)
        out.append({"name": name, "model": f"{run}/averaged.pt", "train": [[
            "train", "--config", "configs/flickr8k_soft_pointing_finetune.yaml", "--set", f"train.run_dir={run}",
            "--set", f"train.time_budget_s={budget}", *[a for s in sets for a in ("--set", s)]]]})
    out.append({"name": "hard_pointing", "model": "runs/flickr8k_hard_pointing_from_soft_scst_more/averaged.pt",
                "train": [["train", "--config", f"configs/flickr8k_hard_pointing_from_soft{stage}.yaml"]
                          for stage in ("", "_scst", "_scst_more")]})
    return out


def _run_dir(command: list[str]) -> Path | None:
    """The run folder a ``captioner train`` command writes: its config's (over the config's bases) with its
    ``--set``s applied."""
    from captioner.config import load_config

    sets = [b for a, b in zip(command, command[1:]) if a == "--set"]
    run_dir = load_config(ROOT / command[command.index("--config") + 1], sets).train.run_dir
    return ROOT / run_dir if run_dir else None


def _train(command: list[str], log) -> float:
    run_dir = _run_dir(command)
    if run_dir is not None and (run_dir / "done.json").is_file():
        return json.loads((run_dir / "done.json").read_text())["wall_s"]
    resume = ["--resume", str(run_dir)] if run_dir is not None and (run_dir / "last.pt").is_file() else []
    start = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] captioner {' '.join(command + resume)}", flush=True)
    subprocess.run(CAPTIONER + command + resume, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - start
    if run_dir is not None:
        (run_dir / "done.json").write_text(json.dumps({"wall_s": wall, "command": command}))
    return wall


def run_step(step: dict, log) -> None:
    if _read(step["name"]) is not None:
        print(f"{step['name']}: done, skipped", flush=True)
        return
    if step.get("needs_weight") and chosen_weight() is None:
        print(f"{step['name']}: waits for the sweep", flush=True)
        return
    result = train_and_evaluate(step, log, ROWS)
    g = result["boxes"]["generated"]
    print(f"{step['name']}: CIDEr-D {result['scores']['CIDEr-D']:.2f}  pointing {100 * g['pointing']:.1f} "
          f"(centre {100 * g['centre_pointing']:.1f})  inside {g['inside']:.3f}  train {result['train_wall_s']:.0f}s",
          flush=True)


EPOCH_KEYS = ("epoch", "CIDEr-D", "BLEU-4", "train_reward", "train_greedy_reward", "train_xe", "val_loss",
              "time_s")


def _epoch_figures(command: list[str]) -> list[dict]:
    """The per-epoch figures of ``command``'s run (its metrics.jsonl: greedy validation, the training reward), kept
    in the row: how a stage moved, which the final evaluation alone does not say."""
    run_dir = _run_dir(command)
    metrics = run_dir / "metrics.jsonl" if run_dir is not None else None
    if metrics is None or not metrics.is_file():
        return []
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [{k: e[k] for k in EPOCH_KEYS if k in e} for e in lines]


def results_path(name: str, beam: int) -> Path:
    return RESULTS / f"{name}.beam{beam}.json"


def gvd_figures(result: dict) -> dict:
    """The figures of one evaluation kept beside a row: scores, pointing and GVD's exact IoU figures."""
    loc = result["boxes"].get("localization") or {}
    g = result["boxes"]["generated"]
    keep = ("accuracy", "f1_all", "f1_loc", "precision_all", "recall_all")

    def pick(figures: dict) -> dict:  # the model's figures by setting; a baseline's, flat
        flat = {**figures, **figures.get("teacher_forced", {}), **figures.get("generated", {})}
        return {k: flat.get(k) for k in keep}

    return {"scores": result["scores"], "pointing": g["pointing"], "centre_pointing": g["centre_pointing"],
            "inside": g["inside"], "word_classes": result["boxes"].get("word_classes"),
            "vocabulary": loc.get("vocabulary"), "localization": pick(loc) if loc else None,
            "baselines": {m: pick(b) for m, b in loc.get("baselines", {}).items()} if loc else None}


def evaluate_with_results(name: str, model: str, beam: int, mirror: bool) -> tuple[dict, list[str], float]:
    """``captioner evaluate`` of ``model`` on val with the boxes at ``beam``, its results file (per-photo captions and
    box figures) written to docs/grounding/results/: (the summary, the command, its wall time)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = ["evaluate", "--checkpoint", model, "--split", "val", "--beam", str(beam),
               *(["--mirror-check"] if mirror else []), "--entities", ENTITIES,
               "--results-file", str(results_path(name, beam).relative_to(ROOT)), "--json"]
    start = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] captioner {' '.join(command)}", flush=True)
    done = subprocess.run(CAPTIONER + command, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout), command, time.time() - start


def add_gvd(name: str, model: str) -> None:
    """Beside a finished row: GVD's exact figures at beam 3 and beam 1 (GVD decodes with beam 1), each with its
    results file, and the paired intervals against the default (evaluation/paired.py). The row's own figures stay as
    they were measured."""
    row = _read(name)
    if row is None or "gvd" in row:
        return
    gvd = {}
    for beam in (3, 1):
        result, command, wall = evaluate_with_results(name, model, beam, mirror=False)
        gvd[f"beam{beam}"] = {**gvd_figures(result), "command": " ".join(["captioner", *command]),
                              "wall_s": wall}
    row["gvd"] = gvd
    (ROWS / f"{name}.json").write_text(json.dumps(row, indent=1))


def add_interval(name: str) -> None:
    """The row's paired bootstrap intervals against the default (beam 3 results files): every metric."""
    from captioner.evaluation.paired import compare_files

    row = _read(name)
    if row is None or name == DEFAULT_ROW or "vs_default" in row:
        return
    a, b = results_path(DEFAULT_ROW, 3), results_path(name, 3)
    if not (a.is_file() and b.is_file()):
        return
    compared = compare_files(a, b, ROOT / "data/flickr8k/dataset_flickr8k.json", split="val", tokenizer="ptb")
    row["vs_default"] = compared["metrics"]
    (ROWS / f"{name}.json").write_text(json.dumps(row, indent=1))


def train_and_evaluate(step: dict, log, rows: Path) -> dict:
    """Train ``step`` (each of its commands, resumed where interrupted), evaluate its model on val with the box
    and mirror figures, and write the row (figures, commands, wall times) to ``rows``/NAME.json."""
    train_s = sum(_train(c, log) for c in step["train"])
    evaluate = ["evaluate", "--checkpoint", step["model"], "--split", "val", "--beam", "3", "--mirror-check",
                "--entities", ENTITIES, "--json"]
    start = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] captioner {' '.join(evaluate)}", flush=True)
    done = subprocess.run(CAPTIONER + evaluate, cwd=ROOT, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout)
    result.update({"train_commands": [" ".join(["captioner", *c]) for c in step["train"]],
                   "evaluate_command": " ".join(["captioner", *evaluate]), "train_wall_s": train_s,
                   "evaluate_wall_s": time.time() - start,
                   "last_stage_epochs": _epoch_figures(step["train"][-1]) if step["train"] else []})
    rows.mkdir(parents=True, exist_ok=True)
    (rows / f"{step['name']}.json").write_text(json.dumps(result, indent=1))
    return result


LABELS = {
    "shipped_soft": "shipped `flickr8k_soft` (soft: XE, SCST, SCST, averaged)",
    "shipped_hard": "`flickr8k_hard` as shipped until 2026-12-05 (hard from soft: XE, SCST, SCST, averaged; argmax)",
    "soft_grounded": "soft, XE (8 epochs) with supervised attention",
    "soft_grounded_scst": "soft, XE then SCST, both with supervised attention",
    "soft_grounded_scst_more": "soft, the shipped recipe (XE, SCST, SCST, averaged) with supervised attention",
    "hard_grounded": "hard from that model, the shipped hard chain (LOO, SCST, SCST, averaged) with supervision",
    "soft_pointing": "soft, XE (8 epochs) with label smoothing, scheduled sampling and the mass term, no penalty",
    "soft_pointing_scst_more": "soft, that XE stage then SCST, SCST (averaged), the mass term kept throughout",
    "soft_pointing_finetune": "soft, the shipped `flickr8k_soft` then SCST (as its second stage) with the mass term",
    "hard_pointing": "hard from the pointing soft model, the shipped hard chain (LOO, SCST, SCST, averaged), mass term "
                     "(shipped as `flickr8k_hard` since 2026-12-05)",
    **{sweep_name(w): f"soft, XE 2 epochs, grounding_weight {w:g}" + (" (control)" if w == 0 else "") for w in SWEEP},
    "shipped_grounded": "shipped `flickr8k_grounded` (soft: the shipped recipe with Liu et al.'s term, int8)",
    "probe_ft_w10": "probe: the default then 2 SCST epochs (as its second stage) with the mass term at weight 10",
    "probe_ft_w3": "probe: the default then 2 SCST epochs with the mass term at weight 3",
    "probe_ft_w10_scene": "probe: as at weight 10, with the scene beside the read (`model.decoder.scene: mean`)",
    "probe_ft_w10_sentinel": "probe: as at weight 10, with the visual sentinel (`model.decoder.sentinel: true`)",
    "ft_w10_long": "the default then SCST (as its second stage) with the mass term at weight 10 for 30 minutes",
}
TABLE_START, TABLE_END = "<!-- grounding-table:start -->", "<!-- grounding-table:end -->"


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def iou_figures(r: dict) -> str:
    """GVD's figures of a row (evaluation/localization.py), each beside the whole photo's and the centre cell's
    box on the same words: teacher-forced accuracy per class, F1_all, F1_loc; '-' for a row evaluated before
    they existed."""
    loc = r["boxes"].get("localization")
    if not loc:
        return "-"
    base = loc["baselines"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    def fig(model: float | None, key: str) -> str:
        mark = "-" if model is None else f"{pct(model)} %"
        return f"{mark} ({pct(base['whole_photo'][key])} / {pct(base['centre_cell'][key])} %)"

    # rows evaluated before issue 71 hold the project's earlier variant (no "vocabulary" key): marked, see the note
    mark = "" if "vocabulary" in loc else " †"
    return (f"{fig(loc['teacher_forced']['accuracy'], 'accuracy')} / {fig(loc['generated']['f1_all'], 'f1_all')} / "
            f"{fig(loc['generated']['f1_loc'], 'f1_loc')}{mark}")


def movement(r: dict) -> str:
    """Cells per caption, the share of words whose peak cell moves, the mean α maximum."""
    return f"{r['cells_per_caption']:.2f}, {100 * r['cell_changes']:.1f} %, {r['alpha_max']:.3f}"


def format_report() -> str:
    """The page's generated part: captions, box figures (generated and teacher-forced, with their baselines), GVD's
    IoU figures, movement and mirror figures and wall times of every finished row, then the generated figures by
    phrase type."""
    rows = [(name, r) for name in LABELS if (r := _read(name)) is not None]
    lines = ["| model | BLEU-4 | METEOR | CIDEr-D | own captions: words / α inside (uniform, mean map) / pointing "
             "(mean map, centre) | references, teacher-forced: α inside (uniform, mean map) / pointing (centre) "
             "| IoU > 0.5: teacher-forced accuracy / F1_all / F1_loc (whole photo / centre cell) "
             "| cells/caption, cell changes, α max | mirror: α / columns / stay | train + evaluate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        g, t, s = r["boxes"]["generated"], r["boxes"]["teacher_forced"], r["scores"]
        lines.append(
            f"| {LABELS[name]} | {s['BLEU-4']:.1f} | {s['METEOR']:.1f} | {s['CIDEr-D']:.1f} | "
            f"{g['words']:,} / {g['inside']:.3f} ({g['uniform']:.3f}, {g['mean_map']:.3f}) / "
            f"**{100 * g['pointing']:.1f} %** ({100 * g['mean_map_pointing']:.1f}, "
            f"{100 * g['centre_pointing']:.1f} %) | "
            f"{t['inside']:.3f} ({t['uniform']:.3f}, {t['mean_map']:.3f}) / {100 * t['pointing']:.1f} % "
            f"({100 * t['centre_pointing']:.1f} %) | {iou_figures(r)} | {movement(r)} | "
            f"{100 * r['mirror_follow']:.1f} % / "
            f"{100 * r['columns_mirror']:.1f} % / {100 * r['columns_stay']:.1f} % | "
            f"{minutes(r['train_wall_s']) if r['train_commands'] else 'shipped'} + {minutes(r['evaluate_wall_s'])} |")
    lines += ["", "By phrase type, own captions: pointing (centre cell) and words", "",
              "| model | " + " | ".join(("people", "animals", "clothing", "body parts", "scene", "vehicles", "other"))
              + " |", "|---" * 8 + "|"]
    for name, r in rows:
        by = r["boxes"]["generated"]["by_type"]
        cells = [f"{100 * by[k]['pointing']:.1f} ({100 * by[k]['centre_pointing']:.1f}) n={by[k]['words']}"
                 if k in by else "-" for k in ("people", "animals", "clothing", "body parts", "scene", "vehicles",
                                               "other")]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    lines += ["", "Commands:", ""]
    for name, r in rows:
        lines.append(f"- {LABELS[name]}: " + "; ".join(f"`{c}`" for c in r["train_commands"] + [r["evaluate_command"]]))
    return "\n".join(lines)


def replace_between(doc: Path, start_marker: str, end_marker: str, body: str) -> None:
    """Put ``body`` between the two marker lines of ``doc`` (the page's generated part), the rest kept."""
    text = doc.read_text()
    if start_marker not in text or end_marker not in text:
        raise SystemExit(f"{doc}: the markers {start_marker} and {end_marker} are missing")
    start, end = text.index(start_marker) + len(start_marker), text.index(end_marker)
    doc.write_text(text[:start] + "\n" + body + "\n" + text[end:])


# issue 71's table: the default, the model that points, and every candidate, with the rule that decides
PROBE_TABLE_START, PROBE_TABLE_END = "<!-- probe-table:start -->", "<!-- probe-table:end -->"
PROBE_ROWS = ("shipped_soft", "shipped_grounded", "soft_pointing_scst_more", "soft_pointing_finetune", "probe_ft_w3",
              "probe_ft_w10", "probe_ft_w10_scene", "probe_ft_w10_sentinel", "ft_w10_long")
# The rule, fixed before any of issue 71's runs (its point 3): pointing at least 12 points above the centre cell,
# alpha inside at least 0.70, at most 1.0 CIDEr-D and 0.3 METEOR below the current default
RULE_MARGIN, RULE_INSIDE, RULE_CIDER, RULE_METEOR = 12.0, 0.70, 1.0, 0.3


def rule_verdict(row: dict, default: dict) -> str:
    """'qualifies', or each figure that misses and by how much."""
    g, s, d = row["boxes"]["generated"], row["scores"], default["scores"]
    margin = 100 * (g["pointing"] - g["centre_pointing"])
    misses = []
    if margin < RULE_MARGIN:
        misses.append(f"pointing {margin:+.1f} (needs +{RULE_MARGIN:g}: {RULE_MARGIN - margin:.1f} short)")
    if g["inside"] < RULE_INSIDE:
        misses.append(f"inside {g['inside']:.3f} (needs {RULE_INSIDE:.2f}: {RULE_INSIDE - g['inside']:.3f} short)")
    if s["CIDEr-D"] < d["CIDEr-D"] - RULE_CIDER:
        misses.append(f"CIDEr-D {s['CIDEr-D'] - d['CIDEr-D']:+.2f} (at most -{RULE_CIDER:g})")
    if s["METEOR"] < d["METEOR"] - RULE_METEOR:
        misses.append(f"METEOR {s['METEOR'] - d['METEOR']:+.2f} (at most -{RULE_METEOR:g})")
    return "qualifies" if not misses else "misses: " + "; ".join(misses)


def _classes(row: dict, key: str, spec: str) -> str:
    """object · scene · other of the row's word-class figures (beam 3), '-' where not measured."""
    classes = row.get("gvd", {}).get("beam3", {}).get("word_classes")
    if not classes:
        return "-"
    names = ("object", "scene") if key == "recall" else ("object", "scene", "other")
    return " · ".join("-" if classes[c].get(key) is None else format(classes[c][key], spec) for c in names)


def _looked(row: dict) -> str:
    """How much each class of words looked at the photo: only a model with the visual sentinel says (else '-')."""
    sentinel = any("decoder.sentinel=true" in c for c in row.get("train_commands", []))
    return _classes(row, "looked", ".3f") if sentinel else "-"


def _gvd(row: dict, beam: int) -> str:
    """GVD's F1_all / F1_loc (%) at ``beam``, beside the whole photo's and the centre cell's F1_all."""
    figures = row.get("gvd", {}).get(f"beam{beam}")
    if not figures or not figures.get("localization"):
        return "-"
    loc, base = figures["localization"], figures["baselines"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}"

    return (f"{pct(loc['f1_all'])} / {pct(loc['f1_loc'])} ({pct(base['whole_photo']['f1_all'])} / "
            f"{pct(base['centre_cell']['f1_all'])})")


def _interval(row: dict, metric: str, digits: int = 2) -> str:
    from captioner.evaluation.paired import interval_text

    m = row.get("vs_default", {}).get(metric)
    return "-" if m is None else interval_text(m, digits)


def format_probes(rows: dict[str, dict]) -> str:
    """Issue 71's table: scores, the paired interval against the default, pointing over the centre cell and alpha
    inside, the words by class (per caption, consensus recall, alpha entropy), GVD's figures at beam 1 and 3, and
    the rule's verdict, for each row of PROBE_ROWS that is done."""
    default = rows.get(DEFAULT_ROW)
    lines = ["| model | BLEU-4 / METEOR / CIDEr-D | CIDEr-D − default, paired 95 % | pointing − centre (pointing, "
             "centre) [margin − default's, paired 95 %] | α inside | teacher-forced pointing − centre (the goal: +8) "
             "| words per caption: object · scene · other | consensus recall: object · scene | α entropy: object · "
             "scene · other | on the photo (the sentinel): object · scene · other | GVD F1_all / F1_loc, beam 1 (whole "
             "photo / centre F1_all) | the same, beam 3 | the rule | train |",
             "|---" * 14 + "|"]
    for name in PROBE_ROWS:
        r = rows.get(name)
        if r is None or default is None:
            continue
        g, s, t = r["boxes"]["generated"], r["scores"], r["boxes"].get("teacher_forced")
        margin = 100 * (g["pointing"] - g["centre_pointing"])
        taught = "-" if not t or t.get("pointing") is None else (
            f"{100 * (t['pointing'] - t['centre_pointing']):+.1f} ({100 * t['pointing']:.1f}, "
            f"{100 * t['centre_pointing']:.1f} %)")
        lines.append(
            f"| {LABELS[name]} | {s['BLEU-4']:.1f} / {s['METEOR']:.1f} / {s['CIDEr-D']:.2f} | "
            f"{_interval(r, 'CIDEr-D') if name != DEFAULT_ROW else 'the default'} | "
            f"{margin:+.1f} ({100 * g['pointing']:.1f}, {100 * g['centre_pointing']:.1f} %) "
            f"[{_interval(r, 'pointing - centre', 1)}] | {g['inside']:.3f} | {taught} | "
            f"{_classes(r, 'words_per_caption', '.2f')} | "
            f"{_classes(r, 'recall', '.3f')} | {_classes(r, 'entropy', '.3f')} | {_looked(r)} | {_gvd(r, 1)} | "
            f"{_gvd(r, 3)} | "
            f"{rule_verdict(r, default) if name != DEFAULT_ROW else '-'} | "
            f"{minutes(r['train_wall_s']) if r['train_commands'] else 'shipped'} |")
    lines += ["", "Commands (and each row's beam-3 and beam-1 evaluations with their results files):", ""]
    for name in PROBE_ROWS:
        r = rows.get(name)
        if r is None:
            continue
        extra = [v["command"] for v in r.get("gvd", {}).values()]
        lines.append(f"- {LABELS[name]}: " + "; ".join(f"`{c}`" for c in r["train_commands"] + [r["evaluate_command"]]
                                                         + extra))
    return "\n".join(lines)


def write_report(doc: Path = ROOT / "docs" / "grounding.md") -> None:
    replace_between(doc, TABLE_START, TABLE_END, format_report())
    text = doc.read_text()
    if PROBE_TABLE_START in text:
        replace_between(doc, PROBE_TABLE_START, PROBE_TABLE_END,
                        format_probes({name: r for name in PROBE_ROWS if (r := _read(name)) is not None}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("run", "gvd", "list", "report"),
                        help="gvd: GVD's figures at beam 3 and 1 with results files, and the paired intervals against "
                             "the default, for finished rows whose model is here (a shipped name, or its run)")
    parser.add_argument("--only", nargs="+", default=None, help="step names")
    parser.add_argument("--log", default="runs/grounding/train.log", help="where the training output goes")
    args = parser.parse_args(argv)
    if args.phase == "report":
        write_report()
        return 0
    if args.phase == "list":
        for step in steps():
            print(f"{step['name']:<22} {'done' if _read(step['name']) else 'to do'}")
        return 0
    if args.phase == "gvd":
        chosen = [step for step in steps() if args.only is None or step["name"] in args.only]
        chosen.sort(key=lambda step: step["name"] != DEFAULT_ROW)  # the default first: the others compare to it
        for step in chosen:
            if step["model"].startswith("runs/") and not (ROOT / step["model"]).is_file():
                print(f"{step['name']}: {step['model']} is not here, skipped", flush=True)
                continue
            add_gvd(step["name"], step["model"])
            add_interval(step["name"])
        return 0
    (ROOT / args.log).parent.mkdir(parents=True, exist_ok=True)
    with open(ROOT / args.log, "a") as log:
        for name in [step["name"] for step in steps()]:
            # built again for each step: a step after the sweep takes the weight the sweep's rule chose
            step = next(s for s in steps() if s["name"] == name)
            if args.only is None or name in args.only:
                run_step(step, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
