"""Where an int8 primitive cannot pay: too little work per call for the kernel it saves to
cover the quantizations it adds (its operands, then its gradient).

Measured on the 2-core CPU these thresholds come from (``python bench/crossover.py
--threads 2``: each primitive's forward and backward inside one tango session, kept in
float32 against quantized, interleaved, on graphs of Cora's size and of 20,000 nodes and
200,000 edges; ``bench/results/vm-2026-11-27e-crossover.json``):

* GEMM: 0.68-0.71x at 2,708 x 16 x 7 (0.3 M multiply-adds), 0.70-0.79x at 2,708 x 32 x 32
  (2.8 M), 0.82-0.94x at 6.1-6.2 M (3,000 x 32 x 64, 2,708 x 48 x 48, 3,000 x 64 x 32),
  1.07-1.31x at 2,708 x 64 x 64 (11 M), 1.12-1.20x at 10-12 M: below 2^23 multiply-adds a
  product stays float32 (the 6 M and 10-12 M shapes measured while a CI run shared the
  cores, interleaved: ``bench/results/vm-2026-11-27e-crossover-gemm.log``).
* SpMM that copies rows (``copy_u``, ``copy_e``) and SDDMM ``add`` / ``sub`` (GAT's
  attention logits, one value per head) on a graph of 2^16 edges or more: 0.69-1.02x
  below 32 values per row, 1.35-2.0x from 32. On Cora-sized graphs the int8 kernels win
  at every width (1.1-1.6x): DGL's float path makes many more torch calls, each through
  tango's function mode, and on a small graph those fixed costs decide.
* SpMM that weighs rows by edge values (``u_mul_e``): 1.1-1.4x already at 4 values per
  row; SDDMM ``dot`` / ``mul``: 1.1-1.2x at 2. Below those widths nothing was measured,
  and they stay float32.
* The recorded run decided 36 of 39 cases as measured; the other three sit near parity
  or below the measured widths: ``copy_u`` at 16 values a row on the larger graph kept
  in float32 at 1.09x (1.02-1.22x in earlier runs), an ``add`` at 32 on Cora's size
  quantized at 0.93x, a ``u_mul_e`` at 2 values kept in float32 at 1.31x.

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
