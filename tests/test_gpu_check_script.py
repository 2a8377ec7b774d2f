"""scripts/gpu_check.sh, the GPU check's one command, where no GPU is: an interpreter that lacks what the node's must
hold is refused naming the packages; a step that outlives its limit is reported as timed out, with what it wrote
kept and one verdict per step at the end; with the project's venv its dry run passes, every verdict ok. (`make test`
runs the `gpu` tests themselves on the CPU in its main pytest run.)"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _check(tmp_path: Path, python: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": python, "GPU_CHECK_OUT": str(out), **env})


def test_an_interpreter_without_the_nodes_packages_is_refused_naming_them(tmp_path):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a venv of the base Python: none of NODE_HAS
    proc = _check(tmp_path, str(bare / "bin" / "python"), "--dry")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = (tmp_path / "out" / "verdict.txt").read_text().splitlines()
    assert len(verdicts) == 1 and verdicts[0].startswith("gpu-check verdict: python: FAILED")
    assert "lacks: torch torchvision timm numpy" in verdicts[0] and str(bare) in verdicts[0]
    assert proc.stdout.rstrip().endswith(verdicts[0])  # the verdicts close the output


def test_a_step_past_its_limit_is_reported_as_timed_out_and_its_output_kept(tmp_path):
    proc = _check(tmp_path, sys.executable, "--dry", GPU_CHECK_LIMIT_TESTS="2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = (tmp_path / "out" / "verdict.txt").read_text().splitlines()
    assert [v.split(":")[1].strip() for v in verdicts] == ["python", "wheels", "tests"]
    assert verdicts[0].endswith(f"(Python {sys.version_info[0]}.{sys.version_info[1]} at {sys.prefix})")
    assert "wheels: ok (nothing installed)" in verdicts[1]  # this venv holds every wheel the check needs
    assert "tests: TIMED OUT (stopped after 2 s" in verdicts[2]
    assert (tmp_path / "out" / "tests.txt").is_file() and (tmp_path / "out" / "tests.status").read_text().strip()
    assert proc.stdout.rstrip().splitlines()[-3:] == verdicts


def test_a_dry_run_with_the_projects_venv_passes_every_step(tmp_path):
    """The success path, end to end: the interpreter and its packages accepted, nothing to install, the `gpu` tests
    collected by marker from the listed file and run on the CPU (narrowed to one small file: make test's main run
    covers the rest)."""
    proc = _check(tmp_path, sys.executable, "--dry", GPU_CHECK_TEST_FILES="tests/test_datasets.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = (tmp_path / "out" / "verdict.txt").read_text().splitlines()
    assert [v.split(":")[1].strip() for v in verdicts] == ["python", "wheels", "tests"]
    assert all(v.split(":")[2].strip().startswith("ok") for v in verdicts), verdicts
    assert "1 passed" in (tmp_path / "out" / "tests.txt").read_text()  # the one `gpu` test there, not skipped
    assert proc.stdout.rstrip().splitlines()[-3:] == verdicts


@pytest.mark.parametrize("args", [["--gpu"], ["--dry", "extra"]])
def test_unknown_arguments_are_refused(tmp_path, args):
    proc = _check(tmp_path, sys.executable, *args)
    assert proc.returncode == 2 and "usage: bash scripts/gpu_check.sh [--dry]" in proc.stderr
