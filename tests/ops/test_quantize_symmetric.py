"""torch.ops.qtrain.quantize_symmetric on every device against its reference
(qtrain.quant.quantize.quantize_symmetric), bit for bit."""

from __future__ import annotations

import pytest
import torch
from support import (
    DEVICES,
    ErrorCase,
    assert_same,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)

from qtrain.quant import quantize_symmetric
from qtrain.quant.rng import op_seed

ROUNDINGS = ("nearest", "stochastic")


def _inputs() -> dict[str, torch.Tensor]:
    g = gen(1234)
    wide = torch.randn(64, 33, generator=g)
    return {
        "1": torch.randn(1, generator=g),
        "7": torch.randn(7, generator=g),
        "1023": torch.randn(1023, generator=g),
        "3x5x7": torch.randn(3, 5, 7, generator=g),
        "129x3x5": torch.randn(129, 3, 5, generator=g),
        "200003": torch.randn(200_003, generator=g) * 3,
        "transposed": wide.t(),
        "strided": wide[:, ::2],
        "zeros": torch.zeros(129),
        "constant": torch.full((77,), 0.731),
        "negative constant": torch.full((5, 7), -2.5),
        "signed zeros": torch.tensor([-0.0, 0.0, -0.0]),
        "negative": -torch.rand(1000, generator=g) - 1e-3,
        "huge": (torch.rand(1000, generator=g) * 2 - 1) * 3.4e38,
        "tiny": torch.randn(1000, generator=g) * 1e-39,
        "subnormal": torch.randn(100, generator=g) * 1e-44,
        "ties": torch.arange(-20, 21, dtype=torch.float32) / 2,
        "empty": torch.empty(0, 4),
    }


def _check(x: torch.Tensor, device: str, bits: int, rounding: str, seed: int, offset: int) -> None:
    ops = library(device)
    q, scale = ops.quantize_symmetric(
        x.to(device), bits, rounding == "stochastic", op_seed(seed), offset
    )
    want_q, want_scale = quantize_symmetric(x, bits, rounding, seed, offset)
    assert q.device.type == scale.device.type == torch.device(device).type
    what = f"bits={bits}, {rounding}, seed={seed}, offset={offset}"
    assert_same(q, want_q, what)
    assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(_inputs()))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_reference(device: str, name: str, rounding: str) -> None:
    x = _inputs()[name]
    for bits in range(2, 9):
        _check(x, device, bits, rounding, seed=bits, offset=0)
    if rounding == "stochastic":
        for seed, offset in ((1, 17), (2**40 + 3, 2**32 - 100), (-5, 6 * 10**9), (2**64 - 1, 3)):
            _check(x, device, 8, rounding, seed, offset)


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_views(device: str) -> None:
    base = torch.randn(4099, generator=gen(1))
    for x in (base[1:], base[3:3003], base.reshape(4099, 1)[::2, 0]):
        _check(x, device, 6, "stochastic", 5, 11)
    # a view at an odd element offset of a tensor already on the device
    ops = library(device)
    q, scale = ops.quantize_symmetric(base.to(device)[1:], 4, False, 0, 0)
    want_q, want_scale = quantize_symmetric(base[1:], 4, "nearest", 0, 0)
    assert_same(q, want_q)
    assert_same(scale, want_scale)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_cpu_same_for_any_thread_count_and_isa(rounding: str, threads: None) -> None:
    ops = library("cpu")
    x = torch.randn(300_001, generator=gen(5))
    offset = 2**32 - 150_000  # the high word changes inside the tensor
    stochastic = rounding == "stochastic"
    want_q, want_scale = quantize_symmetric(x, 4, rounding, 11, offset)
    for what in variants("cpu"):
        q, scale = ops.quantize_symmetric(x, 4, stochastic, 11, offset)
        assert_same(q, want_q, what)
        assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = torch.randn(33, 5, generator=gen(2)).to(device)
    for args in ((x, 4, True, 3, 7), (x.t(), 8, False, 0, 0), (x[:0], 2, True, -1, 0)):
        opcheck(ops.quantize_symmetric.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    expect_errors(
        [
            ErrorCase(
                "bits 9",
                "ops.quantize_symmetric(torch.ones(3, device=dev), 9)",
                "ValueError",
                r"2\.\.8",
            ),
            ErrorCase(
                "bits 1",
                "ops.quantize_symmetric(torch.ones(3, device=dev), 1)",
                "ValueError",
                r"2\.\.8",
            ),
            ErrorCase(
                "float64",
                "ops.quantize_symmetric(torch.ones(3, device=dev, dtype=torch.float64), 8)",
                "TypeError",
                "x must be float32, got float64",
            ),
            ErrorCase(
                "negative offset",
                "ops.quantize_symmetric(torch.ones(3, device=dev), 8, True, 0, -1)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                "ops.quantize_symmetric(torch.ones(9, device=dev), 8, True, 0, 2**63 - 5)",
                "ValueError",
                "2\\^63",
            ),
            ErrorCase(
                "NaN",
                "ops.quantize_symmetric(torch.tensor([0.0, float('nan')], device=dev), 8)",
                "ValueError",
                "NaN or Inf",
            ),
            ErrorCase(
                "Inf",
                "ops.quantize_symmetric(torch.tensor([float('inf')], device=dev), 8)",
                "ValueError",
                "NaN or Inf",
            ),
            ErrorCase(
                "sparse",
                "ops.quantize_symmetric(torch.eye(3, device=dev).to_sparse(), 8)",
                "ValueError",
                "dense",
            ),
        ],
        device,
    )
