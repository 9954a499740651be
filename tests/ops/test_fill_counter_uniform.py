"""torch.ops.qtrain.fill_counter_uniform on every device against its reference
(qtrain.quant.rng.counter_uniform), bit for bit."""

from __future__ import annotations

import pytest
import torch
from support import DEVICES, ErrorCase, assert_same, expect_errors, library, opcheck

from qtrain.quant.rng import counter_uniform, op_seed

CASES = ((0, 0), (5, 3), (7, 2**32 - 3), (2**40 + 1, 123), (2**64 - 1, 2**32 - 70_000))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, 5, 1001, 140_001])
def test_matches_reference(device: str, n: int, threads: None) -> None:
    ops = library(device)
    for seed, offset in CASES:
        for t in (1, 2):
            torch.set_num_threads(t)
            out = torch.empty(n, device=device)
            ops.fill_counter_uniform(out, op_seed(seed), offset)
            assert_same(out, counter_uniform(n, seed, offset), f"seed={seed}, offset={offset}")


@pytest.mark.parametrize("device", DEVICES)
def test_fills_any_shape_and_unaligned_views(device: str) -> None:
    ops = library(device)
    out = torch.empty(3, 5, 7, device=device)
    ops.fill_counter_uniform(out, 9, 4)
    assert_same(out, counter_uniform(105, 9, 4).reshape(3, 5, 7))
    base = torch.empty(1001, device=device)
    ops.fill_counter_uniform(base[1:], 2, 0)  # not 16-byte aligned: the scalar path
    assert_same(base[1:], counter_uniform(1000, 2, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    opcheck(ops.fill_counter_uniform.default, (torch.empty(17, device=device), 3, 2**32 - 4))
    opcheck(ops.fill_counter_uniform.default, (torch.empty(0, device=device), -1, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    expect_errors(
        [
            ErrorCase(
                "float64",
                "ops.fill_counter_uniform(torch.empty(3, device=dev, dtype=torch.float64))",
                "TypeError",
                "out must be float32, got float64",
            ),
            ErrorCase(
                "non-contiguous",
                "ops.fill_counter_uniform(torch.empty(4, 4, device=dev).t())",
                "ValueError",
                "contiguous",
            ),
            ErrorCase(
                "negative offset",
                "ops.fill_counter_uniform(torch.empty(3, device=dev), 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                "ops.fill_counter_uniform(torch.empty(9, device=dev), 0, 2**63 - 5)",
                "ValueError",
                "2\\^63",
            ),
        ],
        device,
    )
