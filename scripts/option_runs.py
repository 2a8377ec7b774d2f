"""The runs of issue 55 (the training options researchers expect), one after another, resumable as
scripts/grounding_runs.py's (whose training and resume steps it uses): a finished step is skipped, an interrupted
training resumes from its last.pt.

    python scripts/option_runs.py run [--only NAME ...]   # train and evaluate what is not done yet
    python scripts/option_runs.py list                     # the steps and whether each is done

Every cross-entropy row trains configs/flickr8k_soft.yaml, the shipped recipe's first stage, at its own budget
(8 epochs, one hour), with one option changed; `xe_control` is the same run without it. Up-Down runs the whole
shipped soft recipe (XE, SCST, SCST, averaged: configs/flickr8k_updown*.yaml), against the shipped flickr8k_soft.
Each is evaluated with `captioner evaluate --split val --beam 3 --mirror-check --entities
data/flickr8k/flickr30k_entities --json`; its figures, commands and wall times go to
docs/training-options/rows/NAME.json. Diverse beam search needs no training: scripts/diverse_beam.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from grounding_runs import ROOT, train_and_evaluate

ROWS = ROOT / "docs" / "training-options" / "rows"
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
        {"name": "updown", "model": "runs/flickr8k_updown_scst_more/averaged.pt",
         "train": [["train", "--config", f"configs/flickr8k_updown{stage}.yaml"]
                   for stage in ("", "_scst", "_scst_more")]},
    ]


def _read(name: str) -> dict | None:
    path = ROWS / f"{name}.json"
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
    parser.add_argument("phase", choices=("run", "list"))
    parser.add_argument("--only", nargs="+", default=None, help="step names")
    parser.add_argument("--log", default="runs/options/train.log", help="where the training output goes")
    args = parser.parse_args(argv)
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
