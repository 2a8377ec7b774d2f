"""Before and after a refactor: the same floats? Trains the first epoch of each named config in two checkouts of the
project (``--before``, ``--after``: e.g. ``git worktree add /tmp/before <commit>``), and evaluates each named model
in both, then compares every figure the two report.

    python scripts/same_floats.py --before /tmp/before --after . --evaluate flickr8k flickr8k_hard \\
        --train flickr8k_soft flickr8k_hard flickr8k_hard_gumbel_from_soft:train.init=flickr8k

Each checkout runs its own code and its own copy of the config (so a renamed key is read the way that version
reads it); ``--set`` overrides go to both sides of every run, ``CONFIG:KEY=VALUE,...`` to both sides of one.
Trained: the first epoch's metrics line (losses, BLEU-4, CIDEr-D, every attention figure, ...: all but times and
throughput) and the weights of last.pt, tensor by tensor. Evaluated: ``captioner evaluate --json`` on val at beam 3
with the PTB tokenizer (``--entities DIR``: with the box figures), key for key. Prints one line per run and exits 1
if anything differs. The runs go to ``--out`` (default runs/same-floats), one at a time (2 cores: a training epoch
of Flickr8k takes minutes).

``--bench N``: the speed, too: ``scripts/bench.py --only train,decode --configs F8K --json`` (``--bench-configs``
picks others: R7,F8K) in each checkout in turn, N rounds (before, after, before, ...: the machine's drift touches
both alike), then per rate the median of the N paired ratios after/before with their range. A rate, not a float to
match: it reports, never fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# figures that measure time, not the model: they differ run to run
_TIMES = ("time", "per_s", "_s")


def _run(tree: Path, args: list[str], log: Path, script: list[str] | None = None) -> None:
    """``captioner ARGS`` (or ``python SCRIPT...``) in ``tree``, its output (stdout only for a script) to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE", "CAPTIONER_AUTO_DEVICE": "cpu"}
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, *script] if script else [sys.executable, "-m", "captioner", *args]
    errors = log.with_suffix(".err") if script else log  # a script's stdout is its JSON: its stderr goes beside
    with open(log, "w", encoding="utf-8") as out:
        with open(errors, "w", encoding="utf-8") if script else out as err:
            code = subprocess.call(command, cwd=tree, stdout=out, stderr=err, env=env)
    if code != 0:
        tail = "\n".join(errors.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"{tree}: {' '.join((script or ['captioner', *args])[:4])} ... failed (exit {code}); "
                         f"{errors}:\n{tail}")


def _figures(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if not any(t in k for t in _TIMES)}


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every key path where two JSON values differ (floats compared exactly). A key one side lacks where the other
    side's value is None (a figure neither measured: e.g. the metrics line's "baseline" of runs without one, which
    earlier versions wrote as null) is no difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))
               if {**a, **b}[k] is not None]
        for k in sorted(set(a) & set(b)):
            if not any(t in k for t in _TIMES):
                out += _differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def _same_weights(before: Path, after: Path) -> list[str]:
    import torch

    a = torch.load(before, map_location="cpu", weights_only=False)["model"]
    b = torch.load(after, map_location="cpu", weights_only=False)["model"]
    if a.keys() != b.keys():
        return [f"weights: the tensors differ ({sorted(set(a) ^ set(b))[:4]})"]
    return [f"weights: {k} differs" for k in a if not torch.equal(a[k], b[k])]


