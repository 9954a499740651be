# Set-up is idempotent: each step reruns only when its inputs change.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.stamp-deps
BUILT  := $(VENV)/.stamp-build
EXT_SOURCES := $(wildcard ext/*.cpp ext/*/*.cpp ext/*/*.h ext/*/*.cu ext/*/*.cuh) setup.py pyproject.toml

.PHONY: setup build run test test-fast lint doctor bench bench-quick cuda-check cuda-build torch-range gpu-check gpu-wheels clean

setup: $(BUILT)

build: $(BUILT)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pinned dependencies (torch 2.13.0 CPU is the local wheel pip finds on these machines)
$(DEPS): requirements.lock | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements.lock
	@touch $@

# the package (editable) and its op library qtrain._ext, against the torch installed above
# then, in a child process, an op that must raise does raise (a build that crashes on a
# C++ exception fails here, with the compilers named, instead of reaching a user)
$(BUILT): $(DEPS) $(EXT_SOURCES)
	$(BIN)/python -m pip install --quiet --no-build-isolation --no-deps -e .
	$(BIN)/python -m qtrain.ops
	@touch $@

run: $(BUILT)
	$(BIN)/qtrain compare qtrain.toml --seeds 2

# pytest-xdist: a worker per logical CPU, each with its share of the cores (tests/conftest.py),
# idle workers taking queued tests from busy ones; PYTEST_WORKERS=0 runs in this process
PYTEST_WORKERS ?= logical
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal

test: $(BUILT)
	$(PYTEST)

test-fast: $(BUILT)
	$(PYTEST) -m "not slow and not hours"

lint: $(DEPS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

doctor: $(BUILT)
	$(BIN)/qtrain doctor

# every bench script in a fresh process; bench/results/<host>-<date>.json and .md, and the
# README's performance tables rewritten from them (refused with uncommitted changes)
bench: $(BUILT)
	$(BIN)/python bench/suite.py --readme README.md

# the same cases, one size each and fewer repetitions (about 5 minutes on 2 cores); results only
bench-quick: $(BUILT)
	$(BIN)/python bench/suite.py --quick

# every CUDA source compiled on its own by nvcc for sm_80 and sm_90 (quick feedback; no GPU)
cuda-check: $(DEPS)
	$(BIN)/python ext/cuda_check.py

# The whole op library built with its CUDA kernels, imported, every op's CUDA kernel found and
# the error paths proven, without a GPU: a side environment with PyPI's CUDA build of the
# pinned torch (pip --isolated skips this machine's CPU wheel); the wheels are downloaded
# once into CUDA_WHEELS and reused.
CUDA_TORCH  := $(shell sed -n 's/^torch==//p' requirements.lock)
CUDA_PKGS   := torch==$(CUDA_TORCH) $(shell grep -E '^(numpy|pybind11|setuptools|ninja)==' requirements.lock)
CUDA_WHEELS ?= $(HOME)/.cache/qtrain/cuda-wheels/torch-$(CUDA_TORCH)
CUDA_VENV   := .venv-cuda

$(CUDA_WHEELS)/.complete: requirements.lock
	mkdir -p $(CUDA_WHEELS)
	$(PYTHON) -m pip download --isolated --quiet --only-binary=:all: -d $(CUDA_WHEELS) $(CUDA_PKGS)
	@touch $@

$(CUDA_VENV)/.stamp-cuda: $(CUDA_WHEELS)/.complete
	rm -rf $(CUDA_VENV)
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install --isolated --quiet --no-index --find-links $(CUDA_WHEELS) $(CUDA_PKGS)
	@touch $@

cuda-build: $(CUDA_VENV)/.stamp-cuda
	$(CUDA_VENV)/bin/python ext/cuda_build.py

# the supported torch range (ext/torch_range.py): torch 2.4 builds and passes the op
# tests (tests/ops); the pinned and the newest torch on PyPI build and pass the fast suite. About
# 10 GB of environments under ~/.cache/qtrain/torch-range, made once; not run by CI.
torch-range:
	$(PYTHON) ext/torch_range.py

# Wheels for the lent GPU machine (Python 3.12, no network, no DGL): DGL's CPU wheel, tomli-w
# (qtrain writes the resolved recipe with it; the image lacks it) and, from what DGL declares,
# torchdata (never imported: qtrain stubs dgl.graphbolt) and the small
# packages that `import dgl` imports, as a fallback (the GPU image has them), at
# requirements.lock's versions, into .gpu/wheels (about 11 MB). A session carries .gpu to the
# GPU machine (the device tool's run with carry [".gpu"]); there bench/gpu.py installs them
# before its end-to-end stage when `import dgl` fails. pandas, scipy, numpy and requests come
# from the image; pyyaml and pydantic are not needed (dgl imports them only in CSVDataset).
GPU_WHEELS  := .gpu/wheels
GPU_PYTHON  := 3.12
GPU_PKGS    := $(shell grep -iE '^(dgl|torchdata|packaging|networkx|psutil|tqdm|tomli-w)==' requirements.lock)

$(GPU_WHEELS)/.complete: requirements.lock Makefile
	rm -rf $(GPU_WHEELS)
	mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download --isolated --quiet --no-deps --only-binary=:all: \
		--python-version $(GPU_PYTHON) --implementation cp --platform manylinux2014_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 -d $(GPU_WHEELS) $(GPU_PKGS)
	@du -sh $(GPU_WHEELS)
	@touch $@

gpu-wheels: $(GPU_WHEELS)/.complete

# on a GPU machine (python3 there has CUDA torch): a clean in-place build whose error path
# is proven (with the system compiler if the default one gives a build that crashes on a
# raise), then the op tests on the GPU and the GPU benchmarks, one report under bench/results/
gpu-check:
	python3 bench/gpu.py

clean:
	rm -rf build qtrain/*.so $(BUILT) $(CUDA_VENV)
