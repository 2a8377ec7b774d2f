"""The package's import rules (issues 15, 28 and 55), read from the source with ``ast`` so they stay true:

- no import cycles: the graph of which module imports which has no circle, not even through a function-level
  import (``api`` <-> ``zoo`` and ``config`` <-> ``data/datasets`` were two), nor between wings (``config`` <->
  ``training/`` was one: config read the objectives' sections there); the graph includes the imports by name
  (``cli.py``'s dispatch, each family's ``IMPLEMENTATION`` paths);
- ``captioner/config.py`` is a leaf: it checks names against ``captioner/names.py`` and reads the decoder
  families' and the training objectives' torch-free sections (``models/decoders/*_config.py``,
  ``objective_sections.py``), and loads without torch;
- ``captioner/models/`` holds pure modules: they import neither the data layer, the config, the
  checkpoint format nor the application (``captioner.api``) or the command line;
- ``captioner/data/`` knows files and records, not models;
- the command line (``cli.py``, ``commands/``, ``__main__.py``) owns every ``main``: no library module defines
  one or imports a command;
- the wings (issue 37) keep their floors: ``decoding/`` (the searches and their options) sits below the models,
  ``store/`` (checkpoints, model folders, the zoo) below the application (``api.py``), ``evaluation/`` above it,
  ``training/`` and ``serving/`` beside each other on top, and ``commands/`` over everything (WINGS below).

Every import counts, function-level (lazy) and ``TYPE_CHECKING`` ones included.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "captioner"
COMMAND_MODULES = ("captioner.cli", "captioner.commands", "captioner.__main__")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` gives a.b and a.b.c), relative imports resolved."""
    return _imports(_package_of(path), ast.parse(path.read_text(), filename=str(path)))


def _package_of(path: Path) -> str:
    """The package a file's relative imports start from (for an ``__init__.py``, its own package)."""
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])