def train_first_epoch(named: str, trees: dict[str, Path], out: Path, sets: list[str]) -> list[str]:
    config, _, own = named.partition(":")
    sets = [*sets, *filter(None, own.split(","))]
    runs = {}
    for side, tree in trees.items():
        runs[side] = out / side / config
        flags = [arg for s in ["train.epochs=1", f"train.run_dir={runs[side]}", "train.tensorboard=off", *sets]
                 for arg in ("--set", s)]
        print(f"  {side}: training {config}, epoch 1 ...", flush=True)
        _run(tree, ["train", "--config", f"configs/{config}.yaml", *flags], out / f"{side}-{config}.log")
    entries = {side: json.loads((run / "metrics.jsonl").read_text().splitlines()[0]) for side, run in runs.items()}
    return (_differences(_figures(entries["before"]), _figures(entries["after"]))
            + _same_weights(runs["before"] / "last.pt", runs["after"] / "last.pt"))


def evaluate(model: str, trees: dict[str, Path], out: Path, extra: list[str] = ()) -> list[str]:
    results = {}
    for side, tree in trees.items():
        target = out / side / f"evaluate-{model}.json"
        print(f"  {side}: evaluating {model} ...", flush=True)
        _run(tree, ["evaluate", "--model", model, "--split", "val", "--beam", "3", "--tokenizer", "ptb", "--json",
                    "--out", str(target), *extra], out / f"{side}-evaluate-{model}.log")
        results[side] = json.loads(target.read_text())
    return _differences(results["before"], results["after"])


def _rates(result: Any, path: str = "") -> dict[str, float]:
    """Every throughput of a bench.py result (a key ending in "per_s"), by its key path."""
    if isinstance(result, dict):
        return {k: v for key, value in result.items() for k, v in _rates(value, f"{path}.{key}").items()}
    return {path: float(result)} if path.endswith("per_s") and isinstance(result, (int, float)) else {}


def bench(trees: dict[str, Path], out: Path, rounds: int, configs: str = "F8K") -> None:
    import statistics

    ratios: dict[str, list[float]] = {}
    for i in range(rounds):
        rates = {}
        for side, tree in trees.items():
            log = out / f"{side}-bench-{i}.json"
            print(f"  round {i + 1}/{rounds}: {side} ...", flush=True)
            _run(tree, [], log, script=["scripts/bench.py", "--only", "train,decode", "--configs", configs, "--json"])
            rates[side] = _rates(json.loads(log.read_text()))
        for key in rates["before"].keys() & rates["after"].keys():
            ratios.setdefault(key, []).append(rates["after"][key] / rates["before"][key])
    for key, values in sorted(ratios.items()):
        print(f"bench {key.lstrip('.')}: after/before median {statistics.median(values):.3f} "
              f"(range {min(values):.3f}-{max(values):.3f}, {len(values)} pairs)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout before the change")
    parser.add_argument("--after", type=Path, default=Path("."), help="the checkout after it (default: here)")
    parser.add_argument("--train", nargs="*", default=[], help="shipped configs whose first epoch to compare")
    parser.add_argument("--evaluate", nargs="*", default=[], help="shipped models to evaluate on val in both")
    parser.add_argument("--set", action="append", default=[], help="an override both sides' training takes")
    parser.add_argument("--bench", type=int, default=0, metavar="N", help="also N rounds of bench.py, alternating")
    parser.add_argument("--entities", default=None, help="evaluate with the box figures of this Flickr30k Entities "
                                                             "folder too")
    parser.add_argument("--bench-configs", default="F8K", help="bench.py's --configs (e.g. R7,F8K)")
    parser.add_argument("--out", type=Path, default=Path("runs/same-floats"))
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    out = args.out.resolve()
    failed = False
    boxes = ["--entities", args.entities] if args.entities else []
    for kind, names, check in (("train", args.train, lambda n: train_first_epoch(n, trees, out, args.set)),
                               ("evaluate", args.evaluate, lambda n: evaluate(n, trees, out, boxes))):
        for name in names:
            diffs = check(name)
            failed |= bool(diffs)
            print(f"{kind} {name}: " + ("identical" if not diffs else f"{len(diffs)} differences"), flush=True)
            for line in diffs[:20]:
                print(f"    {line}")
    if args.bench:
        bench(trees, out, args.bench, args.bench_configs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
