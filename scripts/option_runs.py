"""The runs of issue 55 (the training options researchers expect), one after another, resumable as
scripts/grounding_runs.py's (whose training and resume steps it uses): a finished step is skipped, an interrupted
training resumes from its last.pt.

    python scripts/option_runs.py run [--only NAME ...]   # train and evaluate what is not done yet
    python scripts/option_runs.py list                     # the steps and whether each is done
    python scripts/option_runs.py report                   # docs/training-options.md's run tables from the rows

Every cross-entropy row trains configs/flickr8k_soft.yaml, the shipped recipe's first stage, at its own budget
(8 epochs, one hour), with one option changed; `xe_control` is the same run without it. Up-Down runs the whole
shipped soft recipe (XE, SCST, SCST, averaged: configs/flickr8k_updown*.yaml), against the shipped flickr8k_soft
(docs/grounding/rows/shipped_soft.json, evaluated the same way); `updown_xe` evaluates its cross-entropy stage alone,
against `xe_control`. The `updown_probe_*` steps each train one SCST epoch of Up-Down from that cross-entropy stage
with one factor of the collapsed first stage changed (the learning rate, the XE term, the baseline): why it collapses.
Each is evaluated with `captioner evaluate --split val --beam 3 --mirror-check --entities
data/flickr8k/flickr30k_entities --json`; its figures, commands and wall times go to
docs/training-options/rows/NAME.json. Diverse beam search needs no training: scripts/diverse_beam.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grounding_runs import ROOT, iou_figures, minutes, movement, replace_between, train_and_evaluate

ROWS = ROOT / "docs" / "training-options" / "rows"
GROUNDING = ROOT / "docs" / "grounding" / "rows"
XE = "configs/flickr8k_soft.yaml"
SCHEDULE = ["train.objective.scheduled_sampling_start=0", "train.objective.scheduled_sampling_increase_every=1",
            "train.objective.scheduled_sampling_increase_prob=0.05", "train.objective.scheduled_sampling_max_prob=0.25"]


def _xe(name: str, *sets: str) -> dict:
    sets_ = [item for key in sets for item in ("--set", key)]
    return {"name": name, "model": f"runs/options/{name}/best.pt",
            "train": [["train", "--config", XE, "--set", f"train.run_dir=runs/options/{name}", *sets_]]}


def steps() -> list[dict]:
    return [
        _xe("xe_control"),
        _xe("label_smoothing_0.1", "train.objective.label_smoothing=0.1"),
        _xe("label_smoothing_0.2", "train.objective.label_smoothing=0.2"),
        _xe("scheduled_sampling", *SCHEDULE),
        {"name": "updown_xe", "model": "runs/flickr8k_updown/best.pt",
         "train": [["train", "--config", "configs/flickr8k_updown.yaml"]]},
        _updown_recipe("updown", ""),
        _updown_recipe("updown_steady", "_steady"),
        _updown_recipe("updown_tempered", "_tempered"),
        *(_probe(name, *sets) for name, (sets, _) in PROBES.items()),
    ]


def _updown_recipe(name: str, variant: str) -> dict:
    """Up-Down's cross-entropy stage, then flickr8k_updown_scst{variant}.yaml and _scst{variant}_more.yaml; the last
    stage's averaged model is evaluated."""
    stages = ("", f"_scst{variant}", f"_scst{variant}_more")
    return {"name": name, "model": f"runs/flickr8k_updown{stages[-1]}/averaged.pt",
            "train": [["train", "--config", f"configs/flickr8k_updown{stage}.yaml"] for stage in stages]}


# Why Up-Down's first SCST stage collapses (issue 62): its first epoch from the cross-entropy stage
# (runs/flickr8k_updown, trained by `updown_steady`'s first command) with one factor changed at a time
PROBES = {
    "updown_probe_base": ((), "as `flickr8k_updown_scst` (lr 1e-4, no XE term, mean baseline)"),
    "updown_probe_lr": (("train.lr=5e-5",), "lr 5e-5"),
    "updown_probe_xe": (("train.objective.xe_weight=0.1",), "the 0.1 XE term"),
    "updown_probe_lr_xe": (("train.lr=5e-5", "train.objective.xe_weight=0.1"),
                           "lr 5e-5 and the 0.1 XE term (`_scst_steady`'s first epoch)"),
    "updown_probe_greedy": (("train.objective.baseline=greedy",), "the greedy caption's reward as baseline"),
    "updown_probe_temperature": (("train.objective.sample_temperature=0.7",),
                                 "captions sampled at temperature 0.7 (softmax(logits / 0.7))"),
}


