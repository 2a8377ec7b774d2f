# Two commands do all the set-up: `make demo` and `make test`.
# The virtual environment is rebuilt only when pyproject.toml or constraints.txt changes; it gets the
# exact tested package set (constraints.txt) within pyproject.toml's ranges.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench gpu-check clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/captioner demo

# The suite on every core: -n auto, each test file on one worker (its module fixtures built once)
test: $(STAMP)
	$(VENV)/bin/ruff check captioner tests scripts examples
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile
	# the GPU tests' dry run: their own logic on the CPU (it says nothing about CUDA; docs/performance.md)
	CAPTIONER_GPU_TEST_DEVICE=cpu $(VENV)/bin/python -m pytest -q -n auto --dist loadfile -m gpu $(GPU_TEST_FILES)

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile -m "not slow"

bench: $(STAMP)
	$(VENV)/bin/python scripts/bench.py

# On a machine with a GPU (docs/performance.md, "The GPU check"): the `gpu` tests, then the benchmarks on CUDA;
# about 10 minutes on one GPU. Every figure also goes to $(GPU_CHECK_OUT).
GPU_CHECK_OUT ?= runs/gpu-check
# the files that hold `gpu` tests: collecting only these keeps modules that need fastapi, nbclient or pycocoevalcap
# at import out of a node that lacks them
GPU_TEST_FILES := tests/test_gpu.py tests/test_datasets.py tests/test_decode_syncs.py
gpu-check: $(STAMP)
	mkdir -p $(GPU_CHECK_OUT)
	# the driver first: a driver too old for the wheel's CUDA shows here, before torch can only say "no CUDA"
	nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv | tee $(GPU_CHECK_OUT)/gpu.txt
	nvidia-smi | grep -o "CUDA Version: [0-9.]*" | tee -a $(GPU_CHECK_OUT)/gpu.txt || true
	$(VENV)/bin/python -c "import torch; print('torch', torch.__version__, 'built for CUDA', torch.version.cuda)" | tee -a $(GPU_CHECK_OUT)/gpu.txt
	$(VENV)/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check: torch sees no CUDA device (the driver above may be older than the CUDA torch was built for)')"
	$(VENV)/bin/python -m pytest -q -m gpu --timeout 240 $(GPU_TEST_FILES) 2>&1 | tee $(GPU_CHECK_OUT)/tests.txt; test $${PIPESTATUS[0]} -eq 0
	$(VENV)/bin/python scripts/bench.py --device cuda --only train,decode --configs R7,F8K --json > $(GPU_CHECK_OUT)/bench.json
	$(VENV)/bin/python scripts/bench_scale.py --quick --device cuda --json > $(GPU_CHECK_OUT)/bench_scale.json

clean-venv:
	rm -rf $(VENV)