def _imports(package: str, tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)} imports {name}"
            for path in files for name in sorted(imported_modules(path))
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# --------------------------------------------------------------------------- the import graph


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    """Module -> the package modules it imports, from ``sources`` (module -> (package its relative imports start
    from, source text)). ``from a import b`` is an arrow to the module a.b when there is one, else to a (b is a
    name a defines); ``import a.b`` to the deepest module of a.b there is. Other packages are left out."""
    def deepest(name: str) -> str:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, (package, source) in sources.items():
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets.update(deepest(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else deepest(base)
                               for a in node.names)
        graph[module] = targets - {""}
    return graph


def package_graph() -> dict[str, set[str]]:
    """The package's import graph, with the imports no import statement shows: cli.py's dispatch (``COMMANDS``,
    by importlib) and each family's builder importing the classes its sections name (``dynamic_imports``)."""
    sources = {module_name(p): (_package_of(p), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    graph = import_graph(sources)
    for module, targets in dynamic_imports().items():
        graph[module] |= targets
    return graph


def dynamic_imports() -> dict[str, set[str]]:
    """Module -> the modules it imports by name at run time: cli.py each command's module, and each family's
    builder (models/decoders/registry.py, training/objectives/registry.py) the module of every class its
    family's sections name (``IMPLEMENTATION``, registration.py)."""
    from captioner.cli import COMMANDS
    from captioner.models.decoders import DECODERS
    from captioner.objective_sections import OBJECTIVES

    def named(family) -> set[str]:
        return {section.IMPLEMENTATION.partition(":")[0] for _, section in family.items()}

    return {"captioner.cli": {module for module, _ in COMMANDS.values()},
            "captioner.models.decoders.registry": named(DECODERS),
            "captioner.training.objectives.registry": named(OBJECTIVES)}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one module, and each
    module that imports itself, as a sorted list (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_the_cycle_finder_finds_circles_of_any_length_and_self_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a", "g"}, "g": {"f"}}
    assert find_cycles(graph) == [["a", "b", "c"], ["e"], ["f", "g"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_the_old_cycles_through_lazy_relative_and_type_checking_imports():
    """The circles issue 28 found, written as they were: api <-> zoo through function-level imports,
    config <-> data/datasets through a TYPE_CHECKING import, datasets <-> captions_file through a relative
    one; and ``from captioner.store import zoo`` (a submodule) is an arrow to zoo, not to the package."""
    sources = {
        "captioner": ("captioner", "def load():\n    from captioner.api import load_captioner\n"),
        "captioner.api": ("captioner", "def load_captioner():\n    from captioner.store.zoo import load_shipped\n"),
        "captioner.store.zoo": ("captioner", "def export_model():\n    from captioner.api import load_captioner\n"),
        "captioner.config": ("captioner", "from captioner.data.datasets import LOADERS\n"),
        "captioner.data": ("captioner.data", ""),
        "captioner.data.datasets": (
            "captioner.data", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from captioner.config import DataConfig\ndef load():\n    from . import captions_file\n"),
        "captioner.data.captions_file": ("captioner.data", "from .datasets import DataError\nimport numpy\n"),
        "captioner.training.loop": ("captioner", "from captioner.store import zoo\nimport captioner.data.datasets\n"),
    }
    graph = import_graph(sources)
    assert graph["captioner.training.loop"] == {"captioner.store.zoo", "captioner.data.datasets"}
    assert graph["captioner.data.captions_file"] == {"captioner.data.datasets"}
    assert find_cycles(graph) == [["captioner.api", "captioner.store.zoo"],
                                  ["captioner.config", "captioner.data.captions_file", "captioner.data.datasets"]]
    sources["captioner.store.zoo"] = ("captioner", "import os\n")
    sources["captioner.config"] = ("captioner", "from captioner.names import SPLITS\n")
    assert find_cycles(import_graph(sources)) == [["captioner.data.captions_file", "captioner.data.datasets"]]


def test_the_package_has_no_import_cycles():
    graph = package_graph()
    assert len(graph) > 50 and "captioner.store.zoo" in graph["captioner.api"]  # read: api loads the shipped models
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles (each: modules that import each other, directly or around a circle):\n" + \
        "\n".join("  " + " <-> ".join(c) for c in cycles)


def wing_of(module: str) -> str:
    """The wing a module belongs to: its top-level package (``captioner.training``), or a top-level module itself
    (``captioner.config``)."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1] / "__init__.py").is_file():
        return ".".join(parts[:2])
    return module


def wing_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with each module replaced by its wing (an arrow within a wing dropped)."""
    wings: dict[str, set[str]] = {}
    for module, targets in graph.items():
        wing = wing_of(module)
        wings.setdefault(wing, set()).update(wing_of(t) for t in targets)
    return {wing: targets - {wing} for wing, targets in wings.items()}


def test_the_wing_graph_sees_a_loop_that_no_two_files_make():
    """config.py reading training/objectives/sections.py (a leaf) while training/loop.py reads config.py: no
    file imports itself around a circle, but the two wings lean on each other (issue 55)."""
    graph = {"captioner.config": {"captioner.training.objectives.sections"},
             "captioner.training.objectives.sections": set(),
             "captioner.training.loop": {"captioner.config", "captioner.training.objectives.sections"}}
    assert find_cycles(graph) == []
    assert find_cycles(wing_graph(graph)) == [["captioner.config", "captioner.training"]]


def test_the_wings_import_each_other_without_a_circle():
    """Every import, the dispatch and the families' lazy class paths included (package_graph), between wings
    and top-level modules: no two lean on each other."""
    graph = wing_graph(package_graph())
    assert "captioner.training" in graph["captioner.commands"] and "captioner.commands" in graph["captioner.cli"]
    cycles = find_cycles(graph)
    assert cycles == [], "wings that import each other:\n" + "\n".join("  " + " <-> ".join(c) for c in cycles)


def test_the_dispatch_and_the_families_class_paths_name_real_modules_on_allowed_floors():
    """What cli.py imports by name is a command module; what a family's builder imports by name (its sections'
    IMPLEMENTATION) sits in its own wing, so the builder's floor rules hold for it as for a written import."""
    dynamic = dynamic_imports()
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    assert all(_in(m, ("captioner.commands",)) and m in modules for m in dynamic["captioner.cli"])
    for builder, targets in dynamic.items():
        assert targets and targets <= modules, (builder, targets - modules)
        wing = builder.split(".")[1]
        if wing in WINGS:
            assert all(wing_of(t) == wing_of(builder) and not _in(t, WINGS[wing]) for t in targets), (builder, targets)


def _family_config(module: str) -> bool:
    """A decoder family's or a training objective's torch-free config module (or the decoders' package's own,
    which lists them), or the registration helper they share."""
    if module in ("captioner.objective_sections", "captioner.registration"):
        return True
    name = module.removeprefix("captioner.models.decoders")
    return name in ("", ".family") or (name.startswith(".") and name.endswith("_config"))


def test_config_is_a_leaf_and_loads_without_torch():
    """config.py reads names.py, atomic.py, the decoder families' configs (models/decoders/*_config.py,
    family.py, the package's table of them), the training objectives' sections (objective_sections.py, on the
    floor) and registration.py, which import nothing else of the package, and no torch; nothing of training/."""
    graph = package_graph()
    assert graph["captioner.config"] <= {"captioner.names", "captioner.atomic", "captioner.models.decoders",
                                         "captioner.objective_sections", "captioner.registration",
                                         "captioner.decoding.options", "captioner.config_files"}
    assert graph["captioner.config_files"] <= {"captioner.registration"}  # the files and their bases: yaml
    reached, todo = set(), ["captioner.config"]
    while todo:
        for target in graph[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    families = reached - {"captioner.names", "captioner.atomic", "captioner.decoding.options",
                          "captioner.config_files"}
    assert len(families) >= 4 and all(_family_config(m) for m in families), sorted(families)
    code = ("import sys\nimport captioner.config\ncaptioner.config.load_config('smoke')\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'captioner'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    loaded = ast.literal_eval(out)
    assert [m for m in loaded if not _family_config(m)] == ["captioner", "captioner.config",
                                                            "captioner.config_files", "captioner.decoding",
                                                            "captioner.decoding.options", "captioner.models",
                                                            "captioner.names", "captioner.version"], out
    assert {m for m in loaded if _family_config(m)} == families, out


# --------------------------------------------------------------------------- layers


def test_the_helper_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    module = PACKAGE / "models" / "_probe.py"  # never written: parsed from a string below
    source = "import os\nfrom . import scorers\ndef f():\n    from captioner.data.vocab import Vocab\n"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    names = imported_modules(module)
    assert {"os", "captioner.models.scorers", "captioner.data.vocab", "captioner.data.vocab.Vocab"} <= names
    assert _violations([module], ("captioner.data",)) == [
        "captioner/models/_probe.py imports captioner.data.vocab",
        "captioner/models/_probe.py imports captioner.data.vocab.Vocab"]


ABOVE_THE_MODELS = ("captioner.api", "captioner.demo", "captioner.store", "captioner.evaluation",
                    "captioner.training", "captioner.serving", *COMMAND_MODULES)
# wing -> what none of its modules may import (every module a wing may import sits on a lower floor)
WINGS: dict[str, tuple[str, ...]] = {
    # the speed code and the reference switch (issue 46): on the floor, so the paper's code anywhere may pick a
    # fast path from it
    "fast": ("captioner.decoding", "captioner.models", "captioner.data", "captioner.config", *ABOVE_THE_MODELS),
    "decoding": ("captioner.models", "captioner.data", "captioner.config", *ABOVE_THE_MODELS),
    "models": ("captioner.data", "captioner.config", *ABOVE_THE_MODELS),
    "data": ("captioner.models", "captioner.decoding", *ABOVE_THE_MODELS),
    "store": ("captioner.api", "captioner.demo", "captioner.evaluation", "captioner.training", "captioner.serving",
              *COMMAND_MODULES),
    "evaluation": ("captioner.demo", "captioner.training", "captioner.serving", *COMMAND_MODULES),
    "training": ("captioner.demo", "captioner.serving", *COMMAND_MODULES),
    "serving": ("captioner.demo", "captioner.training", *COMMAND_MODULES),
}


def test_every_module_lives_in_a_wing_or_is_one_of_the_few_at_the_top():
    """The floor stays short: a new module goes into a wing (or says here why it cannot)."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    # objective_sections.py: the objectives' torch-free sections sit below config.py, which reads them, and
    # registration.py: the one helper that builds what a section names, under both families; config_files.py:
    # config files and their chains of bases, below config.py
    assert top == ["__init__", "__main__", "api", "atomic", "cli", "config", "config_files", "demo", "names",
                   "objective_sections",
                   "registration", "runtime", "version", "visualize"]
    assert set(WINGS) <= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


@pytest.mark.parametrize("path", [p for wing in WINGS for p in sorted((PACKAGE / wing).rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_wing_imports_only_from_lower_floors(path):
    wing = path.relative_to(PACKAGE).parts[0]
    assert _violations([path], WINGS[wing]) == []


def test_the_api_sits_below_evaluation_training_and_serving():
    assert _violations([PACKAGE / "api.py"], WINGS["store"][1:]) == []


def _library() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not _in(module_name(p), COMMAND_MODULES)]


def test_training_imports_no_command_module():
    assert _violations(sorted((PACKAGE / "training").glob("*.py")), COMMAND_MODULES) == []


def test_no_library_module_imports_a_command():
    assert len(_library()) > 40
    assert _violations(_library(), COMMAND_MODULES) == []


def test_the_command_line_owns_every_main():
    """Library modules keep the functions commands call (train(), evaluate_model(), ...); the parsing, the
    ``main`` and the ``python -m`` entry live in cli.py, commands/ and __main__.py."""
    found = []
    for path in _library():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.Assign)) and "main" in (
                    [node.name] if isinstance(node, ast.FunctionDef) else [getattr(t, "id", "") for t in node.targets]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} defines main")
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} runs as a script")
    assert found == []


MAX_FUNCTION_LINES = 80


def long_functions(paths: list[Path], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function or method in ``paths`` longer than ``limit`` lines (decorators and docstring included)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - first + 1
                if length > limit:
                    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_the_length_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n    return x0\n")
    assert [line.split(" ", 1)[1] for line in long_functions([tmp_path / "long.py"])] == ["long (82 lines)"]


def test_no_function_in_the_package_is_longer_than_80_lines():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 40
    assert long_functions(paths) == []


MAX_MODULE_LINES = 600


def test_no_module_in_the_package_is_longer_than_600_lines():
    long = [f"{p.relative_to(PACKAGE.parent)} ({n} lines)" for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert len(list(PACKAGE.rglob("*.py"))) > 40
    assert long == []
