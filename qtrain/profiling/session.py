"""Profiled epochs of a recipe: warm-up, then epochs under torch.profiler, then attribution.

The recipe's plugins are activated as ``qtrain run`` activates them, the
trainer's own ``train_epoch`` is timed, and a profiling patch (installed
last, so outermost) opens a ``qtrain::op::<primitive>`` scope around every
DGL primitive and dense product the model calls, whichever plugin then
serves it. Baselines (``--compare``) run the same recipe without plugins, in
float32 or under bf16 autocast, in the same process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from qtrain.errors import PluginError
from qtrain.ops import dispatch
from qtrain.plugin import PRIMITIVES as DGL_PRIMITIVES
from qtrain.plugin import Patcher, PluginContext, activated
from qtrain.profiling.attribution import EPOCH_SCOPE, OP_SCOPE, Row, attribute, rows, top_other
from qtrain.recipe import QuantSection, Recipe
from qtrain.train.loop import Trainer
from qtrain.train.prepare import prepared

BASELINES = ("fp32", "bf16")

# the profiling patch: DGL primitive -> table row
_DGL_ROWS = {
    "gspmm": "SpMM",
    "gspmm_hetero": "SpMM",
    "gsddmm": "SDDMM",
    "gsddmm_hetero": "SDDMM",
    "edge_softmax": "edge softmax",
    "edge_softmax_hetero": "edge softmax",
    "gather_mm": "GEMM",
    "segment_mm": "GEMM",
}


@dataclass
class Profile:
    """What one variant's profiled epochs measured."""

    label: str
    rows: list[Row]
    epoch_ms: float  # mean of the profiled epochs (the rows' denominator)
    epoch_ms_median: float
    epoch_ms_min: float  # the fastest and slowest profiled epoch (wall clock): the spread
    epoch_ms_max: float
    unprofiled_epoch_ms: float | None  # median warm-up epoch after the first, no profiler
    untraced_ms: float
    epochs: int
    kernels: dict[str, dict[str, int]]
    activation_bytes: int | None
    input_copy_bytes: int | None  # plugins' run-long copies of inputs / weights autograd saved
    plugin_reports: dict[str, Any] = field(default_factory=dict)
    other_ops: list[tuple[str, float]] = field(default_factory=list)  # (operator, ms / epoch)

    @property
    def traced_share(self) -> float:
        return sum(r.total_ms for r in self.rows) / self.epoch_ms if self.epoch_ms else 0.0

    def by_name(self) -> dict[str, float]:
        """Per-epoch ms per primitive, all backends together."""
        out: dict[str, float] = {}
        for r in self.rows:
            out[r.name] = out.get(r.name, 0.0) + r.total_ms
        return out


class _Span:
    """A torch.profiler FunctionEvent seen as an attribution span."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    @property
    def name(self) -> str:
        return str(self._event.name)

    @property
    def duration_us(self) -> float:
        return float(self._event.time_range.elapsed_us())

    @property
    def children(self) -> Sequence[_Span]:
        return [_Span(c) for c in self._event.cpu_children]


def _scoped(row: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    name = OP_SCOPE + row

    def make(inner: Callable[..., Any]) -> Callable[..., Any]:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(name):
                return inner(*args, **kwargs)

        profiled.__wrapped__ = inner  # type: ignore[attr-defined]
        return profiled

    return make


def _dense_scope(kind: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
    with torch.profiler.record_function(OP_SCOPE + "GEMM"):
        return func(*args, **kwargs)


@contextlib.contextmanager
def op_scopes() -> Iterator[Patcher]:
    """Open a ``qtrain::op::<primitive>`` scope around every DGL primitive and dense product."""
    patcher = Patcher("profile")
    try:
        for primitive, row in _DGL_ROWS.items():
            if primitive in DGL_PRIMITIVES:
                with contextlib.suppress(PluginError):  # not in this DGL build
                    patcher.wrap(primitive, _scoped(row))
        patcher.dense(_dense_scope)
        yield patcher
    finally:
        patcher.restore()


def baseline_recipe(recipe: Recipe) -> Recipe:
    """``recipe`` without plugins: the float32 (or bf16 autocast) DGL run."""
    return dataclasses.replace(recipe, quant=QuantSection())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_recipe(
    recipe: Recipe,
    *,
    label: str = "recipe",
    epochs: int = 3,
    warmup: int = 2,
    bf16: bool = False,
    trace: Path | None = None,
) -> Profile:
    """Train ``warmup`` epochs, then profile ``epochs`` more; attribute their time."""
    dispatch.reset()
    with prepared(recipe) as (dataset, graph, model, device):
        context = PluginContext(
            seed=recipe.train.seed,
            device=device,
            model=model,
            dataset=dataclasses.replace(dataset, graph=graph),
        )
        autocast = (
            torch.autocast(device_type=device.type, dtype=torch.bfloat16)
            if bf16
            else contextlib.nullcontext()
        )
        session = activated(recipe.quant, context)
        with session:
            trainer = Trainer(
                model, graph, metric=dataset.metric, config=recipe.train, device=device
            )
            warm: list[float] = []
            walls: list[float] = []
            with op_scopes(), autocast:
                for _ in range(warmup):
                    _sync(device)
                    start = time.perf_counter()
                    trainer.train_epoch()
                    _sync(device)
                    warm.append(time.perf_counter() - start)
                activities = [torch.profiler.ProfilerActivity.CPU]
                if device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                with torch.profiler.profile(activities=activities) as prof:
                    for _ in range(epochs):
                        _sync(device)
                        start = time.perf_counter()
                        with torch.profiler.record_function(EPOCH_SCOPE):
                            trainer.train_epoch()
                            _sync(device)
                        walls.append(time.perf_counter() - start)
            reports = session.report()
        if trace is not None:
            prof.export_chrome_trace(str(trace))
        spans = [_Span(e) for e in prof.events() if e.name == EPOCH_SCOPE and e.cpu_parent is None]
        attributed = attribute(spans)
        meter = trainer.meter.summary()
    return Profile(
        label=label,
        rows=rows(attributed),
        epoch_ms=sum(attributed.epoch_us) / max(attributed.epochs, 1) / 1e3,
        epoch_ms_median=statistics.median(walls) * 1e3,
        epoch_ms_min=min(walls) * 1e3,
        epoch_ms_max=max(walls) * 1e3,
        unprofiled_epoch_ms=statistics.median(warm[1:]) * 1e3 if len(warm) > 1 else None,
        untraced_ms=attributed.untraced_us / max(attributed.epochs, 1) / 1e3,
        epochs=attributed.epochs,
        kernels=dispatch.snapshot(),
        activation_bytes=meter.get("activation_bytes"),
        input_copy_bytes=meter.get("input_copy_bytes"),
        plugin_reports=reports,
        other_ops=top_other(attributed),
    )
