# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and alone: this exact version is a local CPU wheel; any other request pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tuneline.demo

lint: $(STAMP)
	$(BIN)/ruff check tuneline tasks flows tests benchmarks
	$(BIN)/lint-imports

test: $(STAMP) lint
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) .tuneline demo_output mlflow.db mlruns
