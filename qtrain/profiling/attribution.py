"""Who gets each microsecond of an epoch: torch.profiler spans to per-primitive rows.

An epoch is a tree of spans (``record_function`` scopes and the operators and
autograd nodes torch.profiler records on the training thread). A span is a
*primitive* span when :func:`classify` names its primitive:

* the kernel scopes every qtrain op opens (``qtrain::<kernel>[<backend>]``, see
  ``qtrain.ops.dispatch.call``): quantize, dequantize, pack, unpack,
  projection, and the quantized GEMM / SpMM / SDDMM kernels;
* the scopes the profiling patch opens around DGL's primitives and dense
  products (``qtrain::op::<primitive>``), whichever plugin serves them;
* autograd's backward nodes (``autograd::engine::evaluate_function: MmBackward0``,
  ``GSpMMBackward``, tango's ``QuantLinearBackward`` ...), torch's dense
  operators (``aten::mm`` ...), the optimizer's scopes, and communication.

Every microsecond goes to the innermost primitive span around it (its *self*
time, the span minus its children, is charged to the call it belongs to). A
primitive span inside a call of the same primitive (``aten::mm`` inside a GEMM
scope, the ``spmm`` kernel inside an SpMM scope) is part of that call and
decides its backend; inside another primitive it is a call of its own, and a
quantize / dequantize / projection call inside a quantized call counts toward
that call's quantization share. Spans outside any primitive are ``other``
calls; the epoch scope's own self time (Python between operators) is
``untraced``. So the rows plus ``untraced`` are the epoch, by construction,
and ``untraced`` says how much the table cannot explain.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# rows of the table, in this order (those with no calls are left out)
PRIMITIVES = (
    "GEMM",
    "SpMM",
    "SDDMM",
    "edge softmax",
    "quantize",
    "dequantize",
    "pack",
    "unpack",
    "projection",
    "communication",
    "optimizer",
    "other",
)
QUANTIZING = frozenset({"quantize", "dequantize", "projection"})
# backends that mean "a quantized kernel served this call"
QUANTIZED_BACKENDS = frozenset({"ext-cpu", "ext-cuda", "reference"})

# qtrain kernel (``qtrain.ops.dispatch`` primitive) -> table row
KERNELS = {
    "gemm": "GEMM",
    "block_gemm": "GEMM",  # a weight gradient with one scale per block of nodes
    "segment_matmul": "GEMM",
    "int8_segment_gemm": "GEMM",
    "spmm": "SpMM",
    "sddmm": "SDDMM",
    "quantize": "quantize",
    "quantize_rows": "quantize",
    "quantize_cols": "quantize",
    "hadamard_rotate": "quantize",  # the rotation before a rotated GEMM's quantization
    "pack_int4": "quantize",  # 4-bit values packed two per byte, part of quantizing them
    "unpack_int4": "quantize",
    "compress": "quantize",
    "dequantize": "dequantize",
    "decompress": "dequantize",
    "pack": "pack",
    "unpack": "unpack",
    "rademacher": "projection",
    "project+compress": "projection",
    "decompress+unproject": "projection",
    "communication": "communication",
}
# what serves a primitive when no qtrain kernel scope inside its call says otherwise
DEFAULT_BACKEND = {"SpMM": "dgl", "SDDMM": "dgl", "edge softmax": "dgl"}

OP_SCOPE = "qtrain::op::"  # the profiling patch's scopes: qtrain::op::<primitive>
EPOCH_SCOPE = "qtrain::epoch"
_KERNEL = re.compile(r"^qtrain::([a-z0-9+_]+)\[([a-z0-9-]+)\]$")
_BACKWARD = "autograd::engine::evaluate_function: "
BACKWARD_NODES = {
    "MmBackward0": "GEMM",
    "AddmmBackward0": "GEMM",
    "BmmBackward0": "GEMM",
    "LinearBackward0": "GEMM",
    "QuantLinearBackward": "GEMM",
    "RowQuantLinearBackward": "GEMM",
    "GatherMMBackward": "GEMM",
    "SegmentMMBackward": "GEMM",
    "GSpMMBackward": "SpMM",
    "GSpMM_heteroBackward": "SpMM",
    "QuantSpMMBackward": "SpMM",
    "QuantEdgeToNodeBackward": "SpMM",
    "GSDDMMBackward": "SDDMM",
    "GSDDMM_heteroBackward": "SDDMM",
    "QuantSDDMMBackward": "SDDMM",
    "EdgeSoftmaxBackward": "edge softmax",
    "EdgeSoftmax_heteroBackward": "edge softmax",
}
DENSE_OPERATORS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
)


class Span(Protocol):
    """What attribution needs of a profiler event."""

    @property
    def name(self) -> str: ...

    @property
    def duration_us(self) -> float: ...

    @property
    def children(self) -> Sequence[Span]: ...


def classify(name: str) -> tuple[str, str | None] | None:
    """``(primitive, backend or None)`` of a span name, or None if it is not a primitive's."""
    kernel = _KERNEL.match(name)
    if kernel and kernel.group(1) in KERNELS:
        return KERNELS[kernel.group(1)], kernel.group(2)
    if name.startswith(OP_SCOPE):
        primitive = name[len(OP_SCOPE) :]
        return (primitive, None) if primitive in PRIMITIVES else None
    if name.startswith(_BACKWARD):
        primitive = BACKWARD_NODES.get(name[len(_BACKWARD) :])
        return (primitive, None) if primitive else None
    if name in DENSE_OPERATORS:
        return "GEMM", None
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer", None
    return None


