"""``torch.ops.qtrain.dyq`` (GCINT's DyQ) against its reference
``qtrain.ops.integer.reference_dyq``, bit for bit, window included, on every device and CPU
variant: magnitudes over every range of bit positions, ties between windows, the top window,
empty, all-zero and constant tensors, tensors large enough to split over threads and blocks;
the window stays on the tensor's device; opcheck; and every error of its front."""

from __future__ import annotations

import pytest
import torch

from qtrain.ops.integer import reference_dyq
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


def _magnitudes(n: int, lo: int, hi: int, seed: int) -> torch.Tensor:
    """n int32 values with leading ones at bits lo .. hi - 1, both signs."""
    g = gen(seed)
    bits = torch.randint(lo, hi, (n,), generator=g)
    low = torch.randint(0, 2**31 - 1, (n,), generator=g, dtype=torch.int64)
    mags = (torch.ones(n, dtype=torch.int64) << bits) | (low & ((1 << bits) - 1))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    return (mags * sign).clamp(-(2**31), 2**31 - 1).to(torch.int32)


def _check(device: str, x: torch.Tensor, what: str) -> None:
    ops = library(device)
    want_q, want_shift = reference_dyq(x)
    for variant in variants(device):
        q, shift = ops.dyq(x.to(device))
        assert q.device.type == shift.device.type == torch.device(device).type  # no host trip
        assert shift.dtype == torch.int64 and shift.dim() == 0, f"{what}: shift {shift}"
        assert int(shift) == int(want_shift), (
            f"{what}, {variant}: k {int(shift)} != {int(want_shift)}"
        )
        assert_same(q, want_q, f"{what}, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("lo", "hi"), [(0, 3), (0, 7), (4, 12), (10, 20), (18, 31), (0, 32)])
def test_windows_over_bit_ranges(device: str, lo: int, hi: int) -> None:
    _check(device, _magnitudes(5_000, lo, hi, lo * 32 + hi), f"bits {lo}..{hi - 1}")


@pytest.mark.parametrize("device", DEVICES)
def test_large_tensor_split_over_threads(device: str) -> None:
    x = torch.cat([_magnitudes(300_000, 3, 14, 1), _magnitudes(200_000, 12, 25, 2)])
    _check(device, x.view(500, 1000), "500k values")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "values",
    [
        [],
        [0, 0, 0],
        [5, 5, 5, 5],  # constant
        [2**20 + 3] * 7,  # windows 14..20 tie: the lowest wins
        [-(2**31), 2**31 - 1],  # only the top window reaches bit 31
        [1, 2**30],  # two windows of one each: k = 0 wins the tie
        [1, -5, 100, 127],
    ],
)
def test_edge_cases(device: str, values: list[int]) -> None:
    _check(device, torch.tensor(values, dtype=torch.int32), f"{values}")


@pytest.mark.parametrize("device", DEVICES)
def test_strided_and_shaped(device: str) -> None:
    x = _magnitudes(3 * 17 * 5, 2, 16, 9).view(3, 17, 5)
    _check(device, x, "3-d")
    _check(device, x.transpose(0, 2), "transposed")
    _check(device, torch.zeros(0, 4, dtype=torch.int32), "empty 2-d")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for x in (_magnitudes(60, 0, 20, 3).view(12, 5), torch.zeros(0, 2, dtype=torch.int32)):
        opcheck(ops.dyq.default, (x.to(device),))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    fn = "qtrain::dyq"
    setup = "x = torch.ones(4, 3, dtype=torch.int32).to(dev)\n"
    cases = [
        ErrorCase(
            "float", "ops.dyq(x.float())", "TypeError", f"{fn}: x must be int32, got float32"
        ),
        ErrorCase("int8", "ops.dyq(x.to(torch.int8))", "TypeError", "x must be int32, got int8"),
        ErrorCase("sparse", "ops.dyq(x.to_sparse())", "ValueError", "x must be a dense"),
    ]
    expect_errors(cases, device, setup)
