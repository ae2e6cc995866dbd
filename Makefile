# Set-up is part of every target: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch is pinned for set-up here; pyproject.toml keeps a normal range.
TORCH_PIN ?= torch==2.13.0

.PHONY: run test lint typecheck imports bench docs docs-serve clean setup

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml examples/acme_npu/pyproject.toml examples/tiny_engine/pyproject.toml
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(BIN)/pip install --quiet -e ".[test,docs,triton,engine]"
	# The suite must pass with third-party plugins installed: install the example vendor plugin.
	$(BIN)/pip install --quiet --no-deps --no-build-isolation ./examples/acme_npu
	# The example engine (its tests compare it with transformers).
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e ./examples/tiny_engine
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/hwplug info
	$(BIN)/hwplug resolve
	$(BIN)/hwplug matrix --installed

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

# The layering contracts of pyproject.toml ([tool.importlinter]).
imports: $(STAMP)
	$(BIN)/lint-imports

# pytest exits 5 when it collects no test: that is not a failure of the suite.
test: lint typecheck imports
	$(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) site build dist .pytest_cache .mypy_cache .ruff_cache