@dataclass(eq=False)
class Call:
    """One call of a primitive: its exclusive time and what it spent quantizing."""

    primitive: str
    backend: str | None
    self_us: float = 0.0
    quantizing_us: float = 0.0  # quantize / dequantize / projection calls directly inside it
    parent: Call | None = field(default=None, repr=False)
    label: str = ""  # the span that opened the call (names the operator of an "other" call)

    def resolved_backend(self) -> str:
        return self.backend or DEFAULT_BACKEND.get(self.primitive, "torch")


@dataclass
class Epochs:
    """The calls of the profiled epochs and their untraced time."""

    epochs: int = 0
    epoch_us: list[float] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    untraced_us: float = 0.0


def _self_us(span: Span) -> float:
    return max(0.0, span.duration_us - sum(c.duration_us for c in span.children))


def attribute(epochs: Iterable[Span]) -> Epochs:
    """Charge every span inside each epoch span to a call (see the module docstring)."""
    result = Epochs()

    def visit(span: Span, outer: Call | None) -> None:
        kind = classify(span.name)
        if kind is not None and outer is not None and outer.primitive == kind[0]:
            own = outer  # part of the enclosing call; a kernel scope names its backend
            if kind[1] is not None and own.backend is None:
                own.backend = kind[1]
        elif kind is not None or outer is None:
            primitive, backend = kind if kind is not None else ("other", None)
            own = Call(primitive, backend, parent=outer, label=span.name)
            result.calls.append(own)
        else:
            own = outer
        own.self_us += _self_us(span)
        for child in span.children:
            visit(child, own)

    for epoch in epochs:
        result.epochs += 1
        result.epoch_us.append(epoch.duration_us)
        result.untraced_us += _self_us(epoch)
        for child in epoch.children:
            visit(child, None)
    for call in result.calls:
        if call.parent is not None and call.primitive in QUANTIZING:
            call.parent.quantizing_us += call.self_us
    return result


@dataclass(frozen=True)
class Row:
    """One line of the table, per epoch."""

    name: str
    backend: str
    calls: float
    total_ms: float
    median_ms: float
    share: float
    quantizing_share: float | None  # of this row's time plus its nested quantization

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "backend": self.backend,
            "calls": self.calls,
            "total_ms": self.total_ms,
            "median_ms": self.median_ms,
            "share": self.share,
            "quantizing_share": self.quantizing_share,
        }


def rows(profiled: Epochs) -> list[Row]:
    """Per-(primitive, backend) rows, per epoch, in :data:`PRIMITIVES` order."""
    n = max(profiled.epochs, 1)
    epoch_ms = sum(profiled.epoch_us) / n / 1e3
    groups: dict[tuple[str, str], list[Call]] = {}
    for c in profiled.calls:
        groups.setdefault((c.primitive, c.resolved_backend()), []).append(c)
    out = []
    for (name, backend), calls in sorted(
        groups.items(), key=lambda kv: (PRIMITIVES.index(kv[0][0]), kv[0][1])
    ):
        total_ms = sum(c.self_us for c in calls) / n / 1e3
        quantizing = sum(c.quantizing_us for c in calls) / n / 1e3
        shown = backend in QUANTIZED_BACKENDS and quantizing > 0
        out.append(
            Row(
                name=name,
                backend=backend,
                calls=len(calls) / n,
                total_ms=total_ms,
                median_ms=statistics.median(c.self_us for c in calls) / 1e3,
                share=total_ms / epoch_ms if epoch_ms else 0.0,
                quantizing_share=quantizing / (total_ms + quantizing) if shown else None,
            )
        )
    return out


def top_other(profiled: Epochs, limit: int = 6) -> list[tuple[str, float]]:
    """The operators that make up most of ``other``: ``(name, ms per epoch)``, largest first."""
    n = max(profiled.epochs, 1)
    totals: dict[str, float] = {}
    for c in profiled.calls:
        if c.primitive == "other":
            totals[c.label] = totals.get(c.label, 0.0) + c.self_us / n / 1e3
    return sorted(totals.items(), key=lambda kv: -kv[1])[:limit]
