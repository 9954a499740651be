"""Inputs shared by the qspmm and qsddmm tests: CSR graphs, quantized rows, the CSR-order
emulation of the weighted SpMM, and the CPU kernel variants to run."""

from __future__ import annotations

import torch

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


def csr_order_weighted(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor | float,
    weight: torch.Tensor,
    eids: torch.Tensor | None,
) -> torch.Tensor:
    """Weighted SpMM with each row's float32 additions in CSR order: the order of every
    kernel (CPU: one thread per row; CUDA: one lane group per row), so they equal this
    bit for bit. The reference adds in another order and agrees only to rounding."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of small ops: a thread team costs more than it saves
    try:
        rows = indptr.numel() - 1
        q3 = q if q.dim() == 3 else q[:, None, :]
        h, d = q3.shape[1], q3.shape[2]
        w = weight.to(torch.float32)
        if w.dim() == 3:
            w = w[:, :, 0]
        if w.dim() == 1:
            w = w[:, None]
        w = w.expand(w.shape[0], h)
        ip = indptr.to(torch.int64)
        nnz = indices.numel()
        row_of = torch.repeat_interleave(torch.arange(rows), ip[1:] - ip[:-1])
        e = eids.to(torch.int64) if eids is not None else torch.arange(nnz)
        contrib = w[e][:, :, None] * q3[indices.to(torch.int64)].to(torch.float32)  # fl32 products
        # entries grouped by their position in the row: one add per row and position, in order
        pos = torch.arange(nnz) - ip[row_of]
        order = torch.argsort(pos, stable=True)
        acc = torch.zeros((rows, h, d), dtype=torch.float32)
        start = 0
        for count in torch.bincount(pos).tolist():
            k = order[start : start + count]
            acc[row_of[k]] += contrib[k]  # rows are distinct within one position
            start += count
        out = acc * torch.as_tensor(scale, dtype=torch.float32)
        return out if q.dim() == 3 else out[:, 0, :]
    finally:
        torch.set_num_threads(threads)
