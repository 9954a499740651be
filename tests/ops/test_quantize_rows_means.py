"""torch.ops.qtrain.quantize_rows_means on every device against its reference
(qtrain.quant.rowwise.quantize_rows_means), bit for bit: packed bytes, bfloat16 zero points
and ranges, on rows whose float64 sums are exact (the reference's condition for an
order-free result). Widths that are not multiples of 8 (rows share bytes), many rows,
misaligned and strided inputs, constant, zero, signed-zero, subnormal, huge and
non-finite rows, every ISA variant and 1 / 2 threads on the CPU; what dequantize_rows
reads back; the error it saves against stochastic rounding's at 1 bit."""

from __future__ import annotations

import pytest
import torch
from compress_cases import edge_rows, misaligned, non_finite_rows, same_quantized, varied_rows
from support import DEVICES, WIDTHS, ErrorCase, assert_same, expect_errors, library, opcheck
from support import variants as isa_variants

from qtrain.quant import rowwise as ref


def _check(x: torch.Tensor, device: str) -> tuple[torch.Tensor, ...]:
    """quantize_rows_means of x on ``device`` == the reference on its CPU copy."""
    got = library(device).quantize_rows_means(x.to(device))
    assert all(t.device.type == torch.device(device).type for t in got)
    same_quantized(got, ref.quantize_rows_means(x.cpu()), f"{tuple(x.shape)}")
    return got


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(device: str) -> None:
    for width in (*WIDTHS, 64, 256):
        for rows in (0, 1, 37):
            _check(varied_rows(rows, width, seed=width * 100 + rows), device)


@pytest.mark.parametrize("device", DEVICES)
def test_many_rows_and_wide_rows(device: str) -> None:
    """Enough rows for many thread blocks and grid-stride steps; rows wider than a warp's
    32 lanes and than 1024; widths whose rows share bytes."""
    for rows, width in ((5000, 129), (3000, 1), (2600, 3), (700, 20), (40, 1025), (9, 4099)):
        _check(varied_rows(rows, width, seed=rows + width), device)


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_and_strided_inputs(device: str) -> None:
    for rows, width in ((37, 128), (9, 4096), (33, 17)):
        x = varied_rows(rows, width, seed=width)
        _check(misaligned(x, device), device)
        _check(x.t().contiguous().to(device).t(), device)


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    """Enough rows that two threads each take blocks of them, packing up to the byte
    boundary where the next block starts (width 129: rows share bytes)."""
    x = varied_rows(40_001, 129, seed=1)
    want = ref.quantize_rows_means(x)
    for what in isa_variants("cpu"):
        same_quantized(library("cpu").quantize_rows_means(x), want, what)


@pytest.mark.parametrize("device", DEVICES)
def test_edge_rows(device: str) -> None:
    """Constant (bfloat16-exact and not), all-zero, signed-zero, subnormal, huge rows; a
    constant row takes the high level everywhere, which is the value to within
    bfloat16's rounding of the zero point's rounding (range = the remainder)."""
    x = edge_rows()
    packed, zero, rng = _check(x, device)
    bits = ref.unpack_bits(packed.cpu(), 1, x.numel()).reshape(x.shape).bool()
    back = ref.dequantize_rows(packed.cpu(), zero.cpu(), rng.cpu(), 1, x.shape[1])
    for r in (0, 1, 2, 7):  # constant rows: every value >= the mean, no low side
        assert bool(bits[r].all()), r
        torch.testing.assert_close(back[r], x[r], rtol=2.0**-14, atol=0.0)
    assert float(back[0].abs().max()) == 0.0  # all zero: exactly
    _check(torch.randn(19, 8, generator=torch.Generator().manual_seed(0)).t(), device)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_rows_dequantize_to_nan(device: str) -> None:
    """x should be finite; a NaN or Inf must not crash: the reference's levels (NaN where
    a sum is), and a row holding a NaN dequantizes to NaN everywhere."""
    x, bad = non_finite_rows()
    got = library(device).quantize_rows_means(x.to(device))
    want = ref.quantize_rows_means(x)
    assert_same(got[0], want[0], "packed")
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)
    back = ref.dequantize_rows(got[0].cpu(), got[1].cpu(), got[2].cpu(), 1, x.shape[1])
    assert bool(back[1].isnan().all()) and bool(back[5].isnan().all())
    assert bool(back[~bad].isfinite().all())


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device: str) -> None:
    for rows, width in ((0, 5), (5, 0), (0, 0)):
        x = torch.empty(rows, width)
        got = library(device).quantize_rows_means(x.to(device))
        for g, w in zip(got, ref.quantize_rows_means(x), strict=True):
            assert g.device.type == torch.device(device).type
            assert_same(g, w, f"{rows} x {width}")


@pytest.mark.parametrize("device", DEVICES)
def test_dequantized_rows_are_the_side_means(device: str) -> None:
    """What dequantize_rows reads back: each value's side mean, to bfloat16 rounding;
    values at or above the row's mean take the high level."""
    x = varied_rows(50, 33, seed=4)
    packed, zero, rng = library(device).quantize_rows_means(x.to(device))
    back = library(device).dequantize_rows(packed, zero, rng, 1, 33).cpu()
    high = x >= x.double().mean(1, keepdim=True).float()
    for r in range(50):
        for side in (high[r], ~high[r]):
            if side.any():
                want = x[r][side].double().mean().float()
                got = back[r][side]
                assert bool((got == got[0]).all()), f"row {r}: one level per side"
                tol = 2.0**-7 * (x[r].abs().max() + 1e-30)  # two bfloat16 roundings
                assert abs(float(got[0] - want)) <= float(tol), f"row {r}"


def test_error_is_a_fraction_of_stochastic_rounding() -> None:
    """Why the exact plugin's 1 bit uses it: on Gaussian rows of 64 values its squared
    error is under a fifth of stochastic rounding between the row's ends (about a
    twelfth, measured)."""
    x = torch.randn(4000, 64, generator=torch.Generator().manual_seed(0))
    means = ref.dequantize_rows(*ref.quantize_rows_means(x), 1, 64)
    stochastic = ref.dequantize_rows(*ref.quantize_rows(x, 1, "stochastic", 3), 1, 64)
    ratio = float((means - x).square().mean() / (stochastic - x).square().mean())
    assert ratio < 0.2, ratio


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    x = varied_rows(33, 5, seed=2).to(device)
    for args in ((x,), (x.t(),), (x[:0],)):
        opcheck(library(device).quantize_rows_means.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    x = "torch.randn(4, 3, device=dev)"
    expect_errors(
        [
            ErrorCase(
                "float64",
                f"ops.quantize_rows_means({x}.double())",
                "TypeError",
                r"x must be a 2-d float32 tensor \[rows, width\], got float64",
            ),
            ErrorCase(
                "1-d", f"ops.quantize_rows_means({x}.reshape(-1))", "TypeError", "2-d float32"
            ),
            ErrorCase(
                "sparse",
                "ops.quantize_rows_means(torch.eye(3, device=dev).to_sparse())",
                "ValueError",
                "dense",
            ),
            ErrorCase(
                "too many elements",
                "ops.quantize_rows_means(torch.zeros(1, 1, device=dev).expand(2**31, 2**30))",
                "ValueError",
                r"element count must be in \[0, 2\^60\]",
            ),
        ],
        device,
    )
