"""``scatter_rows_add``: the transposed product of a 0/1 CSR matrix, a block of its rows at
a time, added into a given output::

    for r in range(R):                             # R = indptr.numel() - 1
        for k in range(indptr[r], indptr[r + 1]):
            out[indices[k]] += x[r]

Why a block of rows: a layer that reads its own CSR a block of rows at a time (so that no
whole-graph intermediate exists) passes ``indptr[a : b + 1]`` of the full CSR together with
the full ``indices``, with no rebased copy. So ``indptr`` need not start at 0 nor end at
``indices.numel()``: it is valid when ``0 <= indptr[0]``, it never decreases and
``indptr[R] <= indices.numel()``, and only ``indices[indptr[0] : indptr[R]]`` is read; every
index read must name a row of ``out``. What only the data shows is refused (ValueError)
before anything is added, so ``out`` is then left as it was.

:func:`reference_scatter_rows_add` is the pure-PyTorch definition; :func:`scatter_rows_add`
runs the op library's kernel (``torch.ops.qtrain.scatter_rows_add``, ``ext/README.md``) for
the tensors' device when it is built, else the reference, through ``qtrain.ops.dispatch``
(counted as ``scatter_rows_add``). The CPU kernel adds into each output row in ``(r, k)``
order, bit for bit a sequential loop's; the CUDA kernel adds with float32 atomics, equal to
the reference to float32 rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qtrain.ops import dispatch

SCATTER_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends of the op
_FN = "scatter_rows_add"
_INDEX_DTYPES = (torch.int32, torch.int64)


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _check_metadata(out: Tensor, indptr: Tensor, indices: Tensor, x: Tensor) -> None:
    """The op front's checks (``ext/ops/scatter_rows_add.cpp``): dtypes (TypeError), shapes,
    contiguity and devices (ValueError); no data is read."""
    if not isinstance(out, Tensor) or out.dtype != torch.float32:
        got = _dtype_name(out) if isinstance(out, Tensor) else type(out).__name__
        raise TypeError(f"{_FN}: out must be float32, got {got}")
    if out.dim() != 2:
        raise ValueError(f"{_FN}: out must have shape [N, D], got {list(out.shape)}")
    if not out.is_contiguous():
        raise ValueError(f"{_FN}: out must be a contiguous tensor (it is written in place)")
    for name, t in (("indptr", indptr), ("indices", indices)):
        if not isinstance(t, Tensor) or t.dtype not in _INDEX_DTYPES:
            got = _dtype_name(t) if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{_FN}: {name} must be int32 or int64, got {got}")
        if t.dim() != 1:
            raise ValueError(f"{_FN}: {name} must be 1-d, got shape {list(t.shape)}")
        if t.device != out.device:
            raise ValueError(f"{_FN}: {name} is on {t.device} but out is on {out.device}")
    if not isinstance(x, Tensor) or x.dtype != torch.float32:
        got = _dtype_name(x) if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{_FN}: x must be float32, got {got}")
    if x.dim() != 2:
        raise ValueError(f"{_FN}: x must have shape [R, D], got {list(x.shape)}")
    if x.device != out.device:
        raise ValueError(f"{_FN}: x is on {x.device} but out is on {out.device}")
    if indptr.numel() < 1:
        raise ValueError(f"{_FN}: indptr needs at least one entry (rows + 1)")
    if x.shape[0] != indptr.numel() - 1:
        raise ValueError(
            f"{_FN}: x must have one row per row of indptr ({indptr.numel() - 1}), got {x.shape[0]}"
        )
    if x.shape[1] != out.shape[1]:
        raise ValueError(
            f"{_FN}: x and out must have one width, got {x.shape[1]} and {out.shape[1]}"
        )


def reference_scatter_rows_add(out: Tensor, indptr: Tensor, indices: Tensor, x: Tensor) -> None:
    """``out[indices[k]] += x[r]`` for ``k`` in ``indptr[r] .. indptr[r + 1]``, in place, by
    its definition (``index_add_`` of ``x``'s rows repeated by degree); the kernels' checks,
    in their order, with their exception types, before ``out`` is touched."""
    _check_metadata(out, indptr, indices, x)
    ptr = indptr.to(torch.int64)
    first, last = int(ptr[0]), int(ptr[-1])
    if first < 0:
        raise ValueError(f"{_FN}: indptr[0] must be >= 0, got {first}")
    counts = ptr[1:] - ptr[:-1]
    decreasing = torch.nonzero(counts < 0)
    if decreasing.numel():
        r = int(decreasing[0, 0])
        raise ValueError(f"{_FN}: indptr must be non-decreasing, but indptr[{r + 1}] < indptr[{r}]")
    if last > indices.numel():
        raise ValueError(
            f"{_FN}: indptr[-1] must be at most the number of entries of indices "
            f"({indices.numel()}), got {last}"
        )
    used = indices[first:last].to(torch.int64)
    outside = torch.nonzero((used < 0) | (used >= out.shape[0]))
    if outside.numel():
        k = int(outside[0, 0])
        raise ValueError(
            f"{_FN}: indices[{first + k}] = {int(used[k])} is outside "
            f"[0, {out.shape[0]}) (the rows of out)"
        )
    rows = x.repeat_interleave(counts, dim=0, output_size=last - first)
    out.index_add_(0, used, rows)


def scatter_rows_add(
    out: Tensor, indptr: Tensor, indices: Tensor, x: Tensor, backend: str = "auto"
) -> None:
    """Add every row ``r`` of ``x`` onto the rows of ``out`` that the entries
    ``indptr[r] .. indptr[r + 1]`` of ``indices`` name, in place; ``indptr`` may be a row
    range ``indptr[a : b + 1]`` of a larger CSR whose whole ``indices`` is passed."""
    if not isinstance(out, Tensor):
        raise TypeError(f"{_FN}: out must be float32, got {type(out).__name__}")
    chosen = dispatch.resolve(_FN, out, backend, kernels=SCATTER_KERNELS)
    with dispatch.call(_FN, chosen):
        if chosen == "reference":
            reference_scatter_rows_add(out, indptr, indices, x)
        else:
            torch.ops.qtrain.scatter_rows_add(out, indptr, indices, x)