def _probe(name: str, *sets: str) -> dict:
    """One SCST epoch of Up-Down from its cross-entropy stage (lr_schedule none: the stage's first epoch)."""
    sets_ = [item for key in (f"train.run_dir=runs/options/{name}", "train.epochs=1", *sets) for item in ("--set", key)]
    return {"name": name, "model": f"runs/options/{name}/best.pt",
            "train": [["train", "--config", "configs/flickr8k_updown_scst.yaml", *sets_]]}


LABELS = {
    "xe_control": "`xe_control` (no option)",
    "label_smoothing_0.1": "label smoothing 0.1",
    "label_smoothing_0.2": "label smoothing 0.2",
    "scheduled_sampling": "scheduled sampling (from epoch 0, +0.05 per epoch, at most 0.25)",
    "updown_xe": "Up-Down, `flickr8k_updown.yaml` (the XE stage with `decoder.kind: updown`)",
    "soft_pointing": "label smoothing 0.1 + scheduled sampling + the mass grounding term, no doubly stochastic "
                     "penalty (`flickr8k_soft_pointing.yaml`; issue 62, docs/grounding.md)",
}
RECIPE_LABELS = {"shipped_soft": "shipped `flickr8k_soft` (LSTM: XE, SCST, SCST, averaged)",
                 "updown": "Up-Down, the same recipe (`flickr8k_updown*.yaml`)",
                 "updown_steady": "Up-Down, first SCST stage at lr 5e-5 with the 0.1 XE term (`_scst_steady*.yaml`)",
                 "updown_tempered": "Up-Down, both SCST stages sampling at temperature 0.7 (`_scst_tempered*.yaml`)",
                 "soft_pointing_scst_more": "LSTM, that XE stage then both SCST stages with the mass term "
                                            "(`flickr8k_soft_pointing*.yaml`; issue 62)",
                 "soft_pointing_finetune": "LSTM, the shipped model then its second SCST stage again with the mass "
                                           "term (`flickr8k_soft_pointing_finetune.yaml`; issue 62)"}
# issue 62's recipe rows, run by scripts/grounding_runs.py (their figures in docs/grounding/rows/): shown here too
GROUNDING_ROWS = ("soft_pointing", "soft_pointing_scst_more", "soft_pointing_finetune")
TABLE_START, TABLE_END = "<!-- options-table:start -->", "<!-- options-table:end -->"
SHIPPED = ROOT / "docs" / "grounding" / "rows" / "shipped_soft.json"


def _row(label: str, r: dict, against: dict | None) -> str:
    s, g = r["scores"], r["boxes"]["generated"]
    delta = f" ({s['CIDEr-D'] - against['scores']['CIDEr-D']:+.2f})" if against is not None and r is not against else ""
    wall = minutes(r["train_wall_s"]) if r.get("train_commands") else "shipped"
    return (f"| {label} | {s['BLEU-4']:.1f} | {s['METEOR']:.1f} | {s['ROUGE-L']:.1f} | {s['CIDEr-D']:.2f}{delta} | "
            f"{100 * g['pointing']:.1f} % ({100 * g['centre_pointing']:.1f} %) / {g['inside']:.3f} "
            f"({g['uniform']:.3f}, {g['mean_map']:.3f}) | {iou_figures(r)} | {movement(r)} | "
            f"{100 * r['mirror_follow']:.1f} % / "
            f"{100 * r['columns_mirror']:.1f} % / {100 * r['columns_stay']:.1f} % | {wall} |")


