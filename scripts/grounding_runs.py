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
    out = [{"name": "shipped_soft", "train": [], "model": "flickr8k_soft"}]
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
                   "evaluate_wall_s": time.time() - start, "last_stage_epochs": _epoch_figures(step["train"][-1])})
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

    return (f"{fig(loc['teacher_forced']['accuracy'], 'accuracy')} / {fig(loc['generated']['f1_all'], 'f1_all')} / "
            f"{fig(loc['generated']['f1_loc'], 'f1_loc')}")


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


def write_report(doc: Path = ROOT / "docs" / "grounding.md") -> None:
    replace_between(doc, TABLE_START, TABLE_END, format_report())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("run", "list", "report"))
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
