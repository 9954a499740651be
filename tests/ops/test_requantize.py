"""``torch.ops.qtrain.requantize`` (GCINT's fixed-window int32 -> int8) against its
reference ``qtrain.ops.integer.reference_requantize``, bit for bit, on every device and CPU
variant: every shift, the int32 extremes, rounding ties, empty, all-zero and constant
tensors, odd shapes; opcheck; and every error of its front."""

from __future__ import annotations

import pytest
import torch

from qtrain.ops.integer import MAX_SHIFT, reference_requantize
from tests.ops.support import (
    DEVICES,
    ErrorCase,
    assert_same,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)

EXTREMES = [0, 1, -1, 63, 64, -64, 127, 128, -128, 2**24 - 1, 2**31 - 1, -(2**31), -(2**31) + 1]


def spread_int32(n: int, seed: int) -> torch.Tensor:
    """int32 values whose magnitudes spread over every bit position, both signs."""
    g = gen(seed)
    bits = torch.randint(0, 32, (n,), generator=g)
    mags = torch.randint(0, 2**31 - 1, (n,), generator=g, dtype=torch.int64) >> (31 - bits)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    return (mags * sign).to(torch.int32)


def _check(device: str, x: torch.Tensor, shift: int, what: str) -> None:
    ops = library(device)
    want = reference_requantize(x, shift)
    for variant in variants(device):
        assert_same(ops.requantize(x.to(device), shift), want, f"{what}, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shift", range(MAX_SHIFT + 1))
def test_every_shift(device: str, shift: int) -> None:
    x = torch.cat([torch.tensor(EXTREMES, dtype=torch.int32), spread_int32(70_001, shift)])
    _check(device, x, shift, f"shift {shift}")
    if shift:  # ties: exactly half a step rounds away from zero, both signs
        half = torch.tensor([1, 3, 5], dtype=torch.int64) << (shift - 1)
        ties = torch.cat([half, -half]).clamp(-(2**31), 2**31 - 1).to(torch.int32)
        _check(device, ties, shift, f"ties at {shift}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0,), (0, 5), (1,), (3, 5, 7), (129, 33)])
@pytest.mark.parametrize("fill", [None, 0, 1000, -(2**31)])
def test_shapes_and_constants(device: str, shape: tuple[int, ...], fill: int | None) -> None:
    n = 1
    for s in shape:
        n *= s
    x = (
        spread_int32(n, 4).view(shape)
        if fill is None
        else torch.full(shape, fill, dtype=torch.int32)
    )
    _check(device, x, 7, f"{shape}, fill {fill}")


@pytest.mark.parametrize("device", DEVICES)
def test_strided_input(device: str) -> None:
    x = spread_int32(600, 9).view(20, 30)
    _check(device, x.t(), 5, "transposed")
    _check(device, x[:, ::3], 5, "every third column")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for x in (spread_int32(40, 1).view(8, 5), torch.zeros(0, 3, dtype=torch.int32)):
        opcheck(ops.requantize.default, (x.to(device), 7))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    fn = "qtrain::requantize"
    setup = "x = torch.ones(4, 3, dtype=torch.int32).to(dev)\n"
    cases = [
        ErrorCase(
            "float",
            "ops.requantize(x.float(), 7)",
            "TypeError",
            f"{fn}: x must be int32, got float32",
        ),
        ErrorCase(
            "int64", "ops.requantize(x.long(), 7)", "TypeError", "x must be int32, got int64"
        ),
        ErrorCase(
            "shift 26",
            "ops.requantize(x, 26)",
            "ValueError",
            f"{fn}: shift must be an integer in 0..25, got 26",
        ),
        ErrorCase("shift -1", "ops.requantize(x, -1)", "ValueError", "got -1"),
        ErrorCase("sparse", "ops.requantize(x.to_sparse(), 7)", "ValueError", "x must be a dense"),
    ]
    expect_errors(cases, device, setup)