def format_report(rows: dict[str, dict], shipped: dict | None) -> str:
    """The cross-entropy rows (CIDEr-D against `xe_control`), then Up-Down's whole recipe against the shipped soft
    model, then every row's commands."""
    head = ["| {} | BLEU-4 | METEOR | ROUGE-L | CIDEr-D | boxes: pointing (centre) / inside (uniform, mean map) "
            "| IoU > 0.5: teacher-forced accuracy / F1_all / F1_loc (whole photo / centre cell) "
            "| cells/caption, cell changes, α max | mirror α / columns / stay | train wall |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    control = rows.get("xe_control")
    lines = [head[0].format("cross-entropy stage"), head[1]]
    lines += [_row(label, rows[name], control) for name, label in LABELS.items() if name in rows]
    recipe = {"shipped_soft": shipped, **{name: rows[name] for name in RECIPE_LABELS if name in rows}}
    if len(recipe) > 1 and shipped is not None:
        lines += ["", head[0].format("whole recipe"), head[1]]
        lines += [_row(RECIPE_LABELS[name], r, shipped) for name, r in recipe.items()]
    probes = {name: rows[name] for name in PROBES if name in rows}
    if probes:
        lines += ["", format_probes(probes, rows.get("updown_xe"))]
    lines += ["", "Commands (each row's training, then its evaluation):", ""]
    for name, r in rows.items():
        lines.append(f"- `{name}`: " + "; ".join(f"`{c}`" for c in r["train_commands"] + [r["evaluate_command"]]))
    return "\n".join(lines)


def format_probes(probes: dict[str, dict], xe: dict | None) -> str:
    """Up-Down's first SCST epoch, one factor at a time: greedy validation after it (against the cross-entropy
    stage's last), the sampled captions' reward, then beam 3 on val and how many words and distinct captions it
    uses."""
    lines = ["| Up-Down, one SCST epoch from its cross-entropy stage | greedy val CIDEr-D | train reward | beam 3: "
             "BLEU-4 / METEOR / CIDEr-D | words | distinct captions | epoch wall |", "|---|---|---|---|---|---|---|"]

    def last(r: dict, key: str, digits: int) -> str:
        value = (r.get("last_stage_epochs") or [{}])[-1].get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    def scores(r: dict) -> str:
        s = r["scores"]
        return (f"{s['BLEU-4']:.1f} / {s['METEOR']:.1f} / {s['CIDEr-D']:.2f} | {r['vocabulary']} | "
                f"{100 * r['distinct_captions']:.1f} %")

    if xe is not None:
        lines.append(f"| the cross-entropy stage (`updown_xe`), where they start | {last(xe, 'CIDEr-D', 1)} | - | "
                     f"{scores(xe)} | - |")
    for name, r in probes.items():
        lines.append(f"| {PROBES[name][1]} | {last(r, 'CIDEr-D', 1)} | {last(r, 'train_reward', 3)} | {scores(r)} | "
                     f"{minutes(r['train_wall_s'])} |")
    return "\n".join(lines)


def write_report(doc: Path = ROOT / "docs" / "training-options.md") -> None:
    rows = {step["name"]: r for step in steps() if (r := _read(step["name"])) is not None}
    rows.update({name: r for name in GROUNDING_ROWS if (r := _read(name, GROUNDING)) is not None})
    shipped = json.loads(SHIPPED.read_text()) if SHIPPED.is_file() else None
    replace_between(doc, TABLE_START, TABLE_END, format_report(rows, shipped))


def _read(name: str, rows: Path = ROWS) -> dict | None:
    path = rows / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def run_step(step: dict, log) -> None:
    if _read(step["name"]) is not None:
        print(f"{step['name']}: done, skipped", flush=True)
        return
    result = train_and_evaluate(step, log, ROWS)
    print(f"{step['name']}: CIDEr-D {result['scores']['CIDEr-D']:.2f}  train {result['train_wall_s']:.0f}s",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("run", "list", "report"))
    parser.add_argument("--only", nargs="+", default=None, help="step names")
    parser.add_argument("--log", default="runs/options/train.log", help="where the training output goes")
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
        for step in steps():
            if args.only is None or step["name"] in args.only:
                run_step(step, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
