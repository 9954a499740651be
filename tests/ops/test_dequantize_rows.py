"""torch.ops.qtrain.dequantize_rows on every device against its reference
(qtrain.quant.rowwise.dequantize_rows), bit for bit, on the reference's quantized rows:
widths that share bytes, many tiles, wide rows, packed streams at odd addresses, edge
and non-finite rows, every ISA variant and 1 / 2 threads on the CPU."""

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


def _quantized(x: torch.Tensor, bits: int, rounding: str, seed: int, offset: int) -> tuple:
    return ref.quantize_rows(x, bits, rounding, seed, offset)


def _check(q: tuple, device: str, bits: int, width: int, what: str = "") -> None:
    ops = library(device)
    got = ops.dequantize_rows(*(t.to(device) for t in q), bits, width)
    assert got.device.type == torch.device(device).type
    assert_same(got, ref.dequantize_rows(*q, bits, width), what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_matches_reference(device: str, bits: int) -> None:
    for width in (*WIDTHS, 256):
        for rows in (0, 1, 37):
            x = varied_rows(rows, width, seed=width * 100 + rows)
            for rounding in ROUNDINGS:
                for seed, offset in STREAMS[:2]:
                    q = _quantized(x, bits, rounding, seed, offset)
                    _check(q, device, bits, width, f"{rows} x {width} {rounding} {seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_many_rows_wide_rows_and_odd_addresses(device: str, bits: int) -> None:
    for rows, width in ((5000, 129), (3000, 1), (40, 1025), (9, 4099)):
        q = _quantized(varied_rows(rows, width, seed=rows + bits), bits, "stochastic", 9, 0)
        _check(q, device, bits, width, f"{rows} x {width}")
    # a packed stream that starts at an odd address (byte loads), and a longer one
    q = _quantized(varied_rows(21, 19, seed=1), bits, "stochastic", 2, 0)
    want = ref.dequantize_rows(*q, bits, 19)
    ops = library(device)
    odd = misaligned(q[0], device)
    assert_same(ops.dequantize_rows(odd, q[1].to(device), q[2].to(device), bits, 19), want)
    longer = torch.cat([q[0], torch.full((5,), 255, dtype=torch.uint8)]).to(device)
    assert_same(ops.dequantize_rows(longer, q[1].to(device), q[2].to(device), bits, 19), want)


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    ops = library("cpu")
    x = varied_rows(4201, 129, seed=3)
    for bits in BITS:
        q = _quantized(x, bits, "stochastic", 9, 2**32 - 300_001)
        want = ref.dequantize_rows(*q, bits, 129)
        for what in variants("cpu"):
            assert_same(ops.dequantize_rows(*q, bits, 129), want, f"{what}, bits={bits}")


@pytest.mark.parametrize("device", DEVICES)
def test_edge_and_non_finite_rows(device: str) -> None:
    ops = library(device)
    x = edge_rows()
    for bits in BITS:
        for rounding in ROUNDINGS:
            q = _quantized(x, bits, rounding, 3, 0)
            got = ops.dequantize_rows(*(t.to(device) for t in q), bits, 19).cpu()
            want = ref.dequantize_rows(*q, bits, 19)
            # row 5 dequantizes with step = inf (q * inf is NaN, its sign the hardware's)
            assert_same(got[:5], want[:5], f"bits={bits} {rounding}")
            assert_same(got[6:], want[6:], f"bits={bits} {rounding}")
    x, bad = non_finite_rows()
    for bits in BITS:
        q = _quantized(x, bits, "stochastic", 3, 0)
        got = ops.dequantize_rows(*(t.to(device) for t in q), bits, 21).cpu()
        want = ref.dequantize_rows(*q, bits, 21)
        assert bool(got[bad].isnan().all()) and bool(want[bad].isnan().all())
        assert_same(got[~bad], want[~bad], f"bits={bits}")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device: str) -> None:
    ops = library(device)
    for rows, width in ((0, 5), (5, 0), (0, 0)):
        for bits in BITS:
            q = ref.quantize_rows(torch.empty(rows, width), bits)
            got = ops.dequantize_rows(*(t.to(device) for t in q), bits, width)
            assert got.device.type == torch.device(device).type
            assert_same(got, ref.dequantize_rows(*q, bits, width))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for rows, width, bits in ((33, 5, 2), (7, 17, 8), (0, 4, 1)):
        q = [
            t.to(device)
            for t in _quantized(varied_rows(rows, width, seed=1), bits, "nearest", 0, 0)
        ]
        opcheck(ops.dequantize_rows.default, (*q, bits, width))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    setup = "p, z, r = ops.quantize_rows(torch.randn(4, 3, device=dev), 4); "

    expect_errors(
        [
            ErrorCase("bits 3", "ops.dequantize_rows(p, z, r, 3, 3)", "ValueError", "1, 2, 4, 8"),
            ErrorCase(
                "float zero", "ops.dequantize_rows(p, z.float(), r, 4, 3)", "TypeError", "bfloat16"
            ),
            ErrorCase(
                "short range", "ops.dequantize_rows(p, z, r[:2], 4, 3)", "TypeError", "one shape"
            ),
            ErrorCase(
                "2-d zero",
                "ops.dequantize_rows(p, z[None], r[None], 4, 3)",
                "TypeError",
                r"one shape \[rows\]",
            ),
            ErrorCase(
                "int32 packed", "ops.dequantize_rows(p.int(), z, r, 4, 3)", "TypeError", "1-d uint8"
            ),
            ErrorCase(
                "2-d packed", "ops.dequantize_rows(p[None], z, r, 4, 3)", "TypeError", "1-d uint8"
            ),
            ErrorCase(
                "short packed", "ops.dequantize_rows(p[:-1], z, r, 4, 3)", "ValueError", "need"
            ),
            ErrorCase(
                "negative width",
                "ops.dequantize_rows(p, z, r, 4, -1)",
                "ValueError",
                "width must be >= 0",
            ),
            ErrorCase(
                "too many values",
                "ops.dequantize_rows(p, z[:1].expand(2**40), r[:1].expand(2**40), 4, 2**30)",
                "ValueError",
                "rows \\* width too large",
            ),
            ErrorCase(
                "zero elsewhere",
                "ops.dequantize_rows(p, z.to(other), r, 4, 3)",
                "ValueError",
                "zero is on",
            ),
            ErrorCase(
                "range elsewhere",
                "ops.dequantize_rows(p, z, r.to(other), 4, 3)",
                "ValueError",
                "range is on",
            ),
            ErrorCase(
                "sparse zero",
                "ops.dequantize_rows(p, z.to_sparse(), r, 4, 3)",
                "ValueError",
                "dense",
            ),
        ],
        device,
        setup,
    )
