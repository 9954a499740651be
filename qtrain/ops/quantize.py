"""Quantize / dequantize with backend dispatch (see ``qtrain.ops.dispatch``).

The compiled backends are the op ``torch.ops.qtrain.quantize_symmetric``, whose
C++ front checks its arguments for every device; the reference checks its own.
Both refuse the same inputs with the same Python exception and agree bit for bit.
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch
from qtrain.quant import granular
from qtrain.quant import packed as packed_ref
from qtrain.quant import quantize as ref
from qtrain.quant.rng import op_seed

QUANTIZE_KERNELS = ("ext-cpu", "ext-cuda")
# compiled backends implementing quantize_symmetric_rows
ROW_QUANTIZE_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")
PACKED_ROW_BITS = 4  # the most bits quantize_per_row_packed stores (a value fits a nibble)
# compiled backends implementing quantize_symmetric_cols
COL_QUANTIZE_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")


def quantize(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-tensor quantization: ``(q int8, scale float32 0-d)`` with x ~ q * scale.

    ``x`` of any floating dtype is taken as float32. ``backend`` is "auto"
    (the compiled kernel for x's device when built, else the reference with
    the fallback recorded), "reference", "ext-cpu" or "ext-cuda".
    """
    xf = ref.as_float32(x)
    chosen = dispatch.resolve("quantize", xf, backend, kernels=QUANTIZE_KERNELS)
    with dispatch.call("quantize", chosen):
        if chosen == "reference":
            return ref.quantize_symmetric(xf, bits, rounding, seed, offset)
        return torch.ops.qtrain.quantize_symmetric(
            xf, bits, ref.stochastic(rounding), op_seed(seed), offset
        )


