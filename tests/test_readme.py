"""The README's commands stay runnable as written, and its links lead somewhere (issue 28).

Every fenced ``bash`` block and every inline `captioner ...` code span of README.md is read:

- a `captioner <command> ...` must parse with that command's own argument parser (its ``main`` runs through
  the console entry point until its ``parse_args`` returns, then stops, so no hour-long training starts);
  a config it names must resolve as ``--config`` resolves it (a shipped name or a path) and load and
  validate with its ``--set`` overrides; every file it reads must exist in a fresh clone, unless it lies
  under ``data/`` (data sets are not in the repository) or ``runs/`` (written by training), or an earlier
  README command wrote it;
- `make X` must be a Makefile target, `pip install '.[X]'` an extra of pyproject.toml, any other file a
  command names must exist, and a program the checker does not know is an error (teach it, don't skip it).

The cheap commands then run for real, in README order, in a scratch directory laid out like the checkout
(without data/ and runs/): `python -c` code, the fenced Python blocks, `captioner caption` on files that
exist (with the shipped model), `captioner caption --list-models`, `captioner config ...` and `--help`.
The caption the README quotes for its photograph must be the one the shipped model gives.

Beyond the README: every `--flag` written after `captioner COMMAND` in a docs page or a config header must
be an option of that command, and every local link of the README and docs/ must lead to a file (and
heading) that exists.

The front door itself (issue 72): at most 150 lines, none wider than the page but tables and lone links; its sections
in a newcomer's order (set-up, captioning, your own photos, rebuilding a shipped model, results); how to reach the
installed command (`source .venv/bin/activate` or `.venv/bin/captioner`) before the first bare `captioner`; the
shipped config for your own photos loads with its small-data defaults; and the results table is the one
captioner/reports/readme.py makes from the records, not figures typed by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from captioner.reports import readme as readme_table
from captioner.reports.sections import current

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Paths a fresh clone does not have: data sets are placed there by the user, runs are written by training.
ABSENT_IN_A_CLONE = ("data", "runs")
# Argument destinations that name files or folders a command reads (checked), and ones it writes (noted).
READS = ("images", "checkpoint", "init", "resume", "results", "references", "data_root", "scores", "instances")
WRITES = ("attention_out", "out", "results_file")
MAX_LINES = 150  # issue 72: the README is a front door for who has just cloned; history and tables live in docs/
MAX_WIDTH = 120  # characters a line of prose or code may take (a table row or a lone link may be longer)
SECTIONS = ("Set-up", "Caption your photos", "Train on your own photos and captions", "Rebuild a shipped model",
            "Results")  # issue 72's order: what a newcomer does first comes first


@dataclass
class Command:
    argv: list[str]
    where: str  # "README.md:LINE" of the block or span
    fenced: bool  # a fenced block's command runs when cheap; an inline span is only checked


@dataclass
class PythonBlock:
    code: str
    where: str


# --- reading the README ---------------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def shell_lines(body: str) -> list[tuple[int, list[str]]]:
    """(line offset in the block, argv) of every command of a shell block: continuation lines joined, comments
    dropped, `a && b` split into two commands."""
    commands: list[tuple[int, list[str]]] = []
    pending, start = "", 0
    for i, line in enumerate(body.splitlines()):
        if not pending:
            start = i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            if words[:cut]:
                commands.append((start, words[:cut]))
            words = words[cut + 1:]
    return commands


def read_readme(text: str) -> list[Command | PythonBlock]:
    """The README's commands and Python blocks in document order."""
    items: list[tuple[int, Command | PythonBlock]] = []
    for block in FENCE.finditer(text):
        lang, body = block.group(1), block.group(2)
        first = _line_of(text, block.start(2))
        if lang in ("bash", "sh", "shell", "console"):
            for offset, argv in shell_lines(body):
                items.append((block.start(2) + offset, Command(argv, f"README.md:{first + offset}", fenced=True)))
        elif lang == "python":
            items.append((block.start(2), PythonBlock(body, f"README.md:{first}")))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # same line numbers, no fenced code
    for span in re.finditer(r"`([^`]+)`", prose):
        words = span.group(1).split()
        if words[:1] == ["captioner"] and len(words) > 1:
            argv = shlex.split(span.group(1))
            items.append((span.start(), Command(argv, f"README.md:{_line_of(prose, span.start())}", fenced=False)))
    return [item for _, item in sorted(items, key=lambda pair: pair[0])]


