# Two entry points for a fresh machine: `make run` (install + the default job) and
# `make test` (install + the test suite). Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# CPU torch first, so that nothing pulls a multi-GB CUDA build; GPU machines: make TORCH=torch==2.14.0 EXTRAS=dev,gpu
TORCH ?= torch==2.13.0
EXTRAS ?= dev
CORES ?= all
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gmc theory --out results/theory

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check gmc tests

clean:
	rm -rf results .snakemake
