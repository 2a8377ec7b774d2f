"""docs/training-options.md's run tables, from the records in docs/training-options/rows/ (the runs of the recipe
captioner/recipes/training_options.yaml) and three of docs/grounding/rows/ (issue 62's, which that page shows too).

The cross-entropy rows against `xe_control` (the same run without the option), Up-Down's whole recipe against the
shipped `flickr8k_soft`, Up-Down's one-epoch SCST probes (why its first SCST stage collapses), then every row's
commands.
"""

from __future__ import annotations

from pathlib import Path

from captioner.reports.grounding import ROWS as GROUNDING
from captioner.reports.grounding import iou_figures, minutes, movement, wall
from captioner.reports.records import read_rows
from captioner.reports.sections import Section

ROWS = "docs/training-options/rows"
# the options' runs in the order they ran (the commands' list follows it)
ORDER = ("xe_control", "label_smoothing_0.1", "label_smoothing_0.2", "scheduled_sampling", "updown_xe", "updown",
         "updown_steady", "updown_tempered")
# Why Up-Down's first SCST stage collapses (issue 62): its first epoch from the cross-entropy stage with one factor
# changed at a time, each with what it changes
PROBES = {
    "updown_probe_base": "as `flickr8k_updown_scst` (lr 1e-4, no XE term, mean baseline)",
    "updown_probe_lr": "lr 5e-5",
    "updown_probe_xe": "the 0.1 XE term",
    "updown_probe_lr_xe": "lr 5e-5 and the 0.1 XE term (`updown_steady`'s first SCST epoch)",
    "updown_probe_greedy": "the greedy caption's reward as baseline",
    "updown_probe_temperature": "captions sampled at temperature 0.7 (softmax(logits / 0.7))",
}
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
                 "updown_steady": "Up-Down, first SCST stage at lr 5e-5 with the 0.1 XE term (the study's "
                                  "`updown_steady`)",
                 "updown_tempered": "Up-Down, both SCST stages sampling at temperature 0.7 (the study's "
                                    "`updown_tempered`)",
                 "soft_pointing_scst_more": "LSTM, that XE stage then both SCST stages with the mass term "
                                            "(`flickr8k_soft_pointing*.yaml`; issue 62)",
                 "soft_pointing_finetune": "LSTM, the shipped model then its second SCST stage again with the mass "
                                           "term (`flickr8k_soft_pointing_finetune.yaml`; issue 62)"}
# issue 62's rows, recorded with the grounding runs: shown here too
GROUNDING_ROWS = ("soft_pointing", "soft_pointing_scst_more", "soft_pointing_finetune")
SHIPPED = "shipped_soft"


def _row(label: str, r: dict, against: dict | None) -> str:
    s, g = r["scores"], r["boxes"]["generated"]
    delta = f" ({s['CIDEr-D'] - against['scores']['CIDEr-D']:+.2f})" if against is not None and r is not against else ""
    return (f"| {label} | {s['BLEU-4']:.1f} | {s['METEOR']:.1f} | {s['ROUGE-L']:.1f} | {s['CIDEr-D']:.2f}{delta} | "
            f"{100 * g['pointing']:.1f} % ({100 * g['centre_pointing']:.1f} %) / {g['inside']:.3f} "
            f"({g['uniform']:.3f}, {g['mean_map']:.3f}) | {iou_figures(r)} | {movement(r)} | "
            f"{100 * r['mirror_follow']:.1f} % / "
            f"{100 * r['columns_mirror']:.1f} % / {100 * r['columns_stay']:.1f} % | {wall(r)} |")


def format_report(rows: dict[str, dict], shipped: dict | None) -> str:
    """The cross-entropy rows (CIDEr-D against `xe_control`), then Up-Down's whole recipe against the shipped soft
    model, the probes, then every row's commands."""
    head = ["| {} | BLEU-4 | METEOR | ROUGE-L | CIDEr-D | boxes: pointing (centre) / inside (uniform, mean map) "
            "| IoU > 0.5: teacher-forced accuracy / F1_all / F1_loc (whole photo / centre cell) "
            "| cells/caption, cell changes, α max | mirror α / columns / stay | train wall |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    control = rows.get("xe_control")
    lines = [head[0].format("cross-entropy stage"), head[1]]
    lines += [_row(label, rows[name], control) for name, label in LABELS.items() if name in rows]
    recipe = {SHIPPED: shipped, **{name: rows[name] for name in RECIPE_LABELS if name in rows}}
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
        lines.append(f"| {PROBES[name]} | {last(r, 'CIDEr-D', 1)} | {last(r, 'train_reward', 3)} | {scores(r)} | "
                     f"{minutes(r['train_wall_s'])} |")
    return "\n".join(lines)


def read(root: Path) -> tuple[dict[str, dict], dict | None]:
    """The page's rows (the options' in ORDER, then the probes, then issue 62's grounding rows) and the shipped
    default's record."""
    own, grounding = read_rows(root / ROWS), read_rows(root / GROUNDING)
    rows = {name: own[name] for name in (*ORDER, *PROBES) if name in own}
    rows.update({name: grounding[name] for name in GROUNDING_ROWS if name in grounding})
    return rows, grounding.get(SHIPPED)


TABLES = [Section("options-table", "docs/training-options.md", lambda root: format_report(*read(root)))]
