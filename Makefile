# mlxd: `make test` and `make demo` work on a fresh machine (they set everything up first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UNAME := $(shell uname -s)

.PHONY: setup blas test test-fast demo bench clean

setup: $(STAMP) blas

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

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
	@echo "BLAS preload: $$($(PY) -m mlxd_fast_blas || true)"
endif

test: setup
	LD_PRELOAD="$$($(PY) -m mlxd_fast_blas)" $(PY) -m pytest

test-fast: setup
	LD_PRELOAD="$$($(PY) -m mlxd_fast_blas)" $(PY) -m pytest -m "not slow"

demo: setup
	bash scripts/demo.sh

# The reference comparison (mlxd with prompt lookup on / off, mlx_lm.server; plain and copy prompts; c=1,4,8)
# on the embedded model, written under docs/benchmark_results/reference/.
bench: setup
	bash scripts/bench_reference.sh

clean:
	rm -rf $(VENV) .pytest_cache
