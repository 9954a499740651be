"""Fixtures shared by the tests: thread counts for the kernels, seeded runs on real data."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import signal
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

# Under pytest-xdist (``make test``) each worker gets its share of the cores: torch's and
# DGL's OpenMP pools read this when they load, so it is set before torch is imported. Two
# workers of two threads each on two cores would spend the second thread waiting.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))

import pytest
import torch
from filelock import FileLock

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_script(name: str) -> Iterator[ModuleType]:
    """``bench/<name>.py`` imported as its command line runs it (its siblings ``_record``,
    ``_timing``... importable), for a module-scoped fixture to ``yield from``."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


# The runs here train in this process, so they get huge pages for torch's CPU allocator,
# as the `qtrain` command sets up its own process (qtrain._malloc). Torch reads this at its
# first allocation, which has not happened yet. Not the command's kept freed memory: a test
# worker lives through thousands of tests, and its resident set would stay at the peak of
# the largest one for the rest of them (tests/test_malloc.py checks that setting itself).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


@pytest.fixture
def allocator_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that calls a benchmark's ``main()``, which sets up its process as the
    command does: glibc's settings stay as they are in this worker (see above)."""
    import qtrain._malloc

    monkeypatch.setattr(qtrain._malloc, "keep_freed_memory", lambda: False)


def require_ext() -> ModuleType:
    """qtrain._ext, the op library's module; a missing build fails the test (CI builds it)."""
    from qtrain.ops import backends

    assert backends.available("ext-cpu"), backends.error("ext-cpu")
    return backends.ext_cpu()


@contextmanager
def codec_hooks(codec: Any) -> Iterator[None]:
    """The exact plugin's saved-tensor hooks, reduced to ``codec`` (a CompressingCodec)."""

    def pack(t: torch.Tensor) -> Any:
        stored = codec.encode(t)
        return t if stored is None else (stored,)

    def unpack(held: Any) -> torch.Tensor:
        return codec.decode(held[0]) if isinstance(held, tuple) else held

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def varied_rows(rows: int, width: int, seed: int) -> torch.Tensor:
    """CPU rows of different scales and offsets, some constant, one all zero (the
    compression kernels' test input)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g)
    x = x * torch.rand(rows, 1, generator=g).mul(4).exp2() + torch.randn(rows, 1, generator=g)
    if rows > 3:
        x[1] = 0.0
        x[2] = -1.7
        x[3] = 2.5
    return x


def float_bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a float32 / bfloat16 tensor (so -0.0 != 0.0 and NaNs compare
    by payload: comparisons of them are really bitwise)."""
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


@pytest.fixture
def isas() -> Iterator[list[str]]:
    """Every ISA variant this CPU runs; the variant in use is restored afterwards."""
    ext = require_ext()
    before = ext.info()["isa"]
    yield list(ext.info()["isa_supported"])
    ext.set_isa(before)


