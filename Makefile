# Set-up is idempotent: each step reruns only when its inputs change.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.stamp-deps
BUILT  := $(VENV)/.stamp-build
EXT_SOURCES := $(wildcard ext/*.cpp ext/*.h ext/*.cu ext/*.cuh) setup.py pyproject.toml

.PHONY: setup build run test test-fast lint doctor bench bench-quick cuda-check clean

setup: $(BUILT)

build: $(BUILT)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pinned dependencies (torch 2.13.0 CPU is the local wheel pip finds on these machines)
$(DEPS): requirements.lock | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements.lock
	@touch $@

# the package (editable) and its compiled extension, against the torch installed above
$(BUILT): $(DEPS) $(EXT_SOURCES)
	$(BIN)/python -m pip install --quiet --no-build-isolation --no-deps -e .
	@touch $@

run: $(BUILT)
	$(BIN)/qtrain run qtrain.toml

test: $(BUILT)
	$(BIN)/python -m pytest

test-fast: $(BUILT)
	$(BIN)/python -m pytest -m "not slow"

lint: $(DEPS)
	$(BIN)/ruff check qtrain plugins tests bench setup.py ext/cuda_check.py
	$(BIN)/ruff format --check qtrain plugins tests bench setup.py ext/cuda_check.py

doctor: $(BUILT)
	$(BIN)/qtrain doctor

# every bench script in a fresh process; bench/results/<host>-<date>.json and .md
bench: $(BUILT)
	$(BIN)/python bench/suite.py

# the same cases, one size each and fewer repetitions (under 5 minutes on 2 cores)
bench-quick: $(BUILT)
	$(BIN)/python bench/suite.py --quick

# every CUDA source compiled by nvcc for sm_80 and sm_90, no GPU or CUDA torch needed
cuda-check: $(DEPS)
	$(BIN)/python ext/cuda_check.py

clean:
	rm -rf build qtrain/*.so $(BUILT)