# --- checking one command -------------------------------------------------------------------------------


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace):
        self.namespace = namespace


def console_main():
    """The `captioner` console command's function, as pyproject.toml declares it."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["captioner"]
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def parse_captioner(args: list[str]) -> argparse.Namespace | str:
    """`captioner ARGS` run up to the end of its argument parsing: the namespace, or why it did not parse."""
    real_parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(real_parse_args(self, args, namespace))

    err = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = console_main()(args)
        except _Parsed as parsed:
            return parsed.namespace
        except SystemExit as exit_:
            return f"does not parse (exit {exit_.code}): {_last_line(err.getvalue())}"
    return f"stopped before parsing its options (exit {code}): {_last_line(err.getvalue())}"


def _last_line(text: str) -> str:
    """argparse and the dispatcher end with the error itself (after the usage)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(nothing on stderr)"


def _absent_in_a_clone(value: str) -> bool:
    parts = Path(value).parts
    return bool(parts) and parts[0] in ABSENT_IN_A_CLONE


def _shipped_models() -> set[str]:
    from captioner.store.zoo import scan_models

    return set(scan_models()[0])


def check_captioner(args: list[str], cwd: Path, files: bool = True) -> tuple[list[str], argparse.Namespace | None]:
    """Problems with `captioner ARGS` run from ``cwd`` (empty when none), and its parsed namespace. ``files``:
    whether the files it reads must exist (they may be written by an earlier README command)."""
    if any(a in ("-h", "--help") for a in args):
        return [], None  # help is checked by running it
    parsed = parse_captioner(args)
    if isinstance(parsed, str):
        return [parsed], None
    problems = []
    if hasattr(parsed, "config") and hasattr(parsed, "overrides"):
        from captioner.config import ConfigError, load_config, validate

        config = parsed.config
        if config is not None and not Path(config).is_absolute():
            config = cwd / config if (cwd / config).exists() else config  # a path from the clone, else a name
        try:
            validate(load_config(config, parsed.overrides))
        except ConfigError as error:
            problems.append(f"config: {error}")
    for dest in READS if files else ():
        values = getattr(parsed, dest, None)
        for value in [values] if isinstance(values, str) else values or []:
            value = str(value)
            if _absent_in_a_clone(value) or (cwd / value).exists():
                continue
            if dest == "checkpoint" and value in _shipped_models():
                continue
            problems.append(f"{dest}: {value} does not exist in a fresh clone (nor under data/ or runs/)")
    return problems, parsed


def is_cheap(args: list[str], parsed: argparse.Namespace | None) -> bool:
    """Whether a README command runs here in seconds: help, the shipped models' list, configs, and captions of
    files that exist with the shipped model."""
    if any(a in ("-h", "--help") for a in args):
        return True
    command = args[0] if args else ""
    if command == "config":
        return True
    if command == "caption" and parsed is not None:
        models = parsed.checkpoint or []  # several (an ensemble) since --model may repeat
        named = [str(p) for p in parsed.images] + ([models] if isinstance(models, str) else list(models))
        return not any(_absent_in_a_clone(p) for p in named)
    return False


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


