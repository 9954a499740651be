"""Fake (meta) kernels of the op library: the shapes and dtypes each op returns.

``torch.compile``, ``torch.library.opcheck`` and FakeTensorMode run an op on
tensors without data; for the ops of ``torch.ops.qtrain`` they call these
functions, which work on symbolic sizes too. The argument checks are not here:
each op's C++ front (``ext/ops/<op>.cpp``) makes them once for every device.
Registered by :func:`register` when ``qtrain.ops.backends`` imports the library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Tensor = torch.Tensor


def _packed_bytes(n: Any, bits: int) -> Any:
    """Bytes that ``n`` values of ``bits`` bits take packed (``n`` may be symbolic)."""
    return (n * bits + 7) // 8


def _empty(shape: Any, dtype: torch.dtype, like: Tensor) -> Tensor:
    return like.new_empty(shape, dtype=dtype)


def quantize_symmetric(
    x: Tensor, bits: int, stochastic: bool = False, seed: int = 0, offset: int = 0
) -> tuple[Tensor, Tensor]:
    return _empty(x.shape, torch.int8, x), _empty((), torch.float32, x)


def quantize_symmetric_rows(
    x: Tensor, bits: int, stochastic: bool = False, seed: int = 0, offset: int = 0
) -> tuple[Tensor, Tensor]:
    return _empty(x.shape, torch.int8, x), _empty((x.shape[0], 1), torch.float32, x)


def quantize_symmetric_rows4(
    x: Tensor, bits: int, stochastic: bool = False, seed: int = 0, offset: int = 0
) -> tuple[Tensor, Tensor]:
    packed = _empty((x.shape[0], (x.shape[1] + 1) // 2), torch.uint8, x)
    return packed, _empty((x.shape[0], 1), torch.float32, x)


def quantize_symmetric_cols(
    x: Tensor, bits: int, stochastic: bool = False, seed: int = 0, offset: int = 0, block: int = 0
) -> tuple[Tensor, Tensor]:
    rows = 1 if block == 0 else (x.shape[0] + block - 1) // block
    return _empty(x.shape, torch.int8, x), _empty((rows, x.shape[1]), torch.float32, x)


def quantize_symmetric_cols4(
    x: Tensor, bits: int, stochastic: bool = False, seed: int = 0, offset: int = 0, block: int = 0
) -> tuple[Tensor, Tensor]:
    rows = 1 if block == 0 else (x.shape[0] + block - 1) // block
    packed = _empty((x.shape[0], (x.shape[1] + 1) // 2), torch.uint8, x)
    return packed, _empty((rows, x.shape[1]), torch.float32, x)


def int8_block_gemm(qa: Tensor, qb: Tensor, scale_a: Tensor, scale_b: Tensor, block: int) -> Tensor:
    # the widths are the scales' (an operand may be stored packed)
    return _empty((scale_a.shape[1], scale_b.shape[1]), torch.float32, qa)


def hadamard_rotate(x: Tensor, block: int) -> Tensor:
    return _empty((x.shape[0], (x.shape[1] + block - 1) // block * block), torch.float32, x)


def fill_counter_uniform(out: Tensor, seed: int = 0, offset: int = 0) -> None:
    return None


def qspmm(
    indptr: Tensor,
    indices: Tensor,
    q: Tensor,
    scale: float,
    weight: Tensor | None = None,
    eids: Tensor | None = None,
    row_scale: Tensor | None = None,
) -> Tensor:
    return _empty((indptr.shape[0] - 1, *q.shape[1:]), torch.float32, q)


def qspmm4(
    indptr: Tensor,
    indices: Tensor,
    packed: Tensor,
    width: int,
    scale: float,
    weight: Tensor | None = None,
    eids: Tensor | None = None,
    row_scale: Tensor | None = None,
) -> Tensor:
    return _empty((indptr.shape[0] - 1, *packed.shape[1:-1], width), torch.float32, packed)


def pack_int4(q: Tensor) -> Tensor:
    return _empty((*q.shape[:-1], (q.shape[-1] + 1) // 2), torch.uint8, q)


def unpack_int4(packed: Tensor, width: int) -> Tensor:
    return _empty((*packed.shape[:-1], width), torch.int8, packed)


def qsddmm(
    op: str,
    q_lhs: Tensor,
    scale_lhs: float,
    lhs_index: Tensor,
    q_rhs: Tensor,
    scale_rhs: float,
    rhs_index: Tensor,
    row_scale_lhs: Tensor | None = None,
    row_scale_rhs: Tensor | None = None,
) -> Tensor:
    edges = lhs_index.shape[0]
    trailing = (*q_lhs.shape[1:-1], 1) if op == "dot" else q_lhs.shape[1:]
    return _empty((edges, *trailing), torch.float32, q_lhs)


def qsddmm4(
    op: str,
    packed_lhs: Tensor,
    scale_lhs: float,
    lhs_index: Tensor,
    packed_rhs: Tensor,
    scale_rhs: float,
    rhs_index: Tensor,
    width: int,
    row_scale_lhs: Tensor | None = None,
    row_scale_rhs: Tensor | None = None,
) -> Tensor:
    edges = lhs_index.shape[0]
    trailing = (*packed_lhs.shape[1:-1], 1 if op == "dot" else width)
    return _empty((edges, *trailing), torch.float32, packed_lhs)


def _gemm_shape(a: Tensor, b: Tensor, layout: str) -> tuple[Any, Any]:
    """(M, N) of the product of operands stored as ``layout`` says."""
    m = a.shape[1] if layout == "tn" else a.shape[0]
    n = b.shape[0] if layout == "nt" else b.shape[1]
    return m, n


def int8_gemm(
    qa: Tensor,
    qb: Tensor,
    scale: float,
    layout: str,
    bias: Tensor | None = None,
    row_scale: Tensor | None = None,
    col_scale: Tensor | None = None,
) -> Tensor:
    return _empty(_gemm_shape(qa, qb, layout), torch.float32, qa)


def quantized_gemm(
    a: Tensor,
    b: Tensor,
    absmax_a: Tensor,
    absmax_b: Tensor,
    bits_a: int = 8,
    bits_b: int = 8,
    layout: str = "nn",
    bias: Tensor | None = None,
    stochastic: bool = False,
    seed: int = 0,
    offset_a: int = 0,
    offset_b: int = 0,
) -> tuple[Tensor, Tensor]:
    return _empty(_gemm_shape(a, b, layout), torch.float32, a), _empty((), torch.float32, a)


def _row_codes(rows: Any, width: Any, bits: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(packed, zero, range) of ``rows`` quantized rows of ``width`` values."""
    return (
        _empty((_packed_bytes(rows * width, bits),), torch.uint8, like),
        _empty((rows,), torch.bfloat16, like),
        _empty((rows,), torch.bfloat16, like),
    )