def quantize_per_row(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization with one scale per row of a 2-d x: ``(q int8, scale float32
    [rows, 1])``, x ~ q * scale (the scale broadcasts over the row). An x of more
    dimensions has one scale per row of its last dimension (a node's head ``[N, H, D]``:
    scale ``[N, H, 1]``): heads are separate linear maps whose ranges differ, and one scale
    for a node's heads left a small head few levels at 2 bits (README, "One scale per node
    and head"). q has x's shape.

    Every row is ``quantize_symmetric`` of that row with the counters of its elements' flat
    indices in x (``offset + i * cols + j``): the reference is
    ``qtrain.quant.granular.quantize_tiles(x, bits, (1, cols))``.
    """
    xf = ref.as_float32(x)
    if xf.dim() > 2:
        rows = xf.reshape(xf.shape[:-1].numel(), xf.shape[-1])
        q, scale = quantize_per_row(rows, bits, rounding, seed, offset, backend)
        return q.view(xf.shape), scale.view(*xf.shape[:-1], 1)
    chosen = dispatch.resolve("quantize_rows", xf, backend, kernels=ROW_QUANTIZE_KERNELS)
    with dispatch.call("quantize_rows", chosen):
        if chosen == "reference":
            return granular.quantize_rows_symmetric(xf, bits, rounding, seed, offset)
        return torch.ops.qtrain.quantize_symmetric_rows(
            xf, bits, ref.stochastic(rounding), op_seed(seed), offset
        )


def _check_packed_bits(bits: object) -> int:
    """A bit count whose values fit a nibble: 2..PACKED_ROW_BITS."""
    bits = ref.check_bits(bits)
    if bits > PACKED_ROW_BITS:
        raise ValueError(f"bits must be an integer in 2..{PACKED_ROW_BITS}, got {bits}")
    return bits


def reference_quantize_rows4(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-PyTorch definition of the op ``quantize_symmetric_rows4``: ``(pack_int4(q),
    scale)`` of ``quantize_rows_symmetric`` at 2 to 4 bits."""
    bits = _check_packed_bits(bits)
    q, scale = granular.quantize_rows_symmetric(x, bits, rounding, seed, offset)
    return packed_ref.pack_int4(q), scale


def quantize_per_row_packed(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_per_row` at 2 to 4 bits with its values stored two a byte: ``(packed
    uint8 [..., ceil(D / 2)], scale)``, bit for bit ``pack_int4`` of its q, made in one pass
    (the int8 values are never written out). What tango stores at 4 bits or fewer.
    Counted as the primitive "quantize_rows", like :func:`quantize_per_row`."""
    xf = ref.as_float32(x)
    if xf.dim() > 2:
        rows = xf.reshape(xf.shape[:-1].numel(), xf.shape[-1])
        packed, scale = quantize_per_row_packed(rows, bits, rounding, seed, offset, backend)
        return packed.view(*xf.shape[:-1], packed.shape[-1]), scale.view(*xf.shape[:-1], 1)
    chosen = dispatch.resolve("quantize_rows", xf, backend, kernels=ROW_QUANTIZE_KERNELS)
    with dispatch.call("quantize_rows", chosen):
        if chosen == "reference":
            return reference_quantize_rows4(xf, bits, rounding, seed, offset)
        return torch.ops.qtrain.quantize_symmetric_rows4(
            xf, bits, ref.stochastic(rounding), op_seed(seed), offset
        )


def quantize_per_column(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
    block: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization with one scale per column of a 2-d x: ``(q int8 in x's layout,
    scale float32 [1, cols])``, x ~ q * scale. The operand of a product that sums over x's
    rows (a weight gradient X^T dY reads X through the GEMM's "tn" layout), without
    transposing x. Reference: ``qtrain.quant.granular.quantize_cols_symmetric``.

    ``block`` > 0: one scale per block of ``block`` rows of each column, scale float32
    ``[ceil(rows / block), cols]`` (``granular.quantize_col_blocks``): the operands of
    ``qtrain.ops.gemm.int8_block_gemm``."""
    xf = ref.as_float32(x)
    block = _check_block(block)
    chosen = dispatch.resolve("quantize_cols", xf, backend, kernels=COL_QUANTIZE_KERNELS)
    with dispatch.call("quantize_cols", chosen):
        if chosen == "reference":
            return _reference_cols(xf, bits, rounding, seed, offset, block)
        return torch.ops.qtrain.quantize_symmetric_cols(
            xf, bits, ref.stochastic(rounding), op_seed(seed), offset, block
        )


def reference_quantize_cols4(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    block: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-PyTorch definition of the op ``quantize_symmetric_cols4``: ``(pack_int4(q),
    scale)`` of ``quantize_cols_symmetric`` (``block`` 0) or ``quantize_col_blocks`` at 2 to
    4 bits."""
    bits = _check_packed_bits(bits)
    q, scale = _reference_cols(x, bits, rounding, seed, offset, _check_block(block))
    return packed_ref.pack_int4(q), scale


def quantize_per_column_packed(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
    block: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_per_column` at 2 to 4 bits with its values stored two a byte along
    each row: ``(packed uint8 [rows, ceil(cols / 2)], scale)``, bit for bit ``pack_int4`` of
    its q, made in one pass (the int8 values are never written out). What tango keeps of a
    GEMM's X columns at 4 bits or fewer, which ``int8_block_gemm`` reads packed. Counted as
    the primitive "quantize_cols", like :func:`quantize_per_column`."""
    xf = ref.as_float32(x)
    block = _check_block(block)
    chosen = dispatch.resolve("quantize_cols", xf, backend, kernels=COL_QUANTIZE_KERNELS)
    with dispatch.call("quantize_cols", chosen):
        if chosen == "reference":
            return reference_quantize_cols4(xf, bits, rounding, seed, offset, block)
        return torch.ops.qtrain.quantize_symmetric_cols4(
            xf, bits, ref.stochastic(rounding), op_seed(seed), offset, block
        )


def _reference_cols(
    x: torch.Tensor, bits: int, rounding: str, seed: int, offset: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference column quantizer: one scale per column (``block`` 0) or per block."""
    if block:
        return granular.quantize_col_blocks(x, bits, block, rounding, seed, offset)
    return granular.quantize_cols_symmetric(x, bits, rounding, seed, offset)


def _check_block(block: object) -> int:
    """A column quantization's ``block``: 0 (one scale per column) or a row count."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        raise ValueError(f"block must be >= 0 (0: one scale per column), got {block!r}")
    return block


def dequantize(q: torch.Tensor, scale: torch.Tensor | float, backend: str = "auto") -> torch.Tensor:
    """float32 ``q * scale``; one multiply, so the reference is the only implementation."""
    chosen = dispatch.resolve("dequantize", q, backend, kernels=())
    with dispatch.call("dequantize", chosen):
        out = ref.dequantize(q, scale)
    return out