def makefile_venv() -> str:
    """The folder `make demo` and `make test` install into (the Makefile's VENV)."""
    return re.search(r"^VENV\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)


def check_command(argv: list[str], cwd: Path, files: bool = True) -> list[str]:
    """Problems with one README shell command run from ``cwd`` (any program the README uses); ``files``: as
    for check_captioner."""
    program, args = argv[0], argv[1:]
    if program in ("captioner", f"{makefile_venv()}/bin/captioner"):  # the console script, or its path in .venv
        return check_captioner(args, cwd, files)[0]
    if program in ("source", "."):
        activate = f"{makefile_venv()}/bin/activate"
        return [] if args == [activate] else [f"{program}: only `{program} {activate}` (what make creates) is known"]
    if program == "torchrun":
        if "-m" in args and args[args.index("-m") + 1:args.index("-m") + 2] == ["captioner"]:
            return check_captioner(args[args.index("-m") + 2:], cwd, files)[0]
        return ["torchrun: only `torchrun ... -m captioner ...` is known here"]
    if program == "python":
        if args[:2] == ["-m", "captioner"]:
            return check_captioner(args[2:], cwd, files)[0]
        if args[:1] == ["-c"]:
            return []  # runs below
        script = next((a for a in args if not a.startswith("-")), "")
        return [] if script and (cwd / script).is_file() else [f"python: no script {script!r} in a fresh clone"]
    if program == "make":
        missing = [t for t in args if not t.startswith("-") and t not in makefile_targets()]
        return [f"make: no target {t!r} in the Makefile" for t in missing]
    if program == "pip":
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        problems = []
        for spec in (a for a in args if a.startswith(".")):
            named = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", spec)
            if named is None:
                problems.append(f"pip: cannot read {spec!r}")
            for extra in (named.group(1) or "").split(",") if named else []:
                if extra and extra not in extras:
                    problems.append(f"pip: no extra {extra!r} in pyproject.toml (valid: {', '.join(sorted(extras))})")
        return problems
    if program == "conda":
        files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-f", "--file")]
        return [f"conda: no {f!r} in a fresh clone" for f in files if not (cwd / f).is_file()]
    return [f"{program}: a program tests/test_readme.py does not know; teach it how to check it"]


def option_strings(command: str) -> set[str] | None:
    """Every option string `captioner COMMAND` accepts, its sub-commands' included (None: no such command)."""
    class _Got(Exception):
        def __init__(self, parser: argparse.ArgumentParser):
            self.parser = parser

    def grab(self, args=None, namespace=None):
        raise _Got(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab), \
            contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            console_main()([command])
        except _Got as got:
            parser = got.parser
        else:
            return None
    options = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= set(sub._option_string_actions)
    return options


def flags_named(text: str, yaml_comments: bool = False) -> list[tuple[str, str]]:
    """(command, --flag) for every flag that follows `captioner COMMAND` in the code of a Markdown page (fenced
    shell blocks line by line, without their comments; inline spans) or, with ``yaml_comments``, in the comment
    lines of a YAML file."""
    pieces: list[str] = []
    if yaml_comments:
        pieces = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    else:
        for block in FENCE.finditer(text):
            if block.group(1) in ("bash", "sh", "shell", "console"):
                pieces += [re.sub(r"(^|\s)#.*$", "", line) for line in block.group(2).replace("\\\n", " ").splitlines()]
        pieces += re.findall(r"`([^`]+)`", FENCE.sub("", text))
    found = []
    for piece in pieces:
        for use in re.finditer(r"\bcaptioner\s+([a-z]+)\b(.*?)(?=\bcaptioner\s+[a-z]+\b|&&|$)", piece, re.S):
            found += [(use.group(1), flag) for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", use.group(2))]
    return found


# --- a scratch checkout ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A directory laid out like a fresh clone: links to the checkout's top-level entries, without data/ and
    runs/; what README commands write lands here, not in the checkout."""
    where = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name not in ABSENT_IN_A_CLONE and entry.name not in (".git", ".venv"):
            (where / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return where


@pytest.fixture(scope="module")
def readme_items() -> list[Command | PythonBlock]:
    return read_readme(README.read_text())


# --- the checker can fail -------------------------------------------------------------------------------


@pytest.mark.parametrize("line, complaint", [
    ("captioner caption docs/photos/astronaut_attention.png --beem 3", "--beem"),
    ("captioner train --config flickr8k_sofft", "flickr8k_sofft"),
    ("captioner train --config shapes --set train.lrr=1e-3", "lrr"),
    ("captioner train --config shapes --set train.lr=-1", "train.lr"),
    ("captioner caption docs/photos/no_such_photo.png", "no_such_photo.png"),
    ("captioner evaluate --split val --beam 3", "--checkpoint"),
    ("captioner traine --config shapes", "traine"),
    ("make deploy", "deploy"),
    ("pip install -e '.[gpu]'", "gpu"),
    ("python scripts/no_such_script.py", "no_such_script.py"),
    ("curl https://example.com/weights.pt", "curl"),
    ("source venv/bin/activate", ".venv/bin/activate"),
    (".venv/bin/captioner caption --beem 3", "--beem"),
])
def test_the_checker_catches_a_broken_command(line, complaint, clone):
    (argv,) = [argv for _, argv in shell_lines(line)]
    problems = check_command(argv, clone)
    assert problems and complaint in " ".join(problems), problems


@pytest.mark.parametrize("line", [
    "captioner caption docs/photos/astronaut_attention.png --beam 5 --n-best 3 --attention-out out/",
    "captioner caption data/flickr8k/x.jpg --checkpoint runs/flickr8k_hard --attention-mode argmax",
    "captioner train --config configs/shapes.yaml --set train.epochs=1",
    "torchrun --nproc_per_node=2 -m captioner train --config coco_soft --set train.lr=1.6e-3",
    "captioner caption docs/photos/astronaut_attention.png --checkpoint flickr8k_soft",
    "make demo test",
    "pip install -e '.[serve]'",
    "source .venv/bin/activate",
    ".venv/bin/captioner config show my_photos",
])
def test_the_checker_accepts_a_good_command(line, clone):
    (argv,) = [argv for _, argv in shell_lines(line)]
    assert check_command(argv, clone) == []


def test_shell_lines_join_continuations_drop_comments_and_split_chains():
    body = "a --x 1 \\\n  --y 2   # a comment\n\nb c && d e\n"
    assert shell_lines(body) == [(0, ["a", "--x", "1", "--y", "2"]), (3, ["b", "c"]), (3, ["d", "e"])]


def test_the_reader_finds_fenced_and_inline_commands_in_order():
    text = "intro `captioner train --config shapes` and `captioner/configs`\n```bash\ncaptioner demo\n```\n" \
           "```python\nx = 1\n```\n```text\ncaptioner not a command\n```\n"
    items = read_readme(text)
    assert [(type(i).__name__, getattr(i, "argv", None), i.where) for i in items] == [
        ("Command", ["captioner", "train", "--config", "shapes"], "README.md:1"),
        ("Command", ["captioner", "demo"], "README.md:3"),
        ("PythonBlock", None, "README.md:6"),
    ]


# --- the README itself ----------------------------------------------------------------------------------


def test_readme_is_a_front_door():
    text = README.read_text()
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; history and details belong in docs/ (at most {MAX_LINES})"
    wide = [f"README.md:{n}: {len(line)} characters" for n, line in enumerate(text.splitlines(), start=1)
            if len(line) > MAX_WIDTH and not line.startswith(("|", "![", "<!--"))]
    assert not wide, "lines wider than the page (tables and lone links aside): " + "; ".join(wide)


def test_readme_sections_come_in_the_order_a_newcomer_needs_them():
    headings = re.findall(r"^## (.+)$", FENCE.sub("", README.read_text()), re.M)
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS), headings


def test_readme_has_the_two_setup_commands(readme_items):
    fenced = [item.argv for item in readme_items if isinstance(item, Command) and item.fenced]
    assert ["make", "demo"] in fenced and ["make", "test"] in fenced


def test_readme_says_how_to_reach_the_installed_command(readme_items):
    """make installs `captioner` into .venv, and every later command calls a bare `captioner`: the set-up section
    says how to reach it (activate the venv, or call it by its path), before the first bare `captioner`."""
    venv = makefile_venv()
    commands = [item for item in readme_items if isinstance(item, Command) and item.fenced]
    where = {" ".join(c.argv[:2]): i for i, c in reversed(list(enumerate(commands)))}
    assert f"source {venv}/bin/activate" in where, "the README does not say `source .venv/bin/activate`"
    path_call = next((i for i, c in enumerate(commands) if c.argv[0] == f"{venv}/bin/captioner"), None)
    assert path_call is not None, f"the README does not show `{venv}/bin/captioner`"
    first_bare = next(i for i, c in enumerate(commands) if c.argv[0] == "captioner")
    assert max(where[f"source {venv}/bin/activate"], path_call) < first_bare


def test_the_own_photos_config_ships_with_small_data_defaults(readme_items, tmp_path):
    """configs/my_photos.yaml is the README's way to train on your own photos (issue 72: no longer a Flickr8k config
    with four --sets that silently kept min_count 5, 8 epochs and an hour): it loads by name, with the defaults
    chosen for a few hundred to a few thousand photos, and its data section reads a captions folder."""
    from captioner.config import load_config, shipped_configs, validate
    from captioner.data.datasets import load_records

    assert "my_photos" in shipped_configs()
    cfg = load_config("my_photos")
    validate(cfg)
    assert (cfg.data.format, cfg.data.root, cfg.data.captions) == ("captions", "data/my_photos", "")
    assert cfg.data.min_count == 2 and (cfg.data.val_share, cfg.data.test_share) == (0.1, 0.1)
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.train.patience, cfg.train.time_budget_s) == (30, 32, 6, 0)
    assert cfg.train.patience < cfg.train.epochs  # patience can end the run: the base's 12 never ends its 8 epochs
    assert cfg.train.run_dir == "runs/my_photos" and cfg.model.decoder.feature_dropout == 0.5  # the recipe's model
    fenced = [item.argv for item in readme_items if isinstance(item, Command) and item.fenced]
    assert ["captioner", "train", "--config", "my_photos"] in fenced
    # the README's layout, with the captions file found in the folder (data.captions: "")
    from PIL import Image

    folder = tmp_path / "my_photos"
    (folder / "beach").mkdir(parents=True)
    rows = ["image,caption"]
    for i in range(10):
        Image.new("RGB", (32, 24), (25 * i, 0, 0)).save(folder / "beach" / f"{i:02d}.jpg")
        rows += [f"beach/{i:02d}.jpg,A red photo number {i}.", f"beach/{i:02d}.jpg,Another caption {i}."]
    (folder / "captions.csv").write_text("\n".join(rows) + "\n")
    data = load_config("my_photos", [f"data.root={folder}"]).data
    sizes = {split: len(load_records(data, split)) for split in ("train", "val", "test")}
    assert sizes == {"train": 8, "val": 1, "test": 1}


def test_the_results_table_is_the_one_its_records_give():
    """The README's numbers are not typed: the table between its markers is captioner/reports/readme.py's, made from the
    shipped models' records (their config.json) and the anchors' (docs/results/anchors.json); a figure that drifts
    from its record fails here. At most 8 rows and 8 columns: the full tables live in docs/."""
    import copy

    section = readme_table.TABLES[0]
    table = readme_table.format_table(readme_table.read_records(ROOT))
    assert current(README.read_text(), section, README) == table, (
        "README.md's results table is not the records': run captioner recipe report --write")
    rows = table.splitlines()[2:]
    assert 0 < len(rows) <= 8 and all(row.count("|") - 1 <= 8 for row in table.splitlines())
    records = readme_table.read_records(ROOT)
    for name in readme_table.SHIPPED:  # each shipped model's row shows its own record's figures
        row = next(r for r in rows if f"`{name}`" in r)
        assert f"| {records[name]['scores']['CIDEr-D']:.1f} |" in row and f"| {records[name]['split']}" in row
    drifted = copy.deepcopy(records)
    drifted["flickr8k_soft"]["scores"]["CIDEr-D"] += 0.1
    assert readme_table.format_table(drifted) != table  # the comparison above can fail


def test_the_anchor_figures_are_the_ones_the_docs_quote():
    """docs/results/anchors.json holds the paper's and the PyTorch port's figures, which docs/results.md quotes."""
    anchors = json.loads((ROOT / readme_table.ANCHORS).read_text())
    results = (ROOT / "docs" / "results.md").read_text()
    for name, record in anchors.items():
        assert record["source"] and record["split"] == "test", name
        for metric in ("BLEU-4", "METEOR"):
            assert str(record["scores"][metric]) in results, f"{name}: {metric} {record['scores'][metric]}"


def test_every_readme_command_parses(readme_items, clone):
    """Every command, fenced or inline, parses and names configs, targets and extras that exist (the files a
    captioner command reads are checked in README order, below, since earlier commands may write them)."""
    commands = [item for item in readme_items if isinstance(item, Command)]
    assert len(commands) >= 10, "the README's commands were not found: has the reader broken?"
    problems = []
    for command in commands:
        problems += [f"{command.where}: `{shlex.join(command.argv)}`: {p}"
                     for p in check_command(command.argv, clone, files=False)]
    assert not problems, "\n".join(problems)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_local_links_lead_to_files_and_headings_that_exist(page):
    text = FENCE.sub("", page.read_text())
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md":
            headings = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", FENCE.sub("", file.read_text()), re.M)}
            if anchor not in headings:
                problems.append(f"{target}: no heading with that anchor in {file.name}")
    assert not problems, f"{page.name}: " + "; ".join(problems)


PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "captioner" / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_the_docs_name_exists(page):
    """A flag written after `captioner COMMAND` in the README, a docs page or a config header is one that
    command's parser accepts (prose and placeholders are not parsed, so this is checked apart)."""
    problems = []
    for command, flag in flags_named(page.read_text(), yaml_comments=page.suffix == ".yaml"):
        options = _options(command)
        if options is None:
            problems.append(f"`captioner {command}`: no such command")
        elif flag not in options:
            problems.append(f"`captioner {command} {flag}`: no such option")
    assert not problems, f"{page.name}: " + "; ".join(sorted(set(problems)))


@functools.lru_cache
def _options(command: str) -> set[str] | None:
    return option_strings(command)


def test_flags_named_reads_code_not_prose():
    text = "the `--beam` flag and `captioner caption x.png --beam 3 --n-bset 2`\n```bash\n" \
           "captioner evaluate --split val  # not --this\ncaptioner serve --port 1 && captioner train --config x\n```\n"
    assert flags_named(text) == [("evaluate", "--split"), ("serve", "--port"), ("train", "--config"),
                                     ("caption", "--beam"), ("caption", "--n-bset")]
    assert "--n-bset" not in _options("caption") and "--n-best" in _options("caption")
    assert _options("no-such-command") is None


def test_the_cheap_readme_commands_run_as_written(readme_items, clone, monkeypatch, capsys):
    """In README order, in the scratch clone: each command's files must exist by the time it comes (the
    README's own earlier commands may write them); the cheap ones run and must succeed."""
    import captioner.api

    monkeypatch.setattr(captioner.api, "load_captioner", functools.lru_cache(captioner.api.load_captioner))
    monkeypatch.chdir(clone)
    main = console_main()
    captions: dict[str, str] = {}
    ran = 0
    for item in readme_items:
        if isinstance(item, PythonBlock):
            exec(compile(item.code, item.where, "exec"), {"__name__": "__readme__"})
            ran += 1
            continue
        argv = item.argv[2:] if item.argv[:3] == ["python", "-m", "captioner"] else item.argv
        if argv[0] == f"{makefile_venv()}/bin/captioner":
            argv = ["captioner", *argv[1:]]  # the same console script, reached by its path
        if argv[0] == "python" and argv[1:2] == ["-c"]:
            exec(compile(argv[2], item.where, "exec"), {"__name__": "__readme__"})
            ran += 1
            continue
        if argv[0] != "captioner":
            continue  # checked by the test above; make, pip and conda do not run here
        problems, parsed = check_captioner(argv[1:], clone)
        assert not problems, f"{item.where}: `{shlex.join(argv)}`: {problems}"
        if not (item.fenced and is_cheap(argv[1:], parsed)):
            continue
        capsys.readouterr()
        try:
            code = main(argv[1:])
        except SystemExit as exit_:  # --help
            code = exit_.code
        out = capsys.readouterr().out
        assert code == 0, f"{item.where}: `{shlex.join(argv)}` exited {code}"
        ran += 1
        for line in out.splitlines():
            image, _, caption = line.partition("\t")
            if argv[1] == "caption" and caption and image.strip():
                captions.setdefault(image, caption)
    assert ran >= 3, "the README's cheap commands were not found"
    quoted = re.search(r'\*\*"([^"]+)"\*\*', README.read_text())
    assert quoted, "the README quotes no caption for its photograph"
    photo = next(iter(captions), None)
    assert photo and captions[photo] == quoted.group(1), (
        f"the README quotes {quoted.group(1)!r}; `captioner caption {photo}` gives {captions.get(photo)!r}")
    assert (clone / "overlays").is_dir(), "the README's first caption command wrote no overlay"
