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
	@echo "cmc is installed in $(VENV): run 'source $(VENV)/bin/activate' to put it on PATH (or call $(BIN)/cmc)"

test: $(STAMP)
	$(BIN)/pytest -q   # includes the CLI fuzz: 10,000 inputs, counts in the summary

test-gpu: $(STAMP)
	$(BIN)/pytest -q -m gpu tests/gpu

lint: $(STAMP)
	$(BIN)/ruff check cmc tests
	$(BIN)/mypy

golden: $(STAMP)
	CMC_REGEN_GOLDEN=1 $(BIN)/pytest -q tests/test_golden.py

clean:
	rm -rf $(OUT) build dist *.egg-info
