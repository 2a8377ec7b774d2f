"""The attention family on real photographs: every scorer and attention variant trained at one budget, side by side.

    python scripts/attention_family.py run                     # every row not yet done, then the report
    python scripts/attention_family.py run --rows soft_dot     # one row (again from scratch: --fresh)
    python scripts/attention_family.py speed                   # training captions/s and decoding images/s, alternating
    python scripts/attention_family.py heads                   # what a multi-head row's heads read, apart
    python scripts/attention_family.py report                  # docs/attention-family.md's table, the JSON, the plots
    python scripts/attention_family.py boxes --rows R          # a finished row's box columns, from its kept best.pt
    python scripts/attention_family.py pointer                 # the pointer network's sorting table

Each row is `captioner train --config configs/flickr8k_soft.yaml --set ...` (the same frozen Lite0 grids,
vocabulary, seed, Adam, learning rate and schedule; only the attention settings of its row differ) for
``--epochs`` epochs (the budget: the same number of training captions for every row, cosine over them), then
`captioner evaluate --split val --beam 3 --mirror-check --entities ENTITIES` of its best.pt (hard rows decode with
argmax: one cell per word; the box figures when the Flickr30k Entities folder exists). A row keeps evaluate's
whole result (its ``evaluate`` entry), so a later column can be drawn from it without training again. A row is
resumable: a finished one (RUN/family-row.json) is skipped; an interrupted training run
continues from its last.pt (`captioner train --resume`), an interrupted evaluation is redone. Everything
goes under ``--runs`` (default runs/family/ROW); the figures of every row go to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runnable from a checkout without install

# a word's alpha counts as saturated when its largest weight exceeds this: captioner.evaluation.metrics.SATURATED_ALPHA,
# which `evaluate` reports as alpha_saturated
SATURATION = 0.99
SCORE_KEYS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")

# The objective settings hard attention needs, from the shipped configs (configs/flickr8k_hard.yaml: the
# leave-one-out estimator; configs/flickr8k_hard_gumbel_from_soft.yaml: Gumbel); the optimiser stays the family's.
HARD_LOO = ("model.attention.attention=hard", "train.objective.kind=loo", "train.objective.alpha_c=0.2",
            "train.objective.alpha_entropy=0.5", "train.objective.samples=2", "train.objective.reinforce_weight=1.0",
            "train.objective.entropy_weight=0.001", "eval.attention_mode=argmax")
HARD_GUMBEL = ("model.attention.attention=hard", "train.objective.kind=gumbel", "train.objective.alpha_c=0.0",
               "train.objective.alpha_entropy=0.1", "train.objective.temperature=1.0",
               "train.objective.temperature_min=0.5", "train.objective.expectation_prob=0.25",
               "eval.attention_mode=argmax")


@dataclass(frozen=True)
class Row:
    """One variant: its name (its run folder), what the table calls it, its study and its --set overrides."""

    name: str
    label: str
    study: str  # "family": the main table; "width": dot against scaled dot at one key width
    sets: tuple[str, ...]
    scorer: str = "additive"
    attention: str = "soft"
    key_width: int | None = None  # the size the scorer's dot product runs over (None: the additive MLP)


def _width_rows() -> list[Row]:
    rows = []
    for width in (64, 256, 1024):
        for scorer in ("dot", "scaled_dot"):
            rows.append(Row(f"kv_{scorer}_{width}", f"key-value, {scorer.replace('_', ' ')}, keys {width}", "width",
                            ("model.attention.attention=key_value", f"model.attention.scorer={scorer}",
                             f"model.attention.attention_dim={width}"),
                            scorer=scorer, attention="key_value", key_width=width))
    return rows


# In the order they run: the four scorers first (the table's core), hard attention, the other variants, widths.
ROWS: list[Row] = [
    Row("soft_additive", "soft, additive (the paper's)", "family", ("model.attention.scorer=additive",)),
    Row("soft_dot", "soft, dot product", "family", ("model.attention.scorer=dot",), scorer="dot", key_width=1280),
    Row("soft_scaled_dot", "soft, scaled dot product", "family", ("model.attention.scorer=scaled_dot",),
        scorer="scaled_dot", key_width=1280),
    Row("soft_bilinear", "soft, bilinear", "family", ("model.attention.scorer=bilinear",), scorer="bilinear",
        key_width=512),
    Row("hard_loo", "hard, leave-one-out REINFORCE", "family", HARD_LOO, attention="hard"),
    Row("hard_gumbel", "hard, Gumbel straight-through", "family", HARD_GUMBEL, attention="hard"),
    Row("key_value", "key-value (additive)", "family", ("model.attention.attention=key_value",),
        attention="key_value"),
    Row("multi_head_4", "multi-head, 4 heads", "family",
        ("model.attention.attention=multi_head", "model.attention.heads=4"), scorer="additive",
        attention="multi_head"),
    Row("multi_head_8", "multi-head, 8 heads", "family",
        ("model.attention.attention=multi_head", "model.attention.heads=8"), scorer="additive",
        attention="multi_head"),
    Row("soft_refiner", "soft + self-attention over the grid (1 layer)", "family",
        ("model.encoder.self_attention_layers=1",)),
    *_width_rows(),
]
ROW_NAMES = {row.name: row for row in ROWS}


# --------------------------------------------------------------------------- running a row


@dataclass
class Family:
    """Where the family's runs and outputs live, and the settings every row shares."""

    config: Path
    runs: Path
    epochs: int
    json_path: Path
    doc: Path
    plots: Path
    extra_sets: tuple[str, ...] = ()
    scoring: str = "full"  # full: PTB tokenizer and METEOR (Java), as reported; quick: neither (the tests)
    entities: Path | None = None  # Flickr30k Entities folder: evaluate adds the box figures when it exists
    python: str = sys.executable
    log: Any = field(default=None, repr=False)

    def run_dir(self, row: Row) -> Path:
        return self.runs / row.name

    def row_file(self, row: Row) -> Path:
        """The row's figures, beside the family's JSON (committed with the page: runs/ does not outlive a session,
        so a finished row is known by this file, and only an unfinished one needs its run folder)."""
        return self.json_path.parent / "rows" / f"{row.name}.json"

    @property
    def speed_file(self) -> Path:
        return self.json_path.parent / "speed.json"

    @property
    def heads_file(self) -> Path:
        return self.json_path.parent / "heads.json"

    @property
    def pointer_file(self) -> Path:
        return self.json_path.parent / "pointer.json"

    def sets(self, row: Row) -> list[str]:
        """The overrides every row shares (the budget, its folder), then the row's own."""
        common = (f"train.epochs={self.epochs}", "train.time_budget_s=0", f"train.patience={self.epochs + 1}",
                  f"train.run_dir={self.run_dir(row)}", "train.tensorboard=off", "train.keep_epochs=false",
                  "train.average_last=0")
        return [*common, *self.extra_sets, *row.sets]


