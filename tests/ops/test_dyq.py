"""``torch.ops.qtrain.dyq`` (GCINT's DyQ) against its reference
``qtrain.ops.integer.reference_dyq``, bit for bit, window included, on every device and CPU
variant, with the paper's fullest window and with a saturation bound (``tail``): magnitudes
over every range of bit positions, ties between windows, the top window, empty, all-zero and
constant tensors, tensors large enough to split over threads and blocks; the bounded window
is the lowest that saturates at most one value in ``2^tail``; the window stays on the
tensor's device; opcheck; and every error of its front."""

from __future__ import annotations

import pytest
import torch

from qtrain.ops import integer
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


TAILS = [None, 0, 3, 13, 24]


def _check(device: str, x: torch.Tensor, what: str, tail: int | None = None) -> None:
    ops = library(device)
    want_q, want_shift = reference_dyq(x, tail)
    what = f"{what}, tail {tail}"
    for variant in variants(device):
        q, shift = ops.dyq(x.to(device), tail)
        assert q.device.type == shift.device.type == torch.device(device).type  # no host trip
        assert shift.dtype == torch.int64 and shift.dim() == 0, f"{what}: shift {shift}"
        assert int(shift) == int(want_shift), (
            f"{what}, {variant}: k {int(shift)} != {int(want_shift)}"
        )
        assert_same(q, want_q, f"{what}, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize(("lo", "hi"), [(0, 3), (0, 7), (4, 12), (10, 20), (18, 31), (0, 32)])
def test_windows_over_bit_ranges(device: str, lo: int, hi: int, tail: int | None) -> None:
    _check(device, _magnitudes(5_000, lo, hi, lo * 32 + hi), f"bits {lo}..{hi - 1}", tail)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tail", [None, 13])
def test_large_tensor_split_over_threads(device: str, tail: int | None) -> None:
    x = torch.cat([_magnitudes(300_000, 3, 14, 1), _magnitudes(200_000, 12, 25, 2)])
    _check(device, x.view(500, 1000), "500k values", tail)


@pytest.mark.parametrize("tail", [0, 1, 5, 13])
@pytest.mark.parametrize("seed", range(3))
def test_the_bounded_window_is_the_lowest_that_saturates_within_the_tail(
    seed: int, tail: int
) -> None:
    """The reference's bounded window by its definition, counted directly: at ``k`` at most
    ``nonzero / 2^tail`` magnitudes reach bit ``k + 7`` (they saturate), at ``k - 1`` more
    would. A heavy tail (a few huge activations over many small ones) is what it is for."""
    g = gen(seed)
    small = _magnitudes(20_000, 0, 9, seed)
    huge = _magnitudes(int(torch.randint(40, 60, (), generator=g)), 14, 24, seed + 7)
    x = torch.cat([small, huge, torch.zeros(500, dtype=torch.int32)])
    nonzero = int((x != 0).sum())
    k = int(reference_dyq(x, tail)[1])

    def saturated(shift: int) -> int:
        return int((x.to(torch.int64).abs() >= 2 ** (shift + 7)).sum())

    assert saturated(k) * 2**tail <= nonzero
    if k > 0:
        assert saturated(k - 1) * 2**tail > nonzero
    if tail == 13:  # 40+ huge values in 20,000 may not saturate: the window moves up to them
        assert k > int(reference_dyq(x)[1])  # the fullest window sits on the many small ones


def test_the_public_dyq_refuses_a_tail_out_of_range() -> None:
    x = torch.ones(3, dtype=torch.int32)
    for tail in (-1, integer.MAX_TAIL + 1, True, 3.0):
        with pytest.raises(ValueError, match=r"dyq: tail must be None or an integer in 0\.\.24"):
            integer.dyq(x, "reference", tail=tail)


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
    for tail in TAILS:
        _check(device, torch.tensor(values, dtype=torch.int32), f"{values}", tail)


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
        opcheck(ops.dyq.default, (x.to(device), 13))


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
        ErrorCase(
            "negative tail",
            "ops.dyq(x, -1)",
            "ValueError",
            f"{fn}: tail must be None or an integer in 0..24, got -1",
        ),
        ErrorCase("tail 25", "ops.dyq(x, 25)", "ValueError", "tail must be None or an integer"),
    ]
    expect_errors(cases, device, setup)
