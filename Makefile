# Two commands do all the set-up: `make demo` and `make test`.
# The virtual environment is rebuilt only when pyproject.toml or constraints.txt changes; it gets the
# exact tested package set (constraints.txt) within pyproject.toml's ranges.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench tables gpu-check gpu-check-offline gpu-check-offline-dry wheels clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/captioner demo

# the files that hold tests marked `recorded` (tests/test_environment.py keeps the list complete): collecting only
# these keeps each rerun to seconds
RECORDED_TEST_FILES := tests/test_decode_syncs.py tests/test_search.py

# The suite on every core: -n auto, each test file on one worker (its module fixtures built once)
test: $(STAMP)
	$(VENV)/bin/ruff check captioner tests scripts examples
	# CAPTIONER_GPU_TEST_DEVICE=cpu: the tests marked `gpu` run too, on the CPU, in the same pool of workers (the GPU
	# check's dry run: the tests' own logic, nothing about CUDA; docs/performance.md); the script's own passing dry
	# run is tests/test_gpu_check_script.py's
	CAPTIONER_GPU_TEST_DEVICE=cpu $(VENV)/bin/python -m pytest -q -n auto --dist loadfile
	# numbers recorded on one CPU must hold on others: PyTorch picks its CPU kernels by instruction set, and these
	# two choose the others' on any x86 machine (the suite above ran this machine's own, avx2 or avx512)
	for cap in default avx2; do ATEN_CPU_CAPABILITY=$$cap $(VENV)/bin/python -m pytest -q -m recorded $(RECORDED_TEST_FILES) \
		|| exit 1; done

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile -m "not slow"

bench: $(STAMP)
	$(VENV)/bin/python scripts/bench.py

# Every generated table of README, docs/ and the model cards, written again from the records (captioner/reports/)
tables: $(STAMP)
	$(VENV)/bin/captioner recipe report --write

# The GPU check (docs/performance.md, "The GPU check"): scripts/gpu_check.sh, one shell command that needs no make, no
# venv and no network, and takes at most 6 minutes on one GPU; these targets call it. Every figure goes to
# $(GPU_CHECK_OUT) as its step ends, and the last lines are one verdict per step.
GPU_CHECK_OUT ?= runs/gpu-check
# On a machine with a GPU and this project's venv
gpu-check: $(STAMP)
	PYTHON=$(VENV)/bin/python GPU_CHECK_OUT=$(GPU_CHECK_OUT) bash scripts/gpu_check.sh

# On a GPU node without network: on a machine with network, `make wheels WHEELS_PYTHON=<the node's X.Y>` fills
# $(WHEELS_DIR)/ with what the check needs that the node's Python lacks (the script's NODE_WHEELS, and pycocoevalcap
# without its Java); copy the checkout with $(WHEELS_DIR)/ to the node; there `bash scripts/gpu_check.sh` (or this
# target) installs them with pip --target into a temporary folder on PYTHONPATH, beside the checkout, and runs the check
# with the node's own Python (NODE_PYTHON), torch and all.
NODE_PYTHON ?= python3
WHEELS_DIR ?= wheels
gpu-check-offline:
	PYTHON=$(NODE_PYTHON) WHEELS_DIR=$(WHEELS_DIR) GPU_CHECK_OUT=$(GPU_CHECK_OUT) bash scripts/gpu_check.sh

# Where no GPU is: the check's tests run on the CPU from the node's Python (their own logic and what they import,
# nothing about CUDA; no nvidia-smi, no benchmarks)
GPU_DRY_OUT ?= runs/gpu-check-dry
gpu-check-offline-dry:
	PYTHON=$(NODE_PYTHON) WHEELS_DIR=$(WHEELS_DIR) GPU_CHECK_OUT=$(GPU_DRY_OUT) bash scripts/gpu_check.sh --dry

# the script's list, read from it (one place)
script_list = $(shell sed -n 's/^$(1)="\(.*\)"$$/\1/p' scripts/gpu_check.sh)
NODE_WHEELS := $(call script_list,NODE_WHEELS)
WHEELS_PYTHON ?= 3.12
# manylinux2014 (glibc 2.17) preferred, for an old node; 2_28 where a package ships only that
WHEELS_PLATFORMS ?= manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64
WHEELS_MAX_MIB := 24
WHEELS_DOWNLOAD = $(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) \
	$(addprefix --platform ,$(WHEELS_PLATFORMS)) -c constraints.txt

wheels:
	rm -rf $(WHEELS_DIR) && mkdir -p $(WHEELS_DIR)
	$(WHEELS_DOWNLOAD) --dest $(WHEELS_DIR) $(NODE_WHEELS)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(WHEELS_DOWNLOAD) --dest "$$tmp" pycocoevalcap && \
		$(PYTHON) scripts/slim_pycocoevalcap.py "$$tmp"/pycocoevalcap-*.whl $(WHEELS_DIR)
	echo $(WHEELS_PYTHON) > $(WHEELS_DIR)/PYTHON
	@ls -l $(WHEELS_DIR); total=$$(cat $(WHEELS_DIR)/* | wc -c); \
	echo "$(WHEELS_DIR)/: $$(awk -v b=$$total 'BEGIN { printf "%.1f", b / 1048576 }') MiB for Python $(WHEELS_PYTHON) (at most $(WHEELS_MAX_MIB) MiB)"; \
	test $$total -le $$(( $(WHEELS_MAX_MIB) * 1048576 )) || { echo "make wheels: $(WHEELS_DIR)/ is over $(WHEELS_MAX_MIB) MiB"; exit 1; }

clean-venv:
	rm -rf $(VENV)