def _command(family: Family, *args: str) -> list[str]:
    return [family.python, "-m", "captioner", *args]


def _run(cmd: list[str], log_path: Path) -> None:
    """Run ``cmd`` with its output appended to ``log_path``; raise naming the log when it fails."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        # PASSIVE: OpenMP threads that spin while a sibling is descheduled make every op wait for a scheduler
        # tick when the two cores are shared (scripts/bench.py measured 10x), as they are beside other work
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{cmd[3]} failed (exit {code}); log: {log_path}\n" + "\n".join(tail))


def _epochs_done(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return 0
    return sum(1 for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip())


def _history(run_dir: Path) -> list[dict]:
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text(encoding="utf-8").splitlines() if metrics.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def train_row(family: Family, row: Row) -> None:
    """Train the row to the budget: from the start, or on from its last.pt."""
    run_dir = family.run_dir(row)
    done = _epochs_done(run_dir)
    if done >= family.epochs and (run_dir / "best.pt").exists():
        return
    resume = ["--resume", str(run_dir)] if (run_dir / "last.pt").exists() else []
    sets = [arg for s in family.sets(row) for arg in ("--set", s)]
    _run(_command(family, "train", "--config", str(family.config), *sets, *resume), run_dir / "family.log")


def evaluate_row(family: Family, row: Row) -> dict:
    """`captioner evaluate` of the row's best.pt on val, beam 3, PTB, with the mirror check."""
    run_dir = family.run_dir(row)
    out = run_dir / "family-eval.json"
    scoring = ["--tokenizer", "ptb"] if family.scoring == "full" else ["--tokenizer", "simple", "--no-meteor"]
    cmd = _command(family, "evaluate", "--checkpoint", str(run_dir / "best.pt"), "--split", "val", "--beam", "3",
                   *scoring, "--mirror-check", "--json", "--out", str(out),
                   *(["--entities", str(family.entities)] if family.entities and family.entities.is_dir() else []))
    _run(cmd, run_dir / "family.log")
    return json.loads(out.read_text(encoding="utf-8"))


