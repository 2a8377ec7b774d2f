"""docs/attention-family.md's tables and plots, from the records in docs/attention-family/ (the runs of the recipe
captioner/recipes/attention_family.yaml): every scorer and attention variant at one budget, side by side.

The records: rows/NAME.json (one per variant: its settings, scores, attention and box figures, training curve and
timings), speed.json, heads.json and pointer.json (measured by scripts/bench_attention_family.py: training and
decoding speeds with the rows taking turns, what a multi-head row's heads read apart, the pointer network's sorting).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from captioner.reports.records import read_record, read_rows
from captioner.reports.sections import Section

FOLDER = "docs/attention-family"
BUDGET_EPOCHS = 2  # every row's budget (the recipe's train.epochs)
CONFIG = "configs/flickr8k_soft.yaml"  # what every row shares
SATURATION = 0.99  # captioner.evaluation.metrics.SATURATED_ALPHA, which the "α max > 0.99" column counts
RECIPE = "attention_family"  # the rows' order is its variants' (the scorers first, then the other variants, widths)
STUDIES = (("family", "The family"), ("width", "Dot against scaled dot, by key width"))
PLOTS = ("quality-speed.png", "entropy-width.png")


def read(root: Path) -> tuple[list[dict], dict, dict | None, dict | None]:
    """(the rows in ORDER, each flat (``flat``) with its measured speeds; speed.json; heads.json; pointer.json)."""
    folder = root / FOLDER
    found = read_rows(folder / "rows")
    optional = {name: read_record(folder / f"{name}.json") if (folder / f"{name}.json").is_file() else None
                for name in ("speed", "heads", "pointer")}
    speed = optional["speed"] or {}
    from captioner.training.recipes import load_recipes

    order = [r.variant for r in load_recipes(RECIPE)]
    names = sorted(found, key=lambda name: (order.index(name) if name in order else len(order), name))
    rows = [{**flat(found[name]), **speed.get("rows", {}).get(name, {})} for name in names]
    return rows, speed, optional["heads"], optional["pointer"]


def flat(record: dict) -> dict:
    """A row's figures as the table reads them. A record of ``captioner recipe run`` holds evaluate's JSON (its
    ``scores``, its ``boxes``) and the variant's ``info`` (label, study, scorer, attention, key width); a row
    recorded before recipes holds them flat, under the names used here."""
    if "scores" not in record:
        return record
    out = {**record, **record.get("info", {}), **record["scores"]}
    boxes = record.get("boxes")
    if boxes:
        tf, gen = boxes["teacher_forced"], boxes["generated"]
        out.update(correctness_tf=tf["inside"], pointing_tf=tf["pointing"], centre_tf=tf["centre_pointing"],
                   inside_generated=gen["inside"], pointing_generated=gen["pointing"],
                   centre_generated=gen["centre_pointing"])
    rates = [e["items_per_s"] for e in record.get("last_stage_epochs", []) if e.get("items_per_s")]
    if rates:
        out["in_run_captions_per_s"] = statistics.median(rates)
    return out


def _cell(value: Any, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.{digits}f} %" if percent else f"{value:.{digits}f}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def _boxes_cell(row: dict, setting: str) -> str:
    """"inside / pointing % (centre %)" of a row measured on boxes; "not measured" for a row trained before."""
    if ("correctness_tf" if setting == "tf" else "inside_generated") not in row:
        return "not measured"
    inside = row["correctness_tf" if setting == "tf" else "inside_generated"]
    if inside is None:
        return "no word matched"
    return (f"{inside:.3f} / {_cell(row[f'pointing_{setting}'], 1, True)} "
            f"({_cell(row[f'centre_{setting}'], 1, True)})")


def format_tables(root: Path) -> str:
    rows, speed, heads, pointer = read(root)
    head = ("| row | BLEU-4 | METEOR | CIDEr-D | train captions/s | decode images/s | parameters | α max | α entropy "
            "| α max > 0.99 | cells / caption | cell changes | mirror: α / columns / stay "
            "| boxes, teacher-forced: α inside / pointing (centre) | boxes, own captions: α inside / pointing (centre) "
            "| wall time |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"Budget: {BUDGET_EPOCHS} epochs of Flickr8k's 30,000 training captions per row, `{CONFIG}` for "
             f"everything the row does not set. Generated from `{FOLDER}/rows/`."]
    if speed:
        lines.append(f"Speeds: `speed`, the rows taking turns ({speed.get('measured', '?')}, {speed.get('cpu', '?')}, "
                     f"float32 matmul at {speed.get('matmul_gflops', '?')} GFLOP/s); decoding at beam 3, 20 words "
                     "per caption.")
    lines.append("")
    for study, title in STUDIES:
        chosen = [r for r in rows if r["study"] == study]
        if not chosen:
            continue
        lines += [f"**{title}**", "", head]
        for r in chosen:
            mirror = (f"{_cell(r.get('mirror_follow'), 1, True)} / {_cell(r.get('columns_mirror'), 1, True)} / "
                      f"{_cell(r.get('columns_stay'), 1, True)}")
            lines.append(
                f"| {r['label']} | {_cell(r['BLEU-4'])} | {_cell(r['METEOR'])} | {_cell(r['CIDEr-D'])} | "
                f"{_cell(r.get('train_captions_per_s'))} | {_cell(r.get('decode_images_per_s'))} | "
                f"{r['parameters'] / 1e6:.2f} M | {_cell(r['alpha_max'], 3)} | {_cell(r['alpha_entropy'], 3)} | "
                f"{_cell(r.get('alpha_saturated'), 1, True)} | {_cell(r['cells_per_caption'], 2)} | "
                f"{_cell(r['cell_changes'], 1, True)} | {mirror} | {_boxes_cell(r, 'tf')} | "
                f"{_boxes_cell(r, 'generated')} | {_minutes(r['train_wall_s'])} |")
        lines.append("")
    if heads:
        labels = {r["name"]: r["label"] for r in rows}
        photos = ", ".join(sorted({f"{f['images']:,}" for f in heads["rows"].values()}))
        lines += ["**Multi-head: what the heads read apart** (`python scripts/bench_attention_family.py heads`: "
                  f"greedy captions of val's first {photos} photos, every word's per-head maps)", "",
                  "| row | words | head α max | head α entropy | mean map's α max | distinct head cells per word "
                  "| all heads on one cell | overlap of two heads | a head's overlap with uniform "
                  "| cells between two heads' picks |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {labels.get(name, name)} | {f['words']:,} | {f['head_alpha_max']:.3f} | "
                  f"{f['head_alpha_entropy']:.3f} | {f['mean_map_alpha_max']:.3f} | "
                  f"{f['distinct_head_cells']:.2f} of {f['heads']} | {100 * f['heads_agree']:.1f} % | "
                  f"{f['head_overlap']:.3f} | {f['uniform_overlap']:.3f} | {f['head_cell_distance']:.2f} |"
                  for name, f in heads["rows"].items()]
        lines.append("")
    lines += [f"![{Path(p).stem}](attention-family/{p})" for p in PLOTS if (root / FOLDER / p).is_file()]
    if pointer:
        lines += ["", "**Pointer network: sorting** (`python scripts/bench_attention_family.py pointer`, "
                      f"examples/pointer_network.py, additive scorer, hidden 64; {pointer['cpu']})", "",
                  "| numbers per sequence | Adam steps (batch 128) | exact match (2,000 new sequences) "
                  "| training time |",
                  "|---|---|---|---|"]
        lines += [f"| {r['length']} | {r['steps']} | {100 * r['exact_match']:.1f} % | {r['train_s']:.0f} s |"
                  for r in pointer["rows"]]
    return "\n".join(lines)


def write_plots(root: Path) -> list[Path]:
    """quality-speed.png (CIDEr-D against training captions/s, or the in-run rate before the speeds were measured)
    and entropy-width.png (α entropy and the saturated share against key width, dot and scaled dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read(root)[0]
    folder = root / FOLDER
    written = []
    if rows:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        measured = all(r.get("train_captions_per_s") for r in rows)
        for r in rows:
            x = r.get("train_captions_per_s") if measured else r["in_run_captions_per_s"]
            ax.scatter(x, r["CIDEr-D"], color="tab:red" if r["attention"] == "hard" else "tab:blue")
            ax.annotate(r["name"], (x, r["CIDEr-D"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("training captions / s" + ("" if measured else " (during the run)"))
        ax.set_ylabel("CIDEr-D (val, beam 3)")
        ax.set_title(f"Quality against training speed ({BUDGET_EPOCHS} epochs each)")
        written.append(_save_plot(fig, folder / PLOTS[0]))
    widths = [r for r in rows if r.get("key_width") and r["scorer"] in ("dot", "scaled_dot")]
    if widths:
        fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.8))
        for scorer, color in (("dot", "tab:orange"), ("scaled_dot", "tab:green")):
            pts = sorted((r["key_width"], r["alpha_entropy"], r.get("alpha_saturated") or 0.0)
                         for r in widths if r["scorer"] == scorer and r["alpha_entropy"] is not None)
            if pts:
                axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=scorer)
                axes[1].plot([p[0] for p in pts], [100 * p[2] for p in pts], "o-", color=color, label=scorer)
        for ax, label in ((axes[0], "α entropy H(α) / log L"), (axes[1], f"% of words with α max > {SATURATION}")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("key width D")
            ax.set_ylabel(label)
            ax.legend(fontsize=8)
        fig.suptitle("Softmax saturation against key width (val, beam 3)")
        written.append(_save_plot(fig, folder / PLOTS[1]))
    return written


def _save_plot(fig: Any, path: Path) -> Path:
    """Write ``fig`` with the command that makes it in its corner."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.text(0.01, 0.01, "captioner recipe report --write --plots", fontsize=7, family="monospace")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TABLES = [Section("family-table", "docs/attention-family.md", format_tables)]
