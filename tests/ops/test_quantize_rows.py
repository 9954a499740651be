"""torch.ops.qtrain.quantize_rows on every device against its reference
(qtrain.quant.rowwise.quantize_rows), bit for bit: packed bytes, bfloat16 zero points and
ranges. Shapes cover widths that are not multiples of the pack factor (rows share
bytes), wide rows (CUDA: one block per row), tiles of many rows, misaligned and strided
inputs, counters that cross 2^32, every ISA variant and 1 / 2 threads on the CPU."""

from __future__ import annotations

import pytest
import torch
from compress_cases import (
    BITS,
    ROUNDINGS,
    STREAMS,
    edge_rows,
    misaligned,
    non_finite_rows,
    same_quantized,
    varied_rows,
)
from support import (
    DEVICES,
    WIDTHS,
    ErrorCase,
    assert_same,
    expect_errors,
    library,
    opcheck,
    variants,
)

from qtrain.quant import rowwise as ref
from qtrain.quant.rng import op_seed


def _check(x: torch.Tensor, device: str, bits: int, rounding: str, seed: int, offset: int) -> None:
    """quantize_rows of x on ``device`` (x may already be there) == the reference on its
    CPU copy; the op's dequantize_rows == the reference's."""
    ops = library(device)
    want = ref.quantize_rows(x.cpu(), bits, rounding, seed, offset)
    got = ops.quantize_rows(x.to(device), bits, rounding == "stochastic", op_seed(seed), offset)
    assert all(t.device.type == torch.device(device).type for t in got)
    what = f"{tuple(x.shape)} bits={bits} {rounding} seed={seed} offset={offset}"
    same_quantized(got, want, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_reference(device: str, bits: int, rounding: str) -> None:
    for width in (*WIDTHS, 256):
        for rows in (0, 1, 37):
            x = varied_rows(rows, width, seed=width * 100 + rows)
            for seed, offset in STREAMS:
                _check(x, device, bits, rounding, seed, offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_many_tiles_and_wide_rows(device: str, bits: int) -> None:
    """Enough rows for many CUDA blocks and tiles (up to 1024 rows per tile), rows wider
    than 1024 (a whole block reduces each row), odd widths (tiles of 8 rows)."""
    for rows, width in ((5000, 129), (3000, 1), (2600, 3), (700, 20), (40, 1025), (9, 4099)):
        x = varied_rows(rows, width, seed=rows + width + bits)
        for rounding in ROUNDINGS:
            _check(x, device, bits, rounding, 9, 2**32 - 300_001)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_misaligned_and_strided_inputs(device: str, bits: int) -> None:
    for rows, width in ((37, 128), (9, 4096), (33, 17)):
        x = varied_rows(rows, width, seed=width)
        for rounding in ROUNDINGS:
            _check(misaligned(x, device), device, bits, rounding, 3, 7)
            _check(x.t().contiguous().to(device).t(), device, bits, rounding, 3, 7)


@pytest.mark.parametrize("bits", BITS)
def test_cpu_same_for_any_thread_count_and_isa(bits: int, threads: None) -> None:
    """Enough elements that two threads really split the rows (width 129: blocks of 8 rows)."""
    ops = library("cpu")
    x = varied_rows(4201, 129, seed=bits)
    for rounding in ROUNDINGS:
        want = ref.quantize_rows(x, bits, rounding, 9, 2**32 - 300_001)
        for what in variants("cpu"):
            got = ops.quantize_rows(x, bits, rounding == "stochastic", 9, 2**32 - 300_001)
            same_quantized(got, want, f"{what}, {rounding}")


@pytest.mark.parametrize("device", DEVICES)
def test_edge_rows(device: str) -> None:
    """Constant, signed-zero, subnormal, overflowing and tie rows; each ISA on the CPU."""
    x = edge_rows()
    noncontig = torch.randn(19, 8, generator=torch.Generator().manual_seed(0)).t()
    for _ in variants(device):
        for bits in BITS:
            for rounding in ROUNDINGS:
                _check(x, device, bits, rounding, 3, 0)
                _check(noncontig, device, bits, rounding, 3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_rows_quantize_to_level_zero(device: str) -> None:
    """x should be finite; a NaN or Inf must not crash: level 0 and a NaN zero or range
    as the reference (a NaN's sign and payload are the hardware's: compared as values)."""
    ops = library(device)
    x, bad = non_finite_rows()
    for bits in BITS:
        for rounding in ROUNDINGS:
            want = ref.quantize_rows(x, bits, rounding, 3)
            got = ops.quantize_rows(x.to(device), bits, rounding == "stochastic", 3, 0)
            assert_same(got[0], want[0], f"bits={bits} {rounding}")
            q = ref.unpack_bits(got[0].cpu(), bits, x.numel()).reshape(9, 21)
            assert not bool(q[bad].any())
            for g, w in zip(got[1:], want[1:], strict=True):
                torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device: str) -> None:
    ops = library(device)
    for rows, width in ((0, 5), (5, 0), (0, 0)):
        for bits in BITS:
            x = torch.empty(rows, width)
            got = ops.quantize_rows(x.to(device), bits, True, 0, 0)
            for g, w in zip(got, ref.quantize_rows(x, bits), strict=True):
                assert g.device.type == torch.device(device).type
                assert_same(g, w, f"{rows} x {width}, bits={bits}")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = varied_rows(33, 5, seed=2).to(device)
    for args in ((x, 2, True, 3, 7), (x.t(), 8, False, -1, 0), (x[:0], 4, True, 0, 0)):
        opcheck(ops.quantize_rows.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    x = "torch.randn(4, 3, device=dev)"
    expect_errors(
        [
            *(
                ErrorCase(f"bits {b}", f"ops.quantize_rows({x}, {b})", "ValueError", "1, 2, 4, 8")
                for b in (0, 3, 16)
            ),
            ErrorCase(
                "float64",
                f"ops.quantize_rows({x}.double(), 4)",
                "TypeError",
                r"x must be a 2-d float32 tensor \[rows, width\], got float64",
            ),
            ErrorCase("1-d", f"ops.quantize_rows({x}.reshape(-1), 4)", "TypeError", "2-d float32"),
            ErrorCase(
                "sparse",
                "ops.quantize_rows(torch.eye(3, device=dev).to_sparse(), 4)",
                "ValueError",
                "dense",
            ),
            ErrorCase(
                "negative offset",
                f"ops.quantize_rows({x}, 4, True, 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                f"ops.quantize_rows({x}, 4, True, 0, 2**63 - 5)",
                "ValueError",
                r"2\^63",
            ),
            ErrorCase(
                "too many elements",
                "ops.quantize_rows(torch.zeros(1, 1, device=dev).expand(2**31, 2**30), 4)",
                "ValueError",
                r"element count must be in \[0, 2\^60\]",
            ),
        ],
        device,
    )