def parameter_count(checkpoint: Path) -> int:
    """The trainable parameters of the model a checkpoint holds (everything but the frozen backbone)."""
    from captioner.api import load_captioner

    model = load_captioner(checkpoint)
    backbone = {id(p) for p in model.encoder.backbone.parameters()} if hasattr(model.encoder, "backbone") else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in backbone)


def row_figures(family: Family, row: Row, result: dict, wall_s: float) -> dict:
    """The row's line of the JSON: its settings, scores, attention figures, training curve and timings."""
    run_dir = family.run_dir(row)
    history = _history(run_dir)
    keys = ("alpha_max", "alpha_entropy", "alpha_saturated",
            "cells_per_caption", "cell_changes", "mirror_follow", "columns_mirror", "columns_stay", "vocabulary",
            "attention_mode")
    return {
        "name": row.name, "label": row.label, "study": row.study, "scorer": row.scorer, "attention": row.attention,
        "key_width": row.key_width, "sets": list(family.sets(row)), "config": str(family.config),
        "epochs": len(history), "best_epoch": max(history, key=lambda e: e.get("CIDEr-D") or -1)["epoch"],
        **{k: result["scores"].get(k) for k in SCORE_KEYS},
        **{k: result.get(k) for k in keys},
        "parameters": parameter_count(run_dir / "best.pt"),
        "train_wall_s": round(sum(e["time_s"] for e in history), 1),
        "row_wall_s": round(wall_s, 1),
        "in_run_captions_per_s": statistics.median(e["items_per_s"] for e in history),
        "curve": [{k: e.get(k) for k in ("epoch", "train_loss", "train_xe", "val_loss", "BLEU-4", "CIDEr-D",
                                         "skipped_steps", "alpha_max", "alpha_entropy")} for e in history],
        "skipped_steps": sum(e.get("skipped_steps", 0) for e in history),
        **box_columns(result),
        "evaluate": {k: v for k, v in result.items() if k != "predictions"},  # every figure, for later columns
        "finished": time.strftime("%Y-%m-%d %H:%M"),
    }


def box_columns(result: dict) -> dict:
    """The table's grounding columns from an evaluate result with ``boxes`` (none without): attention inside the
    boxes teacher-forced (Liu et al.'s correctness) and on generated captions, and the pointing figures with the
    centre-cell baseline on the same words."""
    boxes = result.get("boxes")
    if not boxes:
        return {}
    tf, gen = boxes["teacher_forced"], boxes["generated"]
    return {"correctness_tf": tf["inside"], "pointing_tf": tf["pointing"], "centre_tf": tf["centre_pointing"],
            "inside_generated": gen["inside"], "pointing_generated": gen["pointing"],
            "centre_generated": gen["centre_pointing"], "grounded_words": gen["words"]}


def measure_boxes(family: Family, rows: Sequence[Row]) -> None:
    """Evaluate again, with the box figures, the finished rows whose best.pt is still in their run folder, and add
    the figures to their row files (their training is not repeated: the other columns stay as they were)."""
    from captioner.atomic import write_text_atomic

    if family.entities is None or not family.entities.is_dir():
        raise SystemExit(f"boxes: no Flickr30k Entities folder at {family.entities} (--entities)")
    for row in rows:
        best = family.run_dir(row) / "best.pt"
        if not family.row_file(row).exists() or not best.exists():
            print(f"{row.name}: not finished, or its best.pt is gone: `run --rows {row.name} --fresh` trains and "
                  "measures it", flush=True)
            continue
        result = evaluate_row(family, row)
        figures = json.loads(family.row_file(row).read_text(encoding="utf-8"))
        figures.update({**box_columns(result), "evaluate": {k: v for k, v in result.items() if k != "predictions"}})
        write_text_atomic(family.row_file(row), json.dumps(figures, indent=2) + "\n")
        print(f"{row.name}: own captions {_boxes_cell(figures, 'generated')}; teacher-forced "
              f"{_boxes_cell(figures, 'tf')}", flush=True)


