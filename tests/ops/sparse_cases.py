"""Inputs shared by the qspmm and qsddmm tests: CSR graphs, quantized rows, the emulation
of the weighted SpMM's order of additions in the kernels, and the CPU kernel variants to run."""

from __future__ import annotations

import torch

from qtrain.ops.partition import merge_path_partition, reference_spmm_by_units, spmm_items_per_unit
from qtrain.ops.quantize import quantize

INDEX_DTYPES = (torch.int32, torch.int64)


def csr(
    rows: int, n_in: int, avg: int, kind: str, seed: int, dtype: torch.dtype = torch.int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random CSR (indptr, indices) with zero-degree rows: "uniform" degrees, "powerlaw"
    (most rows short, a few hubs, about a third empty) or "zeros" (every other row empty)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        deg = torch.randint(0, 2 * avg + 1, (rows,), generator=g)
    elif kind == "zeros":
        deg = torch.randint(0, 2 * avg + 1, (rows,), generator=g) * (torch.arange(rows) % 2)
    else:
        u = torch.rand(rows, generator=g)
        deg = (avg * 0.4 * (u.clamp(min=1e-3) ** -1.2 - 1)).long().clamp(max=50 * avg)
    indptr = torch.zeros(rows + 1, dtype=torch.int64)
    indptr[1:] = deg.cumsum(0)
    indices = torch.randint(0, max(n_in, 1), (int(indptr[-1]),), generator=g)
    return indptr.to(dtype), indices.to(dtype)


def quantized(shape: tuple[int, ...], bits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, scale) of a random float tensor, by the reference quantizer."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return quantize(x, bits, backend="reference")


def q_shape(n: int, heads: int, width: int) -> tuple[int, ...]:
    return (n, width) if heads == 1 else (n, heads, width)


def csr_order(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: float,
    weight: torch.Tensor,
    eids: torch.Tensor | None,
) -> torch.Tensor:
    """Weighted SpMM of [N, D] rows with each row's float32 additions in CSR order, the
    order of a kernel that gives each row to one thread: one unit as large as the graph."""
    rows, nnz = indptr.numel() - 1, indices.numel()
    e = eids.to(torch.int64) if eids is not None else torch.arange(nnz)
    whole = merge_path_partition(indptr, nnz, rows + nnz + 1)
    acc = reference_spmm_by_units(indptr, indices, q.to(torch.float32), whole, weight[e])
    return acc * torch.tensor(scale, dtype=torch.float32)


def kernel_order_weighted(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor | float,
    weight: torch.Tensor,
    eids: torch.Tensor | None,
) -> torch.Tensor:
    """Weighted SpMM with the float32 additions in the order of every kernel (CPU and
    CUDA): over the merge-path units the kernels use (``spmm_items_per_unit``), each
    row's pieces in CSR order, the pieces of a split row added in unit order; so they
    equal this bit for bit. The reference adds in another order and agrees only to
    rounding."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of small ops: a thread team costs more than it saves
    try:
        rows, nnz = indptr.numel() - 1, indices.numel()
        q3 = q if q.dim() == 3 else q[:, None, :]
        w = weight.to(torch.float32)
        if w.dim() == 3:
            w = w[:, :, 0]
        if w.dim() == 1:
            w = w[:, None]
        w = w.expand(w.shape[0], q3.shape[1])
        e = eids.to(torch.int64) if eids is not None else torch.arange(nnz)
        per_unit = spmm_items_per_unit(rows, nnz)
        partition = merge_path_partition(indptr, nnz, per_unit)
        acc = reference_spmm_by_units(
            indptr, indices, q3.to(torch.float32), partition, w[e][:, :, None]
        )
        out = acc * torch.as_tensor(scale, dtype=torch.float32)
        return out if q.dim() == 3 else out[:, 0, :]
    finally:
        torch.set_num_threads(threads)
