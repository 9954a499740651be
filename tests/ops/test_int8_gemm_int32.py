"""``torch.ops.qtrain.int8_gemm_int32`` (GCINT's dense product) against its reference
``qtrain.ops.integer.reference_int_gemm``, bit for bit, on every device and CPU variant:
random operands, every layout, odd widths, empty and constant operands, strided inputs,
saturation past int32; opcheck; and every error of its front."""

from __future__ import annotations

import pytest
import torch

from qtrain.ops.integer import reference_int_gemm
from tests.ops.support import (
    DEVICES,
    WIDTHS,
    ErrorCase,
    assert_same,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)

LAYOUTS = ("nn", "nt", "tn")


def _stored(m: int, k: int, n: int, layout: str, seed: int, low: int = -128, high: int = 128):
    """qa, qb as ``layout`` stores them for an [m, k] @ [k, n] product."""
    g = gen(seed)
    qa = torch.randint(low, high, (k, m) if layout == "tn" else (m, k), generator=g)
    qb = torch.randint(low, high, (n, k) if layout == "nt" else (k, n), generator=g)
    return qa.to(torch.int8), qb.to(torch.int8)


def _check(device: str, qa: torch.Tensor, qb: torch.Tensor, layout: str, what: str) -> None:
    ops = library(device)
    want = reference_int_gemm(qa, qb, layout)
    for variant in variants(device):
        got = ops.int8_gemm_int32(qa.to(device), qb.to(device), layout)
        assert_same(got, want, f"{what}, {layout}, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("width", WIDTHS)
def test_random_operands(device: str, layout: str, width: int) -> None:
    qa, qb = _stored(37, width, 19, layout, width)
    _check(device, qa, qb, layout, f"K = {width}")
    qa, qb = _stored(70, 45, width, layout, width + 100)
    _check(device, qa, qb, layout, f"N = {width}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("m", "k", "n"), [(0, 4, 3), (4, 0, 3), (4, 3, 0), (1, 1, 1), (0, 0, 0)])
def test_edge_shapes(device: str, layout: str, m: int, k: int, n: int) -> None:
    qa, qb = _stored(m, k, n, layout, 3)
    _check(device, qa, qb, layout, f"[{m}, {k}] @ [{k}, {n}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("value", [0, 127, -128])
def test_constant_operands(device: str, layout: str, value: int) -> None:
    qa, qb = _stored(13, 2000, 9, layout, 0, value, value + 1)
    _check(device, qa, qb, layout, f"all {value}")


@pytest.mark.parametrize("device", DEVICES)
def test_tall_product_and_long_inner_dimension(device: str) -> None:
    """The shapes of GCINT's layers: X [nodes, features] @ W, and X^T @ T (K = nodes)."""
    qa, qb = _stored(3000, 67, 16, "nn", 5)
    _check(device, qa, qb, "nn", "X @ W")
    qa, qb = _stored(16, 9000, 7, "tn", 6)
    _check(device, qa, qb, "tn", "X^T @ T")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_saturates_past_int32(device: str, layout: str) -> None:
    """131072 terms of (-128)(-128) sum to 2^31: one past int32, so it saturates."""
    k = 131_072
    qa, qb = _stored(2, k, 3, layout, 0, -128, -127)
    got = library(device).int8_gemm_int32(qa.to(device), qb.to(device), layout).cpu()
    assert got.unique().tolist() == [2**31 - 1]
    qa, qb = _stored(2, k, 3, layout, 0, -128, -127)
    qb = -(qb.to(torch.int16) + 1).to(torch.int8)  # 127: the sum -128 * 127 * k fits
    _check(device, qa, qb, layout, "a sum that fits")


@pytest.mark.parametrize("device", DEVICES)
def test_strided_operands(device: str) -> None:
    qa, qb = _stored(20, 30, 12, "nn", 8)
    _check(device, qa.t().contiguous().t(), qb[:, ::2], "nn", "strided")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for layout in LAYOUTS:
        for m, k, n in [(5, 7, 3), (0, 4, 2), (3, 0, 2)]:
            qa, qb = _stored(m, k, n, layout, 1)
            opcheck(ops.int8_gemm_int32.default, (qa.to(device), qb.to(device), layout))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    fn = "qtrain::int8_gemm_int32"
    setup = """
a = torch.randint(-127, 128, (4, 3), dtype=torch.int8).to(dev)
b = torch.randint(-127, 128, (3, 5), dtype=torch.int8).to(dev)
"""
    cases = [
        ErrorCase(
            "qa float",
            "ops.int8_gemm_int32(a.float(), b, 'nn')",
            "TypeError",
            f"{fn}: qa must be int8, got float32",
        ),
        ErrorCase(
            "qb int32",
            "ops.int8_gemm_int32(a, b.int(), 'nn')",
            "TypeError",
            "qb must be int8, got int32",
        ),
        ErrorCase("qa 1-d", "ops.int8_gemm_int32(a[0], b, 'nn')", "ValueError", "qa must be 2-d"),
        ErrorCase(
            "sparse",
            "ops.int8_gemm_int32(a.to_sparse(), b, 'nn')",
            "ValueError",
            "qa must be a dense",
        ),
        ErrorCase(
            "layout",
            "ops.int8_gemm_int32(a, b, 'tt')",
            "ValueError",
            "layout must be one of 'nn', 'nt', 'tn', got 'tt'",
        ),
        ErrorCase(
            "inner",
            "ops.int8_gemm_int32(a, b, 'nt')",
            "ValueError",
            "inner dimensions differ for layout 'nt'",
        ),
        ErrorCase("devices", "ops.int8_gemm_int32(a, b.to(other), 'nn')", "ValueError", "qb is on"),
    ]
    expect_errors(cases, device, setup)
