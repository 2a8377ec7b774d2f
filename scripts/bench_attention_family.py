"""The attention family's measurements beside its runs (docs/attention-family.md): training and decoding speed with the
variants taking turns, what a multi-head variant's heads read apart, and the pointer network's sorting table.

    python scripts/bench_attention_family.py speed [--variant soft_dot ...]   # captions/s and images/s, alternating
    python scripts/bench_attention_family.py heads                            # a multi-head variant's heads, apart
    python scripts/bench_attention_family.py pointer                          # the pointer network sorting numbers

The variants are the recipe's (captioner/recipes/attention_family.yaml; `captioner recipe run attention_family`
trains and records them); each phase writes its JSON beside the records (docs/attention-family/speed.json,
heads.json, pointer.json), from which `captioner recipe report --write` writes the page's tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runnable from a checkout without install

from captioner.config import Config  # noqa: E402


@dataclass(frozen=True)
class Variant:
    """One variant of the study: its name, the config its last stage trains with, its run folder, and whether it is
    recorded (finished)."""

    name: str
    cfg: Config
    run: Path
    recorded: bool


def variants(recipe: str = "attention_family", names: Sequence[str] | None = None) -> list[Variant]:
    from captioner.training.recipes import load_recipes, plan

    out = []
    for r in load_recipes(recipe, list(names) if names else None):
        planned = plan(r)
        if planned:  # a variant without stages evaluates another's weights: nothing of its own to time
            cfg = planned[-1].cfg
            out.append(Variant(r.variant, cfg, Path(cfg.train.run_dir), Path(r.record).is_file()))
    return out


# --------------------------------------------------------------------------- speed, alternating


def measure_speed(variants: Sequence[Variant], repeats: int = 5, train_steps: int = 3, decode_images: int = 32,
                  batch_size: int = 64, words: int = 20) -> dict[str, dict]:
    """Training captions/s and decoding images/s (beam 3, ``words`` words per caption: <end> held off so every row
    decodes as many steps) of every finished row, in one process, the rows taking turns ``repeats`` times (medians):
    the machine's drift touches every row alike. Each row's model is built from its config with fresh weights (the
    time of a step does not depend on the weights' values), so no checkpoint is needed."""
    import torch

    from captioner.api import build_model
    from captioner.data.datasets import GridCaptionDataset, build_vocab, collate_captions, load_records
    from captioner.training.inputs import open_feature_cache
    from captioner.training.loop import _TrainForward
    from captioner.training.objectives.registry import build_objective
    from captioner.training.optim import optimizer_for

    ready = [v for v in variants if v.recorded]
    if not ready:
        return {}
    models, inputs = {}, {}
    for row in ready:
        cfg = row.cfg  # its pretrained backbone names the rows' cache
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


def measure_heads(variants: Sequence[Variant], images: int = 1000, words: int = 20) -> dict[str, dict]:
    """``head_figures`` of every finished multi-head row, over the maps of its greedy captions for the first
    ``images`` val photos (its best.pt, at most ``words`` words; the word <end> and what follows are left out)."""
    import torch

    from captioner.api import load_model
    from captioner.data.datasets import load_records
    from captioner.training.inputs import open_feature_cache

    figures = {}
    for row in variants:
        checkpoint = row.run / "best.pt"
        if row.cfg.model.attention.attention != "multi_head" or not checkpoint.exists():
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("speed", "heads", "pointer"))
    parser.add_argument("--recipe", default="attention_family", help="the study (a shipped name or a file)")
    parser.add_argument("--variant", action="append", default=None, help="a variant alone (repeatable)")
    parser.add_argument("--out", default="docs/attention-family", help="the folder of the JSON it writes")
    parser.add_argument("--repeats", type=int, default=5, help="speed: rounds of the variants taking turns")
    parser.add_argument("--head-images", type=int, default=1000, help="heads: val photos captioned")
    parser.add_argument("--pointer-steps", type=int, default=1500)
    parser.add_argument("--pointer-lengths", default="5,10,20")
    args = parser.parse_args(argv)
    from captioner.atomic import write_text_atomic
    from captioner.training.provenance import cpu_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "speed":
        figures = measure_speed(variants(args.recipe, args.variant), repeats=args.repeats)
        write_text_atomic(out / "speed.json", json.dumps({"rows": figures, "cpu": cpu_model(),
                                                          "matmul_gflops": round(_matmul_gflops(), 1),
                                                          "measured": time.strftime("%Y-%m-%d %H:%M")},
                                                         indent=2) + "\n")
        for name, f in figures.items():
            print(f"{name:<20} train {f['train_captions_per_s']:8.1f} captions/s   "
                  f"decode {f['decode_images_per_s']:7.1f} images/s")
    elif args.phase == "heads":
        figures = measure_heads(variants(args.recipe, args.variant), images=args.head_images)
        write_text_atomic(out / "heads.json", json.dumps({"rows": figures}, indent=2) + "\n")
        for name, f in figures.items():
            print(f"{name:<20} {f['heads']} heads: head α max {f['head_alpha_max']:.3f} (mean map "
                  f"{f['mean_map_alpha_max']:.3f}), {f['distinct_head_cells']:.2f} distinct cells per word, "
                  f"overlap {f['head_overlap']:.3f}")
    else:
        table = pointer_table([int(n) for n in args.pointer_lengths.split(",")], steps=args.pointer_steps)
        write_text_atomic(out / "pointer.json", json.dumps({"rows": table, "cpu": cpu_model()}, indent=2))
        for r in table:
            print(f"length {r['length']:>3}: exact match {100 * r['exact_match']:.1f} %  ({r['train_s']:.0f} s)")
    print(f"written to {out}; the page's tables: captioner recipe report --write")
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


if __name__ == "__main__":
    raise SystemExit(main())
