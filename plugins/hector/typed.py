"""DGL's typed products (``segment_mm``, ``gather_mm``) as qtrain's segment GEMM.

``segment_mm`` multiplies consecutive row segments by one matrix each: the op library's
``segment_matmul`` does exactly that, one GEMM per relation in C++ (MKL on the CPU,
cuBLAS on CUDA) with a backward of two more segment GEMMs, where DGL's CPU kernel runs
a naive loop for the weight gradient. ``gather_mm`` (one matrix per row, chosen by an
index: unsorted edges, a mini-batch block) is sorted by relation first, so it becomes one
segment GEMM too instead of a product per row with the weights replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from qtrain.ops.typed import RowsByType, offsets_from_lengths, segment_matmul

_DEVICES = ("cpu", "cuda")  # where the op library has kernels
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def handles(a: Any, b: Any) -> bool:
    """Dense floating operands of one dtype on a device the op library has kernels for."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.layout == torch.strided
        and b.layout == torch.strided
        and a.dtype in _FLOATS
        and a.dtype == b.dtype
        and a.device == b.device
        and a.device.type in _DEVICES
        and a.dim() == 2
        and b.dim() == 3
    )


def segment_mm(original: Callable[..., Any]) -> Callable[..., Any]:
    """``dgl.ops.segment_mm(a, b, seglen_a)`` through ``segment_matmul``."""

    def hector_segment_mm(a: Any, b: Any, seglen_a: Any) -> Any:
        if not handles(a, b):
            return original(a, b, seglen_a)
        return segment_matmul(a, b, offsets_from_lengths(torch.as_tensor(seglen_a)))

    hector_segment_mm.__wrapped__ = original  # type: ignore[attr-defined]
    return hector_segment_mm


def gather_mm(original: Callable[..., Any]) -> Callable[..., Any]:
    """``dgl.ops.gather_mm(a, b, idx_b=...)``: rows sorted by relation, one segment GEMM,
    rows put back in their order."""

    def hector_gather_mm(a: Any, b: Any, *, idx_b: Any) -> Any:
        if not (handles(a, b) and isinstance(idx_b, torch.Tensor)):
            return original(a, b, idx_b=idx_b)
        rows = RowsByType(idx_b, b.shape[0])
        return rows.restore(segment_matmul(rows.group(a), b, rows.offsets))

    hector_gather_mm.__wrapped__ = original  # type: ignore[attr-defined]
    return hector_gather_mm
