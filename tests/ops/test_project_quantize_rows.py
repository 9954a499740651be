"""torch.ops.qtrain.project_quantize_rows on every device against its reference
(qtrain.quant.projection.project_rows, then qtrain.quant.rowwise.quantize_rows), bit for
bit: odd widths, k above d, 1 x 1, no rows, no input columns, several tiles and x
stages (CUDA), k > 1024 (CUDA's unfused path), misaligned inputs, zero / constant /
non-finite rows, every ISA variant and 1 / 2 threads on the CPU."""

from __future__ import annotations

import pytest
import torch
from compress_cases import (
    BITS,
    PROJECTION_SHAPES,
    ROUNDINGS,
    STREAMS,
    misaligned,
    project_reference,
    projection_input,
    same_quantized,
)
from conftest import varied_rows
from support import DEVICES, ErrorCase, assert_same, expect_errors, library, opcheck, variants

from qtrain.quant import projection
from qtrain.quant import rowwise as ref
from qtrain.quant.rng import op_seed


def _reference(
    x: torch.Tensor, k: int, bits: int, rounding: str, seed: int, offset: int, proj: int
) -> tuple[torch.Tensor, ...]:
    y = projection.project_rows(x, k, seed, proj)
    return ref.quantize_rows(y, bits, rounding, seed, offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_reference(device: str, bits: int, rounding: str) -> None:
    ops = library(device)
    for rows, d, k in PROJECTION_SHAPES:
        x = projection_input(rows, d)
        for seed, offset in STREAMS[:2]:
            proj = offset // 3
            want = project_reference(rows, d, k, bits, rounding, seed, offset, proj)
            inputs = [x.to(device)] + ([misaligned(x, device)] if rows * d > 0 else [])
            for xd in inputs:
                got = ops.project_quantize_rows(
                    xd, k, bits, rounding == "stochastic", op_seed(seed), offset, proj
                )
                assert all(t.device.type == torch.device(device).type for t in got)
                same_quantized(got, want, f"{rows} x {d} -> {k}, seed={seed}, {xd.data_ptr() % 16}")


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    """Enough rows that two threads split them (k = 17: blocks of 8 rows)."""
    ops = library("cpu")
    x = varied_rows(3001, 129, seed=4)
    for bits in (1, 2):
        want = _reference(x, 17, bits, "stochastic", 9, 2**32 - 30_001, 77)
        for what in variants("cpu"):
            got = ops.project_quantize_rows(x, 17, bits, True, 9, 2**32 - 30_001, 77)
            same_quantized(got, want, f"{what}, bits={bits}")
        # the small shapes on every variant
        for what in variants("cpu"):
            for rows, d, k in PROJECTION_SHAPES[:8]:
                xs = projection_input(rows, d)
                w = project_reference(rows, d, k, bits, "nearest", 1, 0, 5)
                got = ops.project_quantize_rows(xs, k, bits, False, 1, 0, 5)
                same_quantized(got, w, f"{what}, {rows} x {d} -> {k}, bits={bits}")


@pytest.mark.parametrize("device", DEVICES)
def test_zero_constant_and_non_finite_rows(device: str) -> None:
    ops = library(device)
    x = torch.zeros(6, 40)
    x[1] = 3.0
    x[2, ::3] = -0.0
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    x[5] = torch.linspace(-2.0, 2.0, 40)
    want = _reference(x, 8, 2, "stochastic", 1, 0, 0)
    got = ops.project_quantize_rows(x.to(device), 8, 2, True, 1, 0, 0)
    assert_same(got[0], want[0])
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = varied_rows(13, 20, seed=1).to(device)
    for args in (
        (x, 3, 4, True, 1, 0, 5),
        (x.t(), 7, 1, False, -1, 3, 0),
        (x[:0], 4, 2, True, 0, 0, 0),
    ):
        opcheck(ops.project_quantize_rows.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    x = "torch.randn(4, 6, device=dev)"
    expect_errors(
        [
            ErrorCase(
                "bits 3", f"ops.project_quantize_rows({x}, 2, 3)", "ValueError", "1, 2, 4, 8"
            ),
            ErrorCase(
                "float64",
                f"ops.project_quantize_rows({x}.double(), 2, 2)",
                "TypeError",
                "2-d float32",
            ),
            ErrorCase(
                "1-d",
                f"ops.project_quantize_rows({x}.reshape(-1), 2, 2)",
                "TypeError",
                "2-d float32",
            ),
            ErrorCase(
                "sparse",
                "ops.project_quantize_rows(torch.eye(3, device=dev).to_sparse(), 2, 2)",
                "ValueError",
                "dense",
            ),
            ErrorCase("k 0", f"ops.project_quantize_rows({x}, 0, 2)", "ValueError", "k >= 1"),
            ErrorCase(
                "huge matrix",
                "ops.project_quantize_rows(torch.zeros(1, 1, device=dev).expand(1, 2**21), 2**20, 2)",
                "ValueError",
                "projection matrix is too large",
            ),
            ErrorCase(
                "too many values",
                "ops.project_quantize_rows(torch.zeros(1, 1, device=dev).expand(2**40, 3), 2**21, 2)",
                "ValueError",
                "rows \\* k too large",
            ),
            ErrorCase(
                "negative offset",
                f"ops.project_quantize_rows({x}, 2, 2, True, 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "negative projection offset",
                f"ops.project_quantize_rows({x}, 2, 2, True, 0, 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                f"ops.project_quantize_rows({x}, 2, 2, True, 0, 2**63 - 5)",
                "ValueError",
                r"2\^63",
            ),
            ErrorCase(
                "projection counter overflow",
                f"ops.project_quantize_rows({x}, 2, 2, True, 0, 0, 2**63 - 5)",
                "ValueError",
                r"2\^63",
            ),
        ],
        device,
    )