def quantize_rows(
    x: Tensor, bits: int, stochastic: bool = True, seed: int = 0, offset: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    return _row_codes(x.shape[0], x.shape[1], bits, x)


def quantize_rows_means(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return _row_codes(x.shape[0], x.shape[1], 1, x)


def dequantize_rows(packed: Tensor, zero: Tensor, range: Tensor, bits: int, width: int) -> Tensor:
    return _empty((zero.shape[0], width), torch.float32, packed)


def quantize_rows_into(
    x: Tensor,
    index: Tensor | None,
    bits: int,
    stochastic: bool,
    seed: int,
    offset: int,
    out: Tensor,
) -> None:
    return None


def dequantize_rows_into(
    segment: Tensor, rows: int, bits: int, out: Tensor, index: Tensor | None, add: bool
) -> None:
    return None


def project_quantize_rows(
    x: Tensor,
    k: int,
    bits: int,
    stochastic: bool = True,
    seed: int = 0,
    offset: int = 0,
    projection_offset: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    return _row_codes(x.shape[0], k, bits, x)


def dequantize_unproject_rows(
    packed: Tensor,
    zero: Tensor,
    range: Tensor,
    bits: int,
    k: int,
    d: int,
    seed: int = 0,
    projection_offset: int = 0,
) -> Tensor:
    return _empty((zero.shape[0], d), torch.float32, packed)


def pack_bits(values: Tensor, bits: int) -> Tensor:
    return _empty((_packed_bytes(values.numel(), bits),), torch.uint8, values)


def unpack_bits(packed: Tensor, bits: int, n: int) -> Tensor:
    return _empty((n,), torch.uint8, packed)


def masked_scale(grad: Tensor, packed: Tensor, scale: float) -> Tensor:
    return _empty(grad.shape, torch.float32, grad)


def fill_rademacher(out: Tensor, seed: int = 0, offset: int = 0) -> None:
    return None


def keep_mask_rows(ids: Tensor, width: int, threshold: int, seed: int = 0) -> Tensor:
    return _empty((_packed_bytes(ids.shape[0] * width, 1),), torch.uint8, ids)


def segment_matmul(
    x: Tensor, offsets: Tensor, weight: Tensor, transpose_weight: bool = False
) -> Tensor:
    return _empty((x.shape[0], weight.shape[1 if transpose_weight else 2]), x.dtype, x)


def segment_matmul_tn(x: Tensor, offsets: Tensor, grad: Tensor) -> Tensor:
    return _empty((offsets.shape[0] - 1, x.shape[1], grad.shape[1]), x.dtype, x)


def int8_segment_gemm(qa: Tensor, qb: Tensor, offsets: Tensor, scale: float, layout: str) -> Tensor:
    if layout == "tn":
        shape = (offsets.shape[0] - 1, qa.shape[1], qb.shape[1])
    else:
        shape = (qa.shape[0], qb.shape[2] if layout == "nn" else qb.shape[1])
    return _empty(shape, torch.float32, qa)


def int8_gemm_int32(qa: Tensor, qb: Tensor, layout: str) -> Tensor:
    rows = qa.shape[1] if layout == "tn" else qa.shape[0]
    cols = qb.shape[0] if layout == "nt" else qb.shape[1]
    return _empty((rows, cols), torch.int32, qa)


def int8_spmm(indptr: Tensor, indices: Tensor, values: Tensor, q: Tensor) -> Tensor:
    return _empty((indptr.shape[0] - 1, q.shape[1]), torch.int32, q)


def scatter_rows_add(out: Tensor, indptr: Tensor, indices: Tensor, x: Tensor) -> None:
    return None


def requantize(x: Tensor, shift: int) -> Tensor:
    return _empty(x.shape, torch.int8, x)


def dyq(x: Tensor, tail: int | None = None) -> tuple[Tensor, Tensor]:
    return _empty(x.shape, torch.int8, x), _empty((), torch.int64, x)


# every op of the library, by name: a test checks that the library defines exactly these
FAKES: dict[str, Callable[..., Any]] = {
    fn.__name__: fn
    for fn in (
        quantize_symmetric,
        quantize_symmetric_rows,
        quantize_symmetric_rows4,
        quantize_symmetric_cols,
        quantize_symmetric_cols4,
        hadamard_rotate,
        fill_counter_uniform,
        qspmm,
        qspmm4,
        pack_int4,
        unpack_int4,
        qsddmm,
        qsddmm4,
        int8_gemm,
        int8_block_gemm,
        quantized_gemm,
        quantize_rows,
        quantize_rows_means,
        dequantize_rows,
        quantize_rows_into,
        dequantize_rows_into,
        project_quantize_rows,
        dequantize_unproject_rows,
        pack_bits,
        unpack_bits,
        masked_scale,
        fill_rademacher,
        keep_mask_rows,
        segment_matmul,
        segment_matmul_tn,
        int8_segment_gemm,
        int8_gemm_int32,
        int8_spmm,
        scatter_rows_add,
        requantize,
        dyq,
    )
}

_registered = False


def defined_ops() -> set[str]:
    """The ops the loaded library defines in the ``qtrain`` namespace."""
    prefix = "qtrain::"
    return {
        name[len(prefix) :].split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith(prefix)
    }


def register() -> None:
    """Register the fake kernel of every op the library defines (once per process)."""
    global _registered
    if _registered:
        return
    for name in sorted(defined_ops() & FAKES.keys()):
        torch.library.register_fake(f"qtrain::{name}")(FAKES[name])
    _registered = True
