"""Inputs and comparisons the tests of the row codecs share (exact's activation compression
and adaqp's messages: quantize_rows, dequantize_rows, their *_into forms, the fused
projections).

Every kernel is compared with the pure-PyTorch reference (``qtrain.quant.rowwise``,
``qtrain.quant.projection``) run on CPU copies of the same inputs, bit for bit.
"""

from __future__ import annotations

import functools

import torch
from conftest import varied_rows
from support import assert_same

from qtrain.quant import projection
from qtrain.quant import rowwise as ref

BITS = (1, 2, 4, 8)
ROUNDINGS = ("nearest", "stochastic")
# (seed, offset): offsets next to 2^32 make the counter's high word change inside a row
STREAMS = ((0, 0), (-1, 2**32 - 50), (2**64 - 7, 12345), (5, 2**32 - 3))
# pack_bits / unpack_bits: stream lengths that end in partial groups, and one with enough
# 8-value groups that two CPU threads split them (2^18 groups per thread at least)
PACK_SIZES = (1, 3, 7, 8, 9, 13, 31, 32, 33, 63, 100, 1001)
PACK_BIG = 8 * (1 << 18) + 8 * 1000 + 5
# (rows, d, k): odd widths, k above d, k not a multiple of any vector width, 1 x 1, no
# rows, no input columns; several 4-row tiles and 64-row stages; items beyond one block
# (k = 200, 300), d beyond one x stage (d = 2000, 3000); k > 1024 (CUDA's unfused path)
PROJECTION_SHAPES = (
    (37, 256, 32),
    (5, 17, 3),
    (9, 33, 40),
    (1, 1, 1),
    (70, 64, 8),
    (130, 100, 33),
    (0, 16, 4),
    (6, 0, 5),
    (300, 128, 16),
    (20, 40, 200),
    (11, 2000, 300),
    (70, 3000, 8),
    (3, 40, 1100),
)

__all__ = [
    "BITS",
    "PACK_BIG",
    "PACK_SIZES",
    "PROJECTION_SHAPES",
    "ROUNDINGS",
    "STREAMS",
    "edge_rows",
    "fused_reference",
    "misaligned",
    "non_finite_rows",
    "project_reference",
    "projection_input",
    "same_quantized",
    "segment_reference",
    "varied_rows",
]


def misaligned(x: torch.Tensor, device: str) -> torch.Tensor:
    """A contiguous copy of x on ``device`` whose data starts one element past an
    aligned address (the kernels' scalar paths)."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)
    flat[1:] = x.reshape(-1).to(device)
    out = flat[1:].view(x.shape)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


def same_quantized(got: tuple, want: tuple, what: str = "") -> None:
    """Packed bytes and ranges bit for bit; a zero point of +-0 may take either sign
    (torch's amin does not define which zero it returns)."""
    assert_same(got[0], want[0], f"packed {what}")
    assert_same(got[2], want[2], f"range {what}")
    z, w = got[1].cpu(), want[1]
    assert z.dtype == w.dtype and z.shape == w.shape, what
    both_zero = (z == 0) & (w == 0)
    assert torch.equal(z.view(torch.int16)[~both_zero], w.view(torch.int16)[~both_zero]), what


def edge_rows() -> torch.Tensor:
    """Rows the codec must get exactly right: constant (bfloat16-exact and not), signed
    zeros, subnormal (fl32(B / range) overflows), a range that overflows, ties, huge."""
    x = torch.zeros(8, 19)
    x[1] = 3.0
    x[2] = -0.1
    x[3, ::2] = -0.0
    x[4] = torch.linspace(1e-39, 4e-39, 19)
    x[5] = torch.linspace(-3.0, 3.0, 19) * 1e38  # max - zero overflows to inf
    x[6] = torch.linspace(-5.0, 7.0, 19)
    x[7] = 1e30
    return x


def non_finite_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows holding NaN / +-Inf (they quantize to level 0 and dequantize to NaN), and
    which rows those are."""
    x = varied_rows(9, 21, seed=5)
    x[1, 4] = float("nan")
    x[2, 0] = float("inf")
    x[3, 20] = -float("inf")
    x[4, :3] = torch.tensor([float("inf"), -float("inf"), float("nan")])
    x[5] = float("nan")
    x[6] = float("inf")  # inf - inf: a NaN range
    bad = torch.tensor([i in (1, 2, 3, 4, 5, 6) for i in range(9)])
    return x, bad


def projection_input(rows: int, d: int) -> torch.Tensor:
    """The input rows of the projection tests for a (rows, d) shape."""
    return varied_rows(rows, d, seed=rows * 7 + d) if d else torch.empty(rows, 0)


@functools.lru_cache(maxsize=64)
def _projected(rows: int, d: int, k: int, seed: int, proj: int) -> torch.Tensor:
    # the reference's signed sums loop over the inputs in Python: computed once per shape
    return projection.project_rows(projection_input(rows, d), k, seed, proj)


def fused_reference(
    rows: int, d: int, k: int, bits: int, rounding: str, seed: int, offset: int, proj: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(project_quantize_rows, dequantize_unproject_rows of it) of projection_input(rows, d)
    by the references."""
    want = ref.quantize_rows(_projected(rows, d, k, seed, proj), bits, rounding, seed, offset)
    back = projection.unproject_rows(ref.dequantize_rows(*want, bits, k), d, seed, proj)
    return want, back


def project_reference(
    rows: int, d: int, k: int, bits: int, rounding: str, seed: int, offset: int, proj: int
) -> tuple[torch.Tensor, ...]:
    """project_quantize_rows of projection_input(rows, d) by the references."""
    return ref.quantize_rows(_projected(rows, d, k, seed, proj), bits, rounding, seed, offset)


def segment_reference(
    x: torch.Tensor, index: torch.Tensor | None, bits: int, seed: int, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment bytes, dequantized rows) of x[index] by the reference row codec: the
    segment is quantize_rows's packed values, then its bfloat16 zeros, then its ranges."""
    rows = x if index is None else x[index]
    packed, zero, rng = ref.quantize_rows(rows, bits, "stochastic", seed, offset)
    segment = torch.cat([packed, zero.view(torch.uint8), rng.view(torch.uint8)])
    if rows.shape[0] == 0:
        segment = segment[:0]
    return segment, ref.dequantize_rows(packed, zero, rng, bits, x.shape[1])