def run_rows(family: Family, rows: Sequence[Row], fresh: bool = False) -> None:
    """Train and evaluate each row not yet done, printing progress and the time left."""
    import shutil

    todo = []
    for row in rows:
        if fresh:  # from scratch: the run and the row's figures both go, so the row is trained and measured again
            if family.run_dir(row).exists():
                shutil.rmtree(family.run_dir(row))
            family.row_file(row).unlink(missing_ok=True)
        if family.row_file(row).exists():
            print(f"{row.name}: done ({family.row_file(row)}), skipped", flush=True)
        else:
            todo.append(row)
    spent: list[float] = [json.loads(family.row_file(r).read_text())["row_wall_s"]
                          for r in ROWS if family.row_file(r).exists()]
    for i, row in enumerate(todo):
        left = len(todo) - i
        eta = f"; about {_minutes(statistics.median(spent) * left)} left" if spent else ""
        print(f"[{i + 1}/{len(todo)}] {row.name}: {row.label} ({family.epochs} epochs{eta})", flush=True)
        train_row(family, row)
        started = time.monotonic()
        result = evaluate_row(family, row)
        wall = time.monotonic() - started + sum(e["time_s"] for e in _history(family.run_dir(row)))
        figures = row_figures(family, row, result, wall)
        from captioner.atomic import write_text_atomic

        family.row_file(row).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(family.row_file(row), json.dumps(figures, indent=2) + "\n")
        spent.append(figures["row_wall_s"])
        print(f"    {row.name}: BLEU-4 {_fmt(figures['BLEU-4'])}  METEOR {_fmt(figures['METEOR'])}  "
              f"CIDEr-D {_fmt(figures['CIDEr-D'])}  alpha max {_fmt(figures['alpha_max'], 3)}  "
              f"({_minutes(wall)})", flush=True)
        write_report(family)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


# --------------------------------------------------------------------------- speed, alternating


def measure_speed(family: Family, rows: Sequence[Row], repeats: int = 5, train_steps: int = 3,
                  decode_images: int = 32, batch_size: int = 64, words: int = 20) -> dict[str, dict]:
    """Training captions/s and decoding images/s (beam 3, ``words`` words per caption: <end> held off so every row
    decodes as many steps) of every finished row, in one process, the rows taking turns ``repeats`` times (medians):
    the machine's drift touches every row alike. Each row's model is built from its config with fresh weights (the
    time of a step does not depend on the weights' values), so no checkpoint is needed."""
    import torch

    from captioner.api import build_model
    from captioner.config import load_config
    from captioner.data.datasets import GridCaptionDataset, build_vocab, collate_captions, load_records
    from captioner.training.inputs import open_feature_cache
    from captioner.training.loop import _TrainForward
    from captioner.training.objectives.registry import build_objective
    from captioner.training.optim import optimizer_for

    ready = [row for row in rows if family.row_file(row).exists()]
    if not ready:
        return {}
    models, inputs = {}, {}
    for row in ready:
        cfg = load_config(family.config, family.sets(row))  # its pretrained backbone names the rows' cache
        if not models:
            vocab = build_vocab(load_records(cfg.data, "train"), cfg.data.min_count)
            records = load_records(cfg.data, "val")[: max(batch_size, decode_images)]
        torch.manual_seed(0)
        model = build_model(cfg, vocab)
        cache = open_feature_cache(cfg, model, records, 0, 1)
        dataset = GridCaptionDataset(records, vocab, cfg.data.max_length, cache=cache)
        # (a split smaller than a batch, as in the tests, repeats its captions and photos)
        batch = collate_captions(dataset.__getitems__([i % len(dataset) for i in range(batch_size)]))
        ids = [records[i % len(records)].image_id for i in range(decode_images)]
        rows_in = torch.from_numpy(cache.get_batch(ids)).float()
        models[row.name], inputs[row.name] = (model, cfg, build_objective(cfg, model, dataset, False)), (batch, rows_in)
    times: dict[str, dict[str, list[float]]] = {row.name: {"train": [], "decode": []} for row in ready}
    for _ in range(repeats):
        for row in ready:
            model, cfg, objective = models[row.name]
            batch, rows_in = inputs[row.name]
            model.train()
            forward = _TrainForward(model, from_images=False)
            optimizer = optimizer_for(cfg, model)
            for step in range(train_steps + 1):  # the first step warms up (allocations, kernels)
                start = time.perf_counter()
                res = objective.loss(forward, batch)
                optimizer.zero_grad(set_to_none=True)
                res.loss.backward()
                optimizer.step()
                if step:
                    times[row.name]["train"].append(time.perf_counter() - start)
            model.eval()
            options = model.decode_options.replace_given(beam=3, max_length=words)
            with torch.no_grad():
                start = time.perf_counter()
                model.generate(model.prepare_rows(rows_in), options, min_length=words)
                times[row.name]["decode"].append(time.perf_counter() - start)
    return {name: {"train_captions_per_s": round(batch_size / statistics.median(t["train"]), 1),
                   "decode_images_per_s": round(decode_images / statistics.median(t["decode"]), 1),
                   "repeats": repeats, "words": words}
            for name, t in times.items()}


