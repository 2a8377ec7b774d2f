"""environment.yml (conda) describes the same environment as pyproject.toml."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].strip().lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {_name(d): d.replace(" ", "") for d in project["dependencies"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_specs = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    env_deps = {_name(s): s.replace(" ", "") for s in pip_specs if not s.startswith("-")}
    assert env_deps == deps
    assert "python=3.11" in env["dependencies"]
    assert any(s.startswith("-e .") for s in pip_specs), "the package itself is installed with pip"


def test_torch_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.14.1" in project["dependencies"]
    assert "torchvision==0.29.1" in project["dependencies"]
