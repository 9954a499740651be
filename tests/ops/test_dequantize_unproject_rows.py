"""torch.ops.qtrain.dequantize_unproject_rows on every device against its reference
(qtrain.quant.rowwise.dequantize_rows, then qtrain.quant.projection.unproject_rows),
bit for bit, on the reference's quantized projections: the shapes of
test_project_quantize_rows (k > 1024: CUDA's unfused path), packed streams at odd
addresses, zero / constant / non-finite rows, every ISA variant and 1 / 2 threads on
the CPU."""

from __future__ import annotations

import pytest
import torch
from compress_cases import (
    BITS,
    PROJECTION_SHAPES,
    ROUNDINGS,
    STREAMS,
    fused_reference,
    misaligned,
)
from conftest import varied_rows
from support import DEVICES, ErrorCase, assert_same, expect_errors, library, opcheck, variants

from qtrain.quant import projection
from qtrain.quant import rowwise as ref
from qtrain.quant.rng import op_seed


def _reference(
    x: torch.Tensor, k: int, bits: int, rounding: str, seed: int, offset: int, proj: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(project_quantize_rows of x, dequantize_unproject_rows of that) by the references."""
    q = ref.quantize_rows(projection.project_rows(x, k, seed, proj), bits, rounding, seed, offset)
    back = projection.unproject_rows(ref.dequantize_rows(*q, bits, k), x.shape[1], seed, proj)
    return q, back


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_reference(device: str, bits: int, rounding: str) -> None:
    ops = library(device)
    for rows, d, k in PROJECTION_SHAPES:
        # the reference's back-projection loops over k in Python: one stream for large ones
        for seed, offset in STREAMS[:2] if d * k < 50_000 else STREAMS[1:2]:
            proj = offset // 3
            q, back = fused_reference(rows, d, k, bits, rounding, seed, offset, proj)
            zero, rng = q[1].to(device), q[2].to(device)
            for packed in (
                q[0].to(device),
                misaligned(q[0], device) if q[0].numel() else q[0].to(device),
            ):
                got = ops.dequantize_unproject_rows(
                    packed, zero, rng, bits, k, d, op_seed(seed), proj
                )
                assert got.device.type == torch.device(device).type
                assert_same(got, back, f"{rows} x {d} -> {k}, seed={seed}")


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    ops = library("cpu")
    x = varied_rows(3001, 129, seed=4)
    for bits in (1, 2):
        q, back = _reference(x, 17, bits, "stochastic", 9, 2**32 - 30_001, 77)
        for what in variants("cpu"):
            got = ops.dequantize_unproject_rows(*q, bits, 17, 129, 9, 77)
            assert_same(got, back, f"{what}, bits={bits}")
            for rows, d, k in PROJECTION_SHAPES[:8]:
                qs, bs = fused_reference(rows, d, k, bits, "nearest", 1, 0, 5)
                got = ops.dequantize_unproject_rows(*qs, bits, k, d, 1, 5)
                assert_same(got, bs, f"{what}, {rows} x {d} -> {k}, bits={bits}")


@pytest.mark.parametrize("device", DEVICES)
def test_zero_constant_and_non_finite_rows(device: str) -> None:
    ops = library(device)
    x = torch.zeros(6, 40)
    x[1] = 3.0
    x[2, ::3] = -0.0
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    x[5] = torch.linspace(-2.0, 2.0, 40)
    finite = torch.tensor([True, True, True, False, False, True])
    q, back = _reference(x, 8, 2, "stochastic", 1, 0, 0)
    assert torch.equal(back[0], torch.zeros(40))  # a zero row projects and comes back as zeros
    got = ops.dequantize_unproject_rows(*(t.to(device) for t in q), 2, 8, 40, 1, 0).cpu()
    assert_same(got[finite], back[finite])
    assert bool(got[~finite].isnan().all()) and bool(back[~finite].isnan().all())


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for rows, d, k, bits in ((13, 20, 3, 4), (5, 17, 7, 1), (0, 16, 4, 2)):
        q, _ = fused_reference(rows, d, k, bits, "nearest", 1, 0, 5)
        opcheck(
            ops.dequantize_unproject_rows.default, (*(t.to(device) for t in q), bits, k, d, -1, 5)
        )


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    setup = "p, z, r = ops.project_quantize_rows(torch.randn(4, 6, device=dev), 3, 2); "

    expect_errors(
        [
            ErrorCase(
                "bits 3",
                "ops.dequantize_unproject_rows(p, z, r, 3, 3, 6)",
                "ValueError",
                "1, 2, 4, 8",
            ),
            ErrorCase(
                "k 0", "ops.dequantize_unproject_rows(p, z, r, 2, 0, 6)", "ValueError", "k >= 1"
            ),
            ErrorCase(
                "d -1", "ops.dequantize_unproject_rows(p, z, r, 2, 3, -1)", "ValueError", "d >= 0"
            ),
            ErrorCase(
                "huge matrix",
                "ops.dequantize_unproject_rows(p, z, r, 2, 2**20, 2**21)",
                "ValueError",
                "projection matrix is too large",
            ),
            ErrorCase(
                "short packed",
                "ops.dequantize_unproject_rows(p[:1], z, r, 2, 3, 6)",
                "ValueError",
                "need",
            ),
            ErrorCase(
                "int32 packed",
                "ops.dequantize_unproject_rows(p.int(), z, r, 2, 3, 6)",
                "TypeError",
                "1-d uint8",
            ),
            ErrorCase(
                "float zero",
                "ops.dequantize_unproject_rows(p, z.float(), r, 2, 3, 6)",
                "TypeError",
                "bfloat16",
            ),
            ErrorCase(
                "too many values",
                "ops.dequantize_unproject_rows(p[:1].expand(2**40), z[:1].expand(2**40), "
                "r[:1].expand(2**40), 8, 1, 2**21)",
                "ValueError",
                "rows \\* d too large",
            ),
            ErrorCase(
                "negative projection offset",
                "ops.dequantize_unproject_rows(p, z, r, 2, 3, 6, 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                "ops.dequantize_unproject_rows(p, z, r, 2, 3, 6, 0, 2**63 - 5)",
                "ValueError",
                r"2\^63",
            ),
            ErrorCase(
                "zero elsewhere",
                "ops.dequantize_unproject_rows(p, z.to(other), r, 2, 3, 6)",
                "ValueError",
                "zero is on",
            ),
        ],
        device,
        setup,
    )