# --------------------------------------------------------------------------- what the heads read


def head_figures(maps: "Any") -> dict[str, float]:
    """What M heads read, apart, from their maps ``maps`` (N words, M heads, L cells; each row a distribution over a
    square grid): how peaked one head is (α max, entropy / log L) against the mean map the table shows; how many
    distinct cells the heads' arg-maxes hit per word (1: all heads on one cell, M: every head elsewhere) and the
    share of words where they all agree; how much two heads' maps overlap (Σ min(α_i, α_j): 1 identical, 0
    disjoint) against how much one head's map overlaps the uniform one (how flat the heads are: a pair of flat
    maps overlaps much whatever they look at), and how far apart (in cells, Euclidean) two heads' arg-max cells
    lie. Peakedness is the table's own (``attention_sharpness``, captioner/evaluation/metrics.py)."""
    import torch

    from captioner.evaluation.metrics import attention_sharpness

    N, M, L = maps.shape
    side = round(L ** 0.5)
    if side * side != L or M < 2:
        raise ValueError(f"head maps of shape {tuple(maps.shape)}: need M >= 2 heads over a square grid")
    maps = maps.double()
    per_head = attention_sharpness([maps.reshape(N * M, L)])  # every head's map a word of its own
    cells = maps.argmax(-1)  # (N, M)
    distinct = torch.tensor([len(set(row)) for row in cells.tolist()], dtype=torch.float64)
    i, j = torch.triu_indices(M, M, offset=1)
    overlap = torch.minimum(maps[:, i], maps[:, j]).sum(-1)  # (N, pairs)
    rows, cols = cells // side, cells % side
    distance = ((rows[:, i] - rows[:, j]) ** 2 + (cols[:, i] - cols[:, j]) ** 2).double().sqrt()
    return {"words": N, "heads": M,
            "head_alpha_max": per_head["alpha_max"],
            "head_alpha_entropy": per_head["alpha_entropy"],
            "mean_map_alpha_max": attention_sharpness([maps.mean(1)])["alpha_max"],
            "distinct_head_cells": distinct.mean().item(),
            "heads_agree": (distinct == 1).double().mean().item(),
            "head_overlap": overlap.mean().item(),
            "uniform_overlap": maps.clamp_max(1.0 / L).sum(-1).mean().item(),
            "head_cell_distance": distance.mean().item()}


def measure_heads(family: Family, rows: Sequence[Row], images: int = 1000, words: int = 20) -> dict[str, dict]:
    """``head_figures`` of every finished multi-head row, over the maps of its greedy captions for the first
    ``images`` val photos (its best.pt, at most ``words`` words; the word <end> and what follows are left out)."""
    import torch

    from captioner.api import load_model
    from captioner.data.datasets import load_records
    from captioner.training.inputs import open_feature_cache

    figures = {}
    for row in rows:
        checkpoint = family.run_dir(row) / "best.pt"
        if row.attention != "multi_head" or not checkpoint.exists():
            continue
        model = load_model(checkpoint, device="cpu")
        records = load_records(model.config.data, "val")[:images]
        cache = open_feature_cache(model.config, model, records, 0, 1)
        maps: list = []
        hook = model.decoder.attention.register_forward_hook(lambda _m, _i, out, into=maps: into.append(out.head_alpha))
        kept = []
        try:
            with torch.no_grad():
                grid = model.prepare_rows(torch.from_numpy(cache.get_batch([r.image_id for r in records])).float())
                state = model.decoder.init_state(grid)
                tokens = torch.full((grid.shape[0],), model.start_id, dtype=torch.long)
                live = torch.ones(grid.shape[0], dtype=torch.bool)
                for _ in range(words):
                    log_probs, _, _, state = model.decoder.step_with_location(tokens, state, dense=True)
                    log_probs[:, [model.pad_id, model.start_id]] = float("-inf")
                    tokens = log_probs.argmax(-1)
                    kept.append(live & (tokens != model.end_id))  # this step's map chose a word
                    live = kept[-1]
        finally:
            hook.remove()
        chosen = torch.cat([m[k] for m, k in zip(maps, kept)])  # (words, M, L)
        figures[row.name] = {**head_figures(chosen), "images": len(records)}
    return figures


