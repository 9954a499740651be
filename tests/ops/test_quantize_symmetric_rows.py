"""torch.ops.qtrain.quantize_symmetric_rows on every device against its reference
(qtrain.quant.granular.quantize_rows_symmetric), bit for bit, and row by row against
quantize_symmetric of the row at its counters."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import mixed_rows, quantizer_error_cases, row_inputs
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

from qtrain.ops import dispatch
from qtrain.ops.quantize import quantize_per_row
from qtrain.quant import quantize_symmetric
from qtrain.quant.granular import quantize_rows_symmetric
from qtrain.quant.rng import op_seed

ROUNDINGS = ("nearest", "stochastic")
MAX_COUNTER = 2**63 - 1


def _check(x: torch.Tensor, device: str, bits: int, rounding: str, seed: int, offset: int) -> None:
    ops = library(device)
    q, scale = ops.quantize_symmetric_rows(
        x.to(device), bits, rounding == "stochastic", op_seed(seed), offset
    )
    want_q, want_scale = quantize_rows_symmetric(x, bits, rounding, seed, offset)
    assert q.device.type == scale.device.type == torch.device(device).type
    what = f"bits={bits}, {rounding}, seed={seed}, offset={offset}"
    assert_same(q, want_q, what)
    assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(row_inputs()))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_reference(device: str, name: str, rounding: str) -> None:
    x = row_inputs()[name]
    for bits in range(2, 9):
        _check(x, device, bits, rounding, seed=bits, offset=0)
    if rounding == "stochastic":
        n = x.numel()
        for seed, offset in (
            (1, 17),
            (2**40 + 3, 2**32 - 100),  # the counter's high word changes inside a row
            (-5, 6 * 10**9),
            (2**64 - 1, 3),
            (7, MAX_COUNTER - n),  # the last counters there are
        ):
            _check(x, device, 8, rounding, seed, offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_each_row_is_quantize_symmetric_of_the_row(device: str, rounding: str) -> None:
    ops = library(device)
    x = mixed_rows(11, 129, 9)
    cols = x.shape[1]
    for bits, seed, offset in ((3, 5, 0), (8, 2**63 + 1, 2**32 - 700)):
        q, scale = ops.quantize_symmetric_rows(
            x.to(device), bits, rounding == "stochastic", op_seed(seed), offset
        )
        assert scale.shape == (x.shape[0], 1)
        for i in range(x.shape[0]):
            want_q, want_scale = quantize_symmetric(x[i], bits, rounding, seed, offset + i * cols)
            what = f"row {i}, bits={bits}, {rounding}, offset={offset}"
            assert_same(q[i], want_q, what)
            assert_same(scale[i, 0], want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_views(device: str) -> None:
    base = torch.randn(4099 * 3, generator=gen(1))
    for x in (base[1:4001].reshape(40, 100), base[3:3003].reshape(3, 1000)[:, 1:]):
        _check(x, device, 6, "stochastic", 5, 11)
    # a view at an odd element offset of a tensor already on the device
    ops = library(device)
    x = base.to(device)[1:4001].reshape(100, 40)
    q, scale = ops.quantize_symmetric_rows(x, 4, False, 0, 0)
    want_q, want_scale = quantize_rows_symmetric(x.cpu(), 4, "nearest", 0, 0)
    assert_same(q, want_q)
    assert_same(scale, want_scale)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("shape", [(701, 1601), (600_001, 2)])
def test_cpu_same_for_any_thread_count_and_isa(
    rounding: str, shape: tuple[int, int], threads: None
) -> None:
    # over 2^20 elements, so two threads split the rows
    ops = library("cpu")
    x = torch.randn(*shape, generator=gen(5)) * torch.logspace(-2, 2, shape[0])[:, None]
    x[shape[0] // 2] = 0.0
    x[shape[0] // 3] *= 1e-40
    offset = 2**32 - 555_555  # the high word changes inside the tensor (inside a row for 1601)
    stochastic = rounding == "stochastic"
    want_q, want_scale = quantize_rows_symmetric(x, 4, rounding, 11, offset)
    for what in variants("cpu"):
        q, scale = ops.quantize_symmetric_rows(x, 4, stochastic, 11, offset)
        assert_same(q, want_q, what)
        assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = torch.randn(33, 5, generator=gen(2)).to(device)
    for args in (
        (x, 4, True, 3, 7),
        (x.t(), 8, False, 0, 0),
        (x[:0], 2, True, -1, 0),
        (x[:, :0], 3, False, 0, 0),
    ):
        opcheck(ops.quantize_symmetric_rows.default, args)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_front_dispatches_to_the_kernel(rounding: str) -> None:
    library("cpu")
    dispatch.reset()
    try:
        x = torch.randn(7, 1001, dtype=torch.float64, generator=gen(3))[:, ::3]
        a = quantize_per_row(x, 5, rounding, seed=3, offset=2**33, backend="ext-cpu")
        b = quantize_per_row(x, 5, rounding, seed=3, offset=2**33, backend="reference")
        c = quantize_per_row(x, 5, rounding, seed=3, offset=2**33)  # auto: the CPU kernel
        for got in (a, c):
            assert_same(got[0], b[0])
            assert_same(got[1], b[1])
        assert dispatch.snapshot() == {"quantize_rows": {"ext-cpu": 2, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    op = "ops.quantize_symmetric_rows"
    own = ErrorCase(
        "Inf in a wide row",
        f"x = torch.zeros(3, 5000, device=dev); x[2, 4999] = float('inf'); {op}(x, 4)",
        "ValueError",
        "NaN or Inf",
    )
    expect_errors([*quantizer_error_cases(op), own], device)
