"""Where an int8 primitive cannot pay: too little work per call for the kernel it saves to
cover the quantizations it adds (its operands, then its gradient).

Measured on the 2-core CPU these thresholds come from (``python bench/crossover.py
--threads 2``: each primitive's forward and backward inside one tango session, kept in
float32 against quantized, interleaved, on graphs of Cora's size and of 20,000 nodes and
200,000 edges; ``bench/results/vm-2026-11-27f-crossover.json``, after plugins stopped
routing every torch call through a function mode; the earlier
``vm-2026-11-27e-crossover.json`` led to the same thresholds):

* GEMM: 0.66x at 2,708 x 16 x 7 (0.3 M multiply-adds), 0.68x at 2,708 x 32 x 32 (2.8 M),
  0.90-0.91x at 6.1-6.2 M (3,000 x 32 x 64, 2,708 x 48 x 48), 1.15x at 2,708 x 64 x 64
  (11 M), 1.40x at 5,000 x 32 x 64 (10 M): below 2^23 multiply-adds a product stays
  float32.
* SpMM that copies rows (``copy_u``, ``copy_e``) and SDDMM ``add`` / ``sub`` (GAT's
  attention logits, one value per head) on a graph of 2^16 edges or more: 0.52-0.89x
  below 32 values per row, 1.28-2.2x from 32. On Cora-sized graphs the int8 ``copy_u``
  wins at every width (1.10-1.45x): DGL's float path makes more torch calls, and on a
  small graph those fixed costs decide.
* SpMM that weighs rows by edge values (``u_mul_e``): 1.2-1.3x already at 4 values per
  row; SDDMM ``dot`` / ``mul``: 0.96-1.2x at 2. Below those widths nothing was measured,
  and they stay float32.
* The recorded run decided 39 of 42 cases as measured; the other three sit near parity:
  a ``u_mul_e`` at 2 values on Cora's size kept in float32 at 1.18x, an ``add`` with 8
  heads on Cora's size quantized at 0.96x, a ``dot`` at 2 values on the larger graph
  quantized at 0.96x.

Only the CPU has measured thresholds: elsewhere every primitive the kernels cover is
quantized, as in the paper. A primitive kept in float32 here is counted as ``fp32`` in
the run's ``kernels`` table and listed with its reason in tango's ``fp32_calls``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WHY = "too small for int8 to pay on {device}: {what} (quant.tango.fp32_when_small)"


@dataclass(frozen=True)
class Thresholds:
    """The least work per call at which each int8 primitive pays on one device."""

    gemm_macs: int  # M * K * N
    copy_width: int  # values per row an SpMM copies (copy_u, copy_e) or an SDDMM adds ...
    copy_edges: int  # ... on graphs of at least this many edges (fewer: int8 always pays)
    weighted_width: int  # values per row of an edge-weighted SpMM (u_mul_e)
    dot_width: int  # values per row an SDDMM multiplies (dot, mul)


MEASURED = {
    "cpu": Thresholds(
        gemm_macs=1 << 23, copy_width=32, copy_edges=1 << 16, weighted_width=4, dot_width=2
    )
}


def _width(x: torch.Tensor) -> int:
    """Values per row (node or edge) of an [N, ...] operand."""
    return x[0].numel() if x.dim() > 0 and x.shape[0] > 0 else x.numel()


def _below(device: torch.device, what: str, have: int, need: int) -> str | None:
    if have >= need:
        return None
    return WHY.format(device=device.type, what=f"{what} {have:,} < {need:,}")


def gemm(x: torch.Tensor, w: torch.Tensor, linear: bool) -> str | None:
    """Why ``x @ w`` (``linear``: ``x @ w^T``) stays float32 here, or None."""
    limits = MEASURED.get(x.device.type)
    if limits is None:
        return None
    rows = x.numel() // max(x.shape[-1], 1)
    k, n = (w.shape[1], w.shape[0]) if linear else (w.shape[0], w.shape[1])
    return _below(x.device, "multiply-adds", rows * k * n, limits.gemm_macs)


def _graph_primitive(kind: str, op: str, x: torch.Tensor, edges: int) -> str | None:
    limits = MEASURED.get(x.device.type)
    if limits is None:
        return None
    what = f"{op} {kind}, values per row"
    if op in ("dot", "mul"):
        need = limits.weighted_width if kind == "SpMM" else limits.dot_width
        return _below(x.device, what, _width(x), need)
    if edges < limits.copy_edges:
        return None
    return _below(x.device, f"{what} on {edges:,} edges", _width(x), limits.copy_width)


def spmm(op: str, x: torch.Tensor, edges: int) -> str | None:
    """Why a sum aggregation over ``edges`` of rows like ``x`` stays float32 here, or None
    (``op``: "copy", or "mul" for rows weighted by edge values)."""
    return _graph_primitive("SpMM", op, x, edges)


def sddmm(op: str, x: torch.Tensor, edges: int) -> str | None:
    """Why an SDDMM over ``edges`` of node rows like ``x`` stays float32 here, or None."""
    return _graph_primitive("SDDMM", op, x, edges)
