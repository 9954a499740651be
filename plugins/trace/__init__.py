"""The ``trace`` plugin: count every DGL primitive and dense product a model runs.

It changes no numbers. It shows which primitives an unmodified DGL model
reaches (and so which ones the quantizing plugins will replace), and it is
the proof, in tests, that patching reaches every call and restores DGL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qtrain.config import option
from qtrain.plugin import PRIMITIVES, Patcher, Plugin, register_plugin


@dataclass(frozen=True)
class TraceConfig:
    log: bool = option(
        False, "also keep every call, in order, with operand shapes (memory grows per call)"
    )
    dense: bool = option(True, "count dense products (matmul, linear, mm, bmm, addmm)")


def _shape(x: Any) -> tuple[int, ...] | None:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else None


def _detail(primitive: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The variant of a call: op and reducer for SpMM, op and targets for SDDMM."""
    if primitive == "gspmm":
        return f"{args[1]}/{args[2]}"
    if primitive == "gsddmm":
        lhs = kwargs.get("lhs_target", args[4] if len(args) > 4 else "u")
        rhs = kwargs.get("rhs_target", args[5] if len(args) > 5 else "v")
        return f"{args[1]}({lhs},{rhs})"
    if primitive in ("gspmm_hetero", "gsddmm_hetero"):
        return str(args[1])
    if primitive == "edge_softmax":
        return str(kwargs.get("norm_by", args[3] if len(args) > 3 else "dst"))
    return primitive


@register_plugin
class TracePlugin(Plugin):
    """Counts calls per primitive and variant; optionally logs each call."""

    name = "trace"
    summary = "counts the DGL primitives and dense products a model runs; changes no numbers"
    Config = TraceConfig

    def __init__(self, config: TraceConfig, context: Any) -> None:
        super().__init__(config, context)
        self.calls: Counter[tuple[str, str]] = Counter()
        self.log: list[tuple[str, str, list[tuple[int, ...] | None]]] = []

    def _record(self, primitive: str, detail: str, operands: tuple[Any, ...]) -> None:
        self.calls[(primitive, detail)] += 1
        if self.config.log:
            self.log.append(
                (primitive, detail, [_shape(a) for a in operands if _shape(a) is not None])
            )

    def _counting(self, primitive: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(inner: Callable[..., Any]) -> Callable[..., Any]:
            def traced(*args: Any, **kwargs: Any) -> Any:
                self._record(primitive, _detail(primitive, args, kwargs), args)
                return inner(*args, **kwargs)

            traced.__wrapped__ = inner  # type: ignore[attr-defined]
            traced.__qualname__ = f"trace.{primitive}"
            return traced

        return make

    def activate(self, patcher: Patcher) -> None:
        for primitive in PRIMITIVES:
            patcher.wrap(primitive, self._counting(primitive))
        if self.config.dense:

            def on_dense(kind: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
                self._record("dense", kind, args)
                return func(*args, **kwargs)

            patcher.dense(on_dense)

    def counts(self) -> dict[str, dict[str, int]]:
        """Calls as {primitive: {variant: count}}."""
        out: dict[str, dict[str, int]] = {}
        for (primitive, detail), n in sorted(self.calls.items()):
            out.setdefault(primitive, {})[detail] = n
        return out

    def report(self) -> dict[str, Any]:
        return {"calls": self.counts()}
