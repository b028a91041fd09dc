# `make test` is the whole test suite on a fresh machine: it installs what the tests need, then lints,
# type-checks and runs pytest. `.ci/run` runs exactly this.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: test install-test install-bench lint typecheck pytest screenshots bench

test: install-test lint typecheck pytest

install-test:
	PY=$(PY) VENV=$(VENV) bash scripts/install-test-deps

install-bench:
	PY=$(PY) VENV=$(VENV) bash scripts/install-bench-deps

lint:
	$(BIN)/ruff check dltop tests benchmarks scripts

typecheck:
	$(BIN)/mypy

pytest:
	$(BIN)/pytest -q -p no:cacheprovider

screenshots:
	$(BIN)/python scripts/make_screenshots.py

bench: install-bench
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/residency.py
	$(BIN)/python benchmarks/export.py
