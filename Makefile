# `make test` is the whole test suite on a fresh machine: it installs what the tests need, then lints,
# type-checks and runs pytest. `.ci/run` runs exactly this.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Tests in parallel, one worker per CPU (at most 4): many wait on a subprocess, a server or a terminal. A file's
# tests stay together, in order, in one worker (a file's fuzz-count test reads what its fuzz test tried; a
# module's Prometheus or fresh clone is made once).
XDIST ?= -n auto --maxprocesses=4 --dist loadfile

.PHONY: test check install-test install-bench lint typecheck pytest screenshots bench native

test: install-test lint typecheck pytest

# The inner loop: lint, types and the tests not marked slow (tests/conftest.py, SLOW_FILES), on what is installed.
check: lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider -m "not slow" $(XDIST)

install-test:
	PY=$(PY) VENV=$(VENV) bash scripts/install-test-deps

# The optional C modules (dltop/native/*.c) in place; the install builds them too (hatch_build.py).
native:
	$(BIN)/python scripts/build_native.py

install-bench:
	PY=$(PY) VENV=$(VENV) bash scripts/install-bench-deps

lint:
	$(BIN)/ruff check dltop tests benchmarks scripts

typecheck:
	$(BIN)/mypy

pytest:
	$(BIN)/pytest -q -p no:cacheprovider $(XDIST)

screenshots:
	$(BIN)/python scripts/make_screenshots.py

bench: install-bench
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/residency.py
	$(BIN)/python benchmarks/export.py
	$(BIN)/python benchmarks/caches.py
