"""`captioner recipe list | show NAME | run NAME [--variant V] [--dry-run] [--only STAGE] [--redo STAGE] |
report [PATH ...] | report --write | --check`: the chains of runs behind the shipped models and the studies
(captioner/recipes/*.yaml, or a recipe file by path), shown, run stage by stage and resumed (captioner/training/
recipes.py reads and plans a recipe, captioner/training/recipe_runs.py runs it and writes its record), and the table
of their records; `report --write` renders every generated table of README, docs/ and the model cards from the
records (captioner/reports/), `--check` says which differ."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from captioner.atomic import write_text_atomic
from captioner.reports.recipes import find_records, format_report
from captioner.reports.records import RecordError
from captioner.reports.sections import ROOT, ReportError, write_tables
from captioner.training.recipe_runs import read_json, run_recipes
from captioner.training.recipes import EVALUATE, RecipeError, describe, load_recipes, plan, shipped_recipes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captioner recipe",
        description="A recipe is a model's whole chain of runs: its stages in order (a config with its overrides, "
                    "each starting from the weights of the one before), its evaluation and its record.")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the shipped recipes, usable by name")
    show = sub.add_parser("show", help="a recipe's stages: config, overrides, run folder, budget, command (a "
                                       "study: its variants, or with --variant their stages)")
    show.add_argument("recipe", help="a shipped recipe's name or a recipe file")
    run = sub.add_parser("run", help="run the stages not done yet (an interrupted one continues from its last.pt), "
                                     "then the evaluation, and write the record (a study: each variant's in turn)")
    run.add_argument("recipe", help="a shipped recipe's name or a recipe file")
    for command in (show, run):
        command.add_argument("--variant", action="append", default=None, metavar="NAME",
                             help="a study's variant alone (repeatable; default: every variant)")
    run.add_argument("--dry-run", action="store_true", help="print the commands that would run; run nothing")
    run.add_argument("--only", default=None, metavar="STAGE",
                     help=f"run this stage alone (the ones before it done), or {EVALUATE!r}: the evaluation alone")
    run.add_argument("--redo", default=None, metavar="STAGE",
                     help="train this stage afresh, and the stages after it (they start from its weights): what a "
                          "change of its inputs since its record needs; "
                          f"{EVALUATE!r}: evaluate again")
    report = sub.add_parser("report", help="a table of the recipes' records; --write / --check: every generated "
                                           "table of README, docs/ and the model cards")
    report.add_argument("paths", nargs="*", metavar="PATH",
                        help="record files, or folders searched for record.json (default: the shipped recipes' "
                             "records and runs/recipes/)")
    report.add_argument("--out", default=None, help="also write the table (Markdown) to this file")
    pages = report.add_mutually_exclusive_group()
    pages.add_argument("--write", action="store_true",
                       help="rewrite every generated table of the checkout (README, docs/, the model cards) from "
                            "the records")
    pages.add_argument("--check", action="store_true",
                       help="only say which generated tables differ from what the records give (exit 1 if any)")
    report.add_argument("--table", action="append", default=None, metavar="NAME",
                        help="with --write or --check: this table alone (repeatable)")
    report.add_argument("--plots", action="store_true", help="with --write: draw the docs' plots again too")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(None if argv is None else list(argv))
    try:
        if args.action == "list":
            for name, path in shipped_recipes().items():
                recipes = load_recipes(path)
                study = f" (a study: {len(recipes)} variants)" if recipes[0].variant is not None else ""
                print(f"{name:<20} {recipes[0].description}{study}")
        elif args.action == "show":
            recipes = load_recipes(args.recipe, args.variant)
            if recipes[0].variant is not None and not args.variant:
                print(_study_table(recipes))
            else:
                print("\n\n".join(describe(recipe, plan(recipe)) for recipe in recipes))
        elif args.action == "run":
            return run_recipes(load_recipes(args.recipe, args.variant), only=args.only, redo=args.redo,
                               dry_run=args.dry_run, say=lambda line: print(line, flush=True))
        elif args.write or args.check:
            return _pages(args)
        else:
            records = find_records(args.paths)
            if not records:
                print("captioner recipe report: no records found (`captioner recipe run NAME` writes one)",
                      file=sys.stderr)
                return 1
            table = format_report(records)
            print(table)
            if args.out:
                write_text_atomic(args.out, table + "\n")
    except (RecipeError, ReportError, RecordError) as err:
        print(f"captioner recipe: error: {err}", file=sys.stderr)
        return 1
    return 0


def _study_table(recipes: list) -> str:
    """A study's variants: each one's stages, evaluation and whether its record exists."""
    first = recipes[0]
    lines = [f"{first.name}: {first.description}", f"  file     {first.path}",
             f"  records  {Path(first.record).parent}/VARIANT.json", ""]
    width = max(len(r.variant) for r in recipes)
    for recipe in recipes:
        record = read_json(Path(recipe.record))
        state = ("recorded" + (" (before recipes)" if "evaluation" not in record else "")) if record else "to do"
        stages = (", ".join(s.config for s in recipe.stages) if recipe.stages
                  else f"evaluates {recipe.evaluation.model}")
        lines.append(f"  {recipe.variant:<{width}}  {state:<26} {stages}")
    lines += ["", f"captioner recipe show {first.name} --variant NAME: a variant's stages and commands"]
    return "\n".join(lines)


def _pages(args: argparse.Namespace) -> int:
    """``report --write`` / ``--check``: the generated tables of the checkout, from the records."""
    if args.paths or args.out:
        raise ReportError("--write and --check read every record of the checkout; they take no PATH or --out")
    differ = write_tables(check=args.check, only=args.table)
    if args.check:
        for line in differ:
            print(f"differs from its records: {line}")
        print("every generated table matches its records" if not differ else
              f"{len(differ)} table{'s' if len(differ) > 1 else ''} differ: captioner recipe report --write")
        return 1 if differ else 0
    for line in differ:
        print(f"rewritten: {line}")
    if args.plots:
        from captioner.reports.family import write_plots

        for path in write_plots(ROOT):
            print(f"drawn: {path}")
    print(f"{len(differ) or 'no'} table{'s' if len(differ) != 1 else ''} changed")
    return 0
