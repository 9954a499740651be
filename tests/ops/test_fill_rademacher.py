"""torch.ops.qtrain.fill_rademacher on every device against its reference
(qtrain.quant.projection.rademacher), bit for bit: counters across 2^32, seeds of all 64
bits, every ISA variant and 1 / 2 threads on the CPU. It fills a [d, k] tensor the
caller allocated (which is how the dispatcher routes it)."""

from __future__ import annotations

import pytest
import torch
from compress_cases import STREAMS
from support import DEVICES, ErrorCase, assert_same, expect_errors, library, opcheck, variants

from qtrain.quant import projection
from qtrain.quant.rng import op_seed

SHAPES = ((1, 1), (3, 5), (17, 4), (256, 32), (0, 4), (1200, 600))


def _fill(device: str, d: int, k: int, seed: int, offset: int) -> torch.Tensor:
    out = torch.empty(d, k, device=device)
    library(device).fill_rademacher(out, op_seed(seed), offset)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(device: str) -> None:
    for seed, offset in STREAMS:
        for d, k in SHAPES:
            want = projection.rademacher(d, k, seed, offset)
            assert_same(_fill(device, d, k, seed, offset), want, f"{d} x {k}, {seed}, {offset}")


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    want = projection.rademacher(1200, 600, -1, 2**32 - 100_000)
    for what in variants("cpu"):
        assert_same(_fill("cpu", 1200, 600, -1, 2**32 - 100_000), want, what)
        assert_same(_fill("cpu", 17, 4, 3, 5), projection.rademacher(17, 4, 3, 5), what)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for args in (
        (torch.empty(7, 3, device=device), 3, 2**32 - 4),
        (torch.empty(0, 5, device=device), -1, 0),
    ):
        opcheck(ops.fill_rademacher.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    expect_errors(
        [
            ErrorCase(
                "float64",
                "ops.fill_rademacher(torch.empty(3, 3, device=dev, dtype=torch.float64))",
                "TypeError",
                "out must be float32, got float64",
            ),
            ErrorCase(
                "1-d", "ops.fill_rademacher(torch.empty(9, device=dev))", "ValueError", "2-d"
            ),
            ErrorCase(
                "k 0", "ops.fill_rademacher(torch.empty(3, 0, device=dev))", "ValueError", "k >= 1"
            ),
            ErrorCase(
                "non-contiguous",
                "ops.fill_rademacher(torch.empty(4, 5, device=dev).t())",
                "ValueError",
                "contiguous",
            ),
            ErrorCase(
                "negative offset",
                "ops.fill_rademacher(torch.empty(3, 3, device=dev), 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                "ops.fill_rademacher(torch.empty(3, 3, device=dev), 0, 2**63 - 5)",
                "ValueError",
                r"2\^63",
            ),
            ErrorCase(
                "sparse",
                "ops.fill_rademacher(torch.eye(3, device=dev).to_sparse())",
                "ValueError",
                "dense",
            ),
        ],
        device,
    )
