"""Inputs scaled per row, remembered so that tango quantizes the unscaled input once per run.

DGL's ``GraphConv(norm="both")`` multiplies its input by ``deg^-1/2`` row by row
before the weight (when the input is wider than the output): ``(r * X) @ W``.
``r * X`` is a new tensor every step, so the int8 cache never sees it twice, and
on Cora or Citeseer quantizing those 2,708 x 1,433 or 3,327 x 3,703 values each
step costs as much as the float32 product. Since ``(r * X) @ W = r * (X @ W)``,
tango remembers which tensors are a column ``r [rows, 1]`` times a 2-d ``X``
(neither needing a gradient) and, when one reaches a dense product, multiplies
``X``, whose quantization the cache keeps for the run, and scales the product's
rows. The weight's gradient is then ``X^T (r * dY)``: autograd derives it.

When the input is narrower than the output, GraphConv aggregates ``r * X`` first.
``r`` is recomputed every step with the same values, so ``r * X`` is too: its int8
copy is made once (a constant's quantization depends on its values alone, so the
bits are those a fresh quantization would give) and reused while ``X`` is unchanged
and ``r`` has the same values. Weighing each edge by ``r`` over ``X``'s int8 copy
instead would cost a float multiply per value, slower on synthetic-arxiv than the
integer sums of a plain copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

Q = TypeVar("Q")

# the product functions whose result may be a row-scaled tensor
TABLE: dict[Any, str] = {
    torch.mul: "mul",
    torch.Tensor.mul: "mul",
    torch.Tensor.__mul__: "mul",
    torch.Tensor.__rmul__: "mul",
}


def _row_scale(x: Any, r: Any) -> bool:
    """``x * r`` scales the rows of a 2-d ``x`` by ``r [rows, 1]``, neither needing a gradient."""
    return (
        isinstance(x, torch.Tensor)
        and isinstance(r, torch.Tensor)
        and x.dim() == 2
        and r.shape == (x.shape[0], 1)
        and x.dtype == r.dtype == torch.float32
        and x.device == r.device
        and not x.requires_grad
        and not r.requires_grad
    )


class RowScaled:
    """Remembers ``r * X`` products (weakly: a record dies with the product)."""

    def __init__(self) -> None:
        # id(product) -> (product held weakly, X held weakly, r, versions of the three)
        self._records: dict[int, tuple[Any, Any, torch.Tensor, tuple[int, int, int]]] = {}
        # id(X) -> (X held weakly, its version, r, quantization of r * X, its key)
        self._copies: dict[int, tuple[Any, int, torch.Tensor, Any, object]] = {}
        self.used = 0  # products that took X (dense) or r * X's int8 copy (SpMM)

    def __len__(self) -> int:
        return len(self._records)

    def on_mul(self, kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        if kwargs or len(args) != 2 or not isinstance(out, torch.Tensor):
            return out
        a, b = args
        for x, r in ((a, b), (b, a)):
            if _row_scale(x, r) and out.shape == x.shape:
                self._remember(out, x, r)
                break
        return out

    def _remember(self, out: torch.Tensor, x: torch.Tensor, r: torch.Tensor) -> None:
        versions = (out._version, x._version, r._version)
        self._records[id(out)] = (_entry_ref(self._records, out), weakref.ref(x), r, versions)

    def quantized_once(
        self, y: torch.Tensor, quantize: Callable[[torch.Tensor], Q], key: object = None
    ) -> Q | None:
        """``quantize(y)`` for a remembered ``y = r * X``, made once per ``X`` (unchanged),
        values of ``r`` and ``key`` (what the quantization depends on besides the values,
        such as its bit count); None when ``y`` is not one."""
        source = self.source(y)
        if source is None:
            return None
        x, r = source
        copy = self._copies.get(id(x))
        if (
            copy is not None
            and copy[0]() is x
            and copy[1] == x._version
            and copy[2].shape == r.shape
            and torch.equal(copy[2], r)
            and copy[4] == key
        ):
            return copy[3]
        value = quantize(y)
        self._copies[id(x)] = (_entry_ref(self._copies, x), x._version, r.clone(), value, key)
        return value

    def source(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(X, r)`` when ``y`` is a remembered ``r * X`` and none of the three was written
        to since; else None."""
        record = self._records.get(id(y))
        if record is None or record[0]() is not y:
            return None
        x, r = record[1](), record[2]
        if x is None or (y._version, x._version, r._version) != record[3]:
            return None
        return x, r


def _entry_ref(table: dict[int, Any], key_tensor: torch.Tensor) -> weakref.ReferenceType[Any]:
    """A weak reference to the tensor ``table`` keys an entry by (``id``, the entry's first
    field); the entry is dropped when the tensor dies, unless a newer one took its id."""
    key = id(key_tensor)

    def forget(ref: weakref.ReferenceType[Any]) -> None:
        entry = table.get(key)
        if entry is not None and entry[0] is ref:
            del table[key]

    return weakref.ref(key_tensor, forget)
