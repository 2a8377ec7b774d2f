"""The package's import rules (issue 15), read from the source with ``ast`` so they stay true:

- ``captioner/models/`` holds pure modules: they import neither the data layer, the config, the
  checkpoint format nor the application (``captioner.api``) or any command module;
- ``captioner/data/`` knows files and records, not models;
- ``captioner/train.py`` imports no command module (the decode loop it shares with ``evaluate`` lives
  in ``captioner/decode.py``, below both), and neither does any other library module.

Every import counts, function-level (lazy) ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "captioner"
COMMAND_MODULES = ("captioner.cli", "captioner.evaluate", "captioner.extract", "captioner.demo", "captioner.serve",
                   "captioner.score")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` gives a.b and a.b.c), relative imports resolved."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
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


def test_the_helper_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    module = PACKAGE / "models" / "_probe.py"  # never written: parsed from a string below
    source = "import os\nfrom . import scorers\ndef f():\n    from captioner.data.vocab import Vocab\n"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    names = imported_modules(module)
    assert {"os", "captioner.models.scorers", "captioner.data.vocab", "captioner.data.vocab.Vocab"} <= names
    assert _violations([module], ("captioner.data",)) == [
        "captioner/models/_probe.py imports captioner.data.vocab",
        "captioner/models/_probe.py imports captioner.data.vocab.Vocab"]


@pytest.mark.parametrize("path", sorted((PACKAGE / "models").glob("*.py")), ids=lambda p: p.name)
def test_models_know_neither_data_config_nor_checkpoints(path):
    forbidden = ("captioner.data", "captioner.config", "captioner.checkpoint", "captioner.api", *COMMAND_MODULES)
    assert _violations([path], forbidden) == []


@pytest.mark.parametrize("path", sorted((PACKAGE / "data").glob("*.py")), ids=lambda p: p.name)
def test_data_layer_imports_no_model(path):
    assert _violations([path], ("captioner.models", "captioner.api")) == []


def test_training_imports_no_command_module():
    assert _violations([PACKAGE / "train.py"], COMMAND_MODULES) == []


def test_no_library_module_imports_a_command():
    commands = {PACKAGE / (name.split(".")[1] + ".py") for name in COMMAND_MODULES}
    entry_points = commands | {PACKAGE / "__main__.py"}
    library = [p for p in sorted(PACKAGE.rglob("*.py")) if p not in entry_points]
    assert _violations(library, COMMAND_MODULES) == []