# --------------------------------------------------------------------------- the report


def collect(family: Family) -> list[dict]:
    return [json.loads(family.row_file(row).read_text(encoding="utf-8"))
            for row in ROWS if family.row_file(row).exists()]


def write_report(family: Family) -> None:
    """The JSON of every figure, the plots and docs/attention-family.md's generated table."""
    from captioner.atomic import write_text_atomic

    rows = collect(family)
    family.json_path.parent.mkdir(parents=True, exist_ok=True)
    speed = json.loads(family.speed_file.read_text(encoding="utf-8")) if family.speed_file.exists() else {}
    for row in rows:
        row.update(speed.get("rows", {}).get(row["name"], {}))
    payload = {"budget_epochs": family.epochs, "config": str(family.config), "rows": rows,
               "speed": {k: v for k, v in speed.items() if k != "rows"}, "saturation_threshold": SATURATION}
    write_text_atomic(family.json_path, json.dumps(payload, indent=2) + "\n")
    plots = write_plots(family, rows)
    table = format_tables(rows, family, plots)
    write_doc_section(family.doc, table)


TABLE_START = "<!-- attention-family table: written by scripts/attention_family.py report -->"
TABLE_END = "<!-- end of the generated table -->"


def _cell(value: Any, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.{digits}f} %" if percent else f"{value:.{digits}f}"


