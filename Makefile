# Helper targets. `make demo` and `make test` each create the environment first.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= out
SAMPLES := $(wildcard samples/*.mask)

.PHONY: demo samples test test-gpu lint golden clean env

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: samples

samples: $(STAMP)
	$(BIN)/cmc check $(SAMPLES)
	$(BIN)/cmc compile $(SAMPLES) -o $(OUT) --jobs 2

test: $(STAMP)
	$(BIN)/pytest -q

test-gpu: $(STAMP)
	$(BIN)/pytest -q -m gpu tests/gpu

lint: $(STAMP)
	$(BIN)/ruff check cmc tests
	$(BIN)/mypy

golden: $(STAMP)
	CMC_REGEN_GOLDEN=1 $(BIN)/pytest -q tests/test_golden.py

clean:
	rm -rf $(OUT) build dist *.egg-info