@pytest.fixture
def threads() -> Iterator[None]:
    """Restore torch's thread count after a test changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------ accuracy runs on real data

ROOT = Path(__file__).resolve().parents[1]
PLANETOID_DATA = ROOT.parent / "shared" / "datasets"
SEEDS = (0, 1, 2)

needs_planetoid = pytest.mark.skipif(
    not (PLANETOID_DATA / "planetoid").is_dir(),
    reason=f"real Planetoid data not found at {PLANETOID_DATA / 'planetoid'}",
)


class ExampleRuns:
    """Runs an example recipe once per seed and remembers the summaries for the session.

    The accuracy tests compare variants against FP32 with the same seeds; the
    FP32 runs are shared between them instead of being repeated per file. The
    summaries are kept as JSON in ``shared``, a folder every pytest-xdist worker of
    the session sees: a run one worker made is read by the others, and a worker
    that needs a run another is making waits for it (a lock per run).
    """

    def __init__(self, out_dir: Path, shared: Path, data_dir: Path) -> None:
        self.out_dir = out_dir
        self.shared = shared
        self.data_dir = data_dir  # $QTRAIN_DATA_DIR while a run loads its dataset
        self._done: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}

    def summaries(self, example: str, overrides: list[str]) -> list[dict[str, Any]]:
        key = (example, tuple(overrides))
        if key not in self._done:
            self._done[key] = [self._summary(example, overrides, seed) for seed in SEEDS]
        return self._done[key]

    def _summary(self, example: str, overrides: list[str], seed: int) -> dict[str, Any]:
        """The run's summary as JSON holds it (the same types whichever worker ran it)."""
        from qtrain.recipe import load_recipe
        from qtrain.runner import execute
        from qtrain.train.progress import Reporter
        from qtrain.train.rundir import to_json, write_atomic

        digest = hashlib.sha256(json.dumps([example, overrides, seed]).encode()).hexdigest()
        path = self.shared / f"{example}-{digest[:16]}.json"
        with FileLock(f"{path}.lock"):
            if not path.exists():
                recipe = load_recipe(
                    ROOT / "examples" / f"{example}.toml",
                    overrides=[*overrides, f"train.seed={seed}", f"output.dir={self.out_dir}"],
                )
                with pytest.MonkeyPatch.context() as patch:
                    patch.setenv("QTRAIN_DATA_DIR", str(self.data_dir))
                    summary = execute(recipe, reporter=Reporter())
                assert summary["status"] == "completed", summary.get("error")
                write_atomic(path, to_json(summary))  # as the run's summary.json is written
            return json.loads(path.read_text())

    def accuracies(self, example: str, overrides: list[str]) -> list[float]:
        """Test accuracy in percent at the best validation epoch, one per seed."""
        return [100.0 * s["test_acc"] for s in self.summaries(example, overrides)]

    def mean(self, example: str, overrides: list[str]) -> float:
        return statistics.mean(self.accuracies(example, overrides))


def _session_summaries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of run summaries every pytest-xdist worker of the session sees (their
    temporary folders share a parent)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = tmp_path_factory.getbasetemp().parent / "example-summaries"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("example-summaries")


@pytest.fixture(scope="session")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> ExampleRuns:
    """Seeded runs of the example recipes on the real Planetoid data, shared by the session."""
    shared = _session_summaries(tmp_path_factory)
    return ExampleRuns(tmp_path_factory.mktemp("example-runs"), shared, PLANETOID_DATA)


@pytest.fixture(scope="session")
def synthetic_runs(tmp_path_factory: pytest.TempPathFactory) -> ExampleRuns:
    """Seeded runs of the example recipes on generated data (synthetic-arxiv), shared by the
    session; the data is qtrain's own ($QTRAIN_DATA_DIR or ~/.cache/qtrain/datasets),
    generated there by the first run that needs it, as ``qtrain run`` does."""
    from qtrain.data.base import data_dir

    shared = _session_summaries(tmp_path_factory)
    return ExampleRuns(tmp_path_factory.mktemp("synthetic-runs"), shared, data_dir())


@pytest.fixture
def tango_recipe(tmp_path: Path) -> Callable[..., Path]:
    """Write a 3-epoch tango recipe (``model``, default GCN, on synthetic-small, full-graph
    or ``mode = "minibatch"``) whose ``[quant.tango]`` table holds the given lines; returns
    its path (each call rewrites the same file)."""

    def write(tango_lines: str = "", model: str = "gcn", mode: str = "full") -> Path:
        fanouts = "fanouts = [5, 5]\nbatch_size = 512" if mode == "minibatch" else ""
        path = tmp_path / "r.toml"
        path.write_text(
            f"""
[model]
name = "{model}"
hidden = 16
[dataset]
name = "synthetic-small"
[train]
epochs = 3
mode = "{mode}"
{fanouts}
[output]
dir = "{tmp_path / "runs"}"
[quant]
plugin = ["tango"]
[quant.tango]
{tango_lines}
"""
        )
        return path

    return write


@pytest.fixture
def stop_handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No stop signal requested (qtrain.signals), and the handlers a stop changes put back
    afterwards."""
    from qtrain import signals

    monkeypatch.setattr(signals, "_requested", [])
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])