def format_tables(rows: list[dict], family: Family, plots: list[Path]) -> str:
    head = ("| row | BLEU-4 | METEOR | CIDEr-D | train captions/s | decode images/s | parameters | α max | α entropy "
            "| α max > 0.99 | cells / caption | cell changes | mirror: α / columns / stay "
            "| boxes, teacher-forced: α inside / pointing (centre) | boxes, own captions: α inside / pointing (centre) "
            "| wall time |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    repo = family.doc.resolve().parent.parent  # the page sits in docs/: paths are shown from the checkout's root
    shown = os.path.relpath(family.json_path.resolve(), repo)
    lines = [f"Budget: {family.epochs} epochs of Flickr8k's 30,000 training captions per row, "
             f"`{family.config}` for everything the row does not set. Generated from `{shown}`."]
    speed = json.loads(family.speed_file.read_text(encoding="utf-8")) if family.speed_file.exists() else {}
    if speed:
        lines.append(f"Speeds: `speed`, the rows taking turns ({speed.get('measured', '?')}, {speed.get('cpu', '?')}, "
                     f"float32 matmul at {speed.get('matmul_gflops', '?')} GFLOP/s); decoding at beam 3, 20 words "
                     "per caption.")
    lines.append("")
    for study, title in (("family", "The family"), ("width", "Dot against scaled dot, by key width")):
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
    if family.heads_file.exists():
        heads = json.loads(family.heads_file.read_text(encoding="utf-8"))["rows"]
        labels = {r["name"]: r["label"] for r in rows}
        photos = ", ".join(sorted({f"{f['images']:,}" for f in heads.values()}))
        lines += ["**Multi-head: what the heads read apart** (`python scripts/attention_family.py heads`: greedy "
                  f"captions of val's first {photos} photos, every word's per-head maps)", "",
                  "| row | words | head α max | head α entropy | mean map's α max | distinct head cells per word "
                  "| all heads on one cell | overlap of two heads | a head's overlap with uniform "
                  "| cells between two heads' picks |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {labels.get(name, name)} | {f['words']:,} | {f['head_alpha_max']:.3f} | "
                  f"{f['head_alpha_entropy']:.3f} | {f['mean_map_alpha_max']:.3f} | "
                  f"{f['distinct_head_cells']:.2f} of {f['heads']} | {100 * f['heads_agree']:.1f} % | "
                  f"{f['head_overlap']:.3f} | {f['uniform_overlap']:.3f} | {f['head_cell_distance']:.2f} |"
                  for name, f in heads.items()]
        lines.append("")
    lines += [f"![{p.stem}]({os.path.relpath(p, family.doc.parent)})" for p in plots]
    if family.pointer_file.exists():
        pointer = json.loads(family.pointer_file.read_text(encoding="utf-8"))
        lines += ["", f"**Pointer network: sorting** (`python scripts/attention_family.py pointer`, "
                      f"examples/pointer_network.py, additive scorer, hidden 64; {pointer['cpu']})", "",
                  "| numbers per sequence | Adam steps (batch 128) | exact match (2,000 new sequences) "
                  "| training time |",
                  "|---|---|---|---|"]
        lines += [f"| {r['length']} | {r['steps']} | {100 * r['exact_match']:.1f} % | {r['train_s']:.0f} s |"
                  for r in pointer["rows"]]
    return "\n".join(lines)


def _boxes_cell(row: dict, setting: str) -> str:
    """"inside / pointing % (centre %)" of a row measured on boxes; "not measured" for a row trained before."""
    if ("correctness_tf" if setting == "tf" else "inside_generated") not in row:
        return "not measured"
    inside = row["correctness_tf" if setting == "tf" else "inside_generated"]
    if inside is None:
        return "no word matched"
    return (f"{inside:.3f} / {_cell(row[f'pointing_{setting}'], 1, True)} "
            f"({_cell(row[f'centre_{setting}'], 1, True)})")


def write_doc_section(doc: Path, table: str) -> None:
    """Replace the generated part of the page (between its markers), or start the page."""
    from captioner.atomic import write_text_atomic

    block = f"{TABLE_START}\n{table}\n{TABLE_END}"
    if doc.exists():
        text = doc.read_text(encoding="utf-8")
        if TABLE_START in text and TABLE_END in text:
            before, rest = text.split(TABLE_START, 1)
            after = rest.split(TABLE_END, 1)[1]
            write_text_atomic(doc, before + block + after)
            return
    write_text_atomic(doc, f"# The attention family on Flickr8k\n\n{block}\n")


def write_plots(family: Family, rows: list[dict]) -> list[Path]:
    """quality-speed.png (CIDEr-D against training captions/s, or the in-run rate before `speed` has run) and
    entropy-width.png (α entropy and the saturated share against key width, dot and scaled dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    family.plots.mkdir(parents=True, exist_ok=True)
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
        ax.set_title(f"Quality against training speed ({family.epochs} epochs each)")
        written.append(_save_plot(fig, family.plots / "quality-speed.png"))
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
        written.append(_save_plot(fig, family.plots / "entropy-width.png"))
    return written


def _save_plot(fig: Any, path: Path) -> Path:
    """Write ``fig`` with the command that makes it in its corner."""
    import matplotlib.pyplot as plt

    fig.text(0.01, 0.01, "python scripts/attention_family.py report", fontsize=7, family="monospace")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the pointer network


def pointer_table(lengths: Sequence[int] = (5, 10, 20), steps: int = 1500, eval_size: int = 2000,
                  seed: int = 0) -> list[dict]:
    """Sorting with the pointer network of examples/pointer_network.py: exact-match accuracy and training time
    per sequence length (one Adam run of ``steps`` steps each)."""
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from pointer_network import sort_accuracy, train_sorter

    rows = []
    for length in lengths:
        start = time.perf_counter()
        model = train_sorter(length=length, steps=steps, order="decreasing", hidden_dim=64, scorer="additive",
                             lr=5e-3, seed=seed, log_every=0)
        seconds = time.perf_counter() - start
        accuracy = sort_accuracy(model, length=length, order="decreasing", n=eval_size, seed=seed + 1)
        rows.append({"length": length, "steps": steps, "exact_match": float(accuracy),
                     "train_s": round(seconds, 1), "threads": torch.get_num_threads()})
    return rows


# --------------------------------------------------------------------------- command line


def _family(args: argparse.Namespace) -> Family:
    return Family(config=Path(args.config), runs=Path(args.runs), epochs=args.epochs, json_path=Path(args.json),
                  doc=Path(args.doc), plots=Path(args.plots), extra_sets=tuple(args.set or ()), scoring=args.scoring,
                  entities=ROOT / args.entities if args.entities else None)


def _rows(names: str | None) -> list[Row]:
    if not names:
        return list(ROWS)
    unknown = [n for n in names.split(",") if n not in ROW_NAMES]
    if unknown:
        raise SystemExit(f"unknown row(s) {', '.join(unknown)}; valid: {', '.join(ROW_NAMES)}")
    return [ROW_NAMES[n] for n in names.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("run", "speed", "heads", "report", "pointer", "list", "boxes"))
    parser.add_argument("--rows", default=None, help="comma-separated row names (default: all; `list` names them)")
    parser.add_argument("--config", default="configs/flickr8k_soft.yaml", help="what every row shares")
    parser.add_argument("--epochs", type=int, default=2, help="the budget: training epochs per row")
    parser.add_argument("--set", action="append", help="an override every row takes (tests: smaller sizes)")
    parser.add_argument("--runs", default="runs/family")
    parser.add_argument("--json", default="docs/attention-family/family.json")
    parser.add_argument("--doc", default="docs/attention-family.md")
    parser.add_argument("--plots", default="docs/attention-family")
    parser.add_argument("--fresh", action="store_true",
                        help="train and measure the chosen rows again from scratch (their runs and row files go)")
    parser.add_argument("--entities", default="data/flickr8k/flickr30k_entities",
                        help="Flickr30k Entities folder: evaluate adds the box figures when it exists")
    parser.add_argument("--scoring", choices=("full", "quick"), default="full",
                        help="full: PTB tokenizer and METEOR, as reported; quick: neither (the tests)")
    parser.add_argument("--repeats", type=int, default=5, help="speed: rounds of the rows taking turns")
    parser.add_argument("--head-images", type=int, default=1000, help="heads: val photos captioned")
    parser.add_argument("--pointer-steps", type=int, default=1500)
    parser.add_argument("--pointer-lengths", default="5,10,20")
    args = parser.parse_args(argv)
    family = _family(args)
    family.json_path.parent.mkdir(parents=True, exist_ok=True)
    rows = _rows(args.rows)
    if args.phase == "list":
        for row in ROWS:
            state = "done" if family.row_file(row).exists() else f"{_epochs_done(family.run_dir(row))} epochs"
            print(f"{row.name:<20} {row.study:<7} {state:<10} {row.label}")
        return 0
    if args.phase == "run":
        run_rows(family, rows, fresh=args.fresh)
    elif args.phase == "boxes":
        measure_boxes(family, rows)
    elif args.phase == "speed":
        from captioner.atomic import write_text_atomic

        figures = measure_speed(family, rows, repeats=args.repeats)
        write_text_atomic(family.speed_file, json.dumps({"rows": figures, "cpu": _cpu_name(),
                                                         "matmul_gflops": round(_matmul_gflops(), 1),
                                                                   "measured": time.strftime("%Y-%m-%d %H:%M")},
                                                                  indent=2) + "\n")
        for name, f in figures.items():
            print(f"{name:<20} train {f['train_captions_per_s']:8.1f} captions/s   "
                  f"decode {f['decode_images_per_s']:7.1f} images/s")
    elif args.phase == "heads":
        from captioner.atomic import write_text_atomic

        figures = measure_heads(family, rows, images=args.head_images)
        write_text_atomic(family.heads_file, json.dumps({"rows": figures}, indent=2) + "\n")
        for name, f in figures.items():
            print(f"{name:<20} {f['heads']} heads: head α max {f['head_alpha_max']:.3f} (mean map "
                  f"{f['mean_map_alpha_max']:.3f}), {f['distinct_head_cells']:.2f} distinct cells per word, "
                  f"overlap {f['head_overlap']:.3f}")
    elif args.phase == "pointer":
        from captioner.atomic import write_text_atomic

        table = pointer_table([int(n) for n in args.pointer_lengths.split(",")], steps=args.pointer_steps)
        write_text_atomic(family.pointer_file, json.dumps({"rows": table, "cpu": _cpu_name()}, indent=2))
        for r in table:
            print(f"length {r['length']:>3}: exact match {100 * r['exact_match']:.1f} %  ({r['train_s']:.0f} s)")
    write_report(family)
    return 0


def _matmul_gflops(repeats: int = 10) -> float:
    """The machine's float32 matmul rate now (scripts/bench.py's reference product, 512x2048 @ 2048x2048): the
    yardstick printed beside every absolute speed."""
    import torch

    a, b = torch.randn(512, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * 512 * 2048 * 2048 / statistics.median(times) / 1e9


def _cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
