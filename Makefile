# Two commands do all the set-up: `make demo` and `make test`.
# The virtual environment is rebuilt only when pyproject.toml or constraints.txt changes; it gets the
# exact tested package set (constraints.txt) within pyproject.toml's ranges.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/captioner demo

test: $(STAMP)
	$(VENV)/bin/ruff check captioner tests scripts examples
	$(VENV)/bin/python -m pytest -q

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(VENV)/bin/python scripts/bench.py

clean-venv:
	rm -rf $(VENV)
