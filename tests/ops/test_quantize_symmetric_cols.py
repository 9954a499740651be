"""torch.ops.qtrain.quantize_symmetric_cols on every device against its reference
(qtrain.quant.granular.quantize_cols_symmetric), bit for bit, and column by column
against quantize_symmetric of the column."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import quantizer_error_cases
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
from qtrain.ops.quantize import quantize_per_column
from qtrain.quant import quantize_symmetric
from qtrain.quant.granular import quantize_cols_symmetric
from qtrain.quant.rng import op_seed

ROUNDINGS = ("nearest", "stochastic")
MAX_COUNTER = 2**63 - 1


def _mixed(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Columns of very different magnitudes, a column of zeros, a constant column, a tiny
    column (the 2^64 pre-scaling path), a subnormal column and a huge column among normal
    ones."""
    g = gen(seed)
    x = torch.randn(rows, cols, generator=g)
    x *= torch.logspace(-3, 3, cols)[None, :]
    special = {
        0: torch.zeros(rows),
        1: torch.full((rows,), -0.731),
        2: torch.randn(rows, generator=g) * 1e-39,
        3: torch.randn(rows, generator=g) * 1e-44,
        4: (torch.rand(rows, generator=g) * 2 - 1) * 3.4e38,
        5: torch.full((rows,), 3.0e-38),
    }
    for j, col in special.items():
        if j < cols:
            x[:, j] = col
    return x


def _inputs() -> dict[str, torch.Tensor]:
    g = gen(4321)
    wide = torch.randn(40, 66, generator=g)
    inputs = {f"13x{w}": _mixed(13, w, w) for w in (1, 3, 7, 33, 129, 1000)}
    inputs.update(
        {
            "1x1": torch.randn(1, 1, generator=g),
            "1x500": torch.randn(1, 500, generator=g) * 7,
            "5000x3": _mixed(5000, 3, 3),
            "5000x1": torch.randn(5000, 1, generator=g),
            "17x300": torch.randn(17, 300, generator=g),
            "transposed": wide.t(),
            "strided": wide[::3, ::2],
            "zeros": torch.zeros(33, 9),
            "constant": torch.full((129, 4), 0.731),
            "signed zeros": torch.tensor([[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0]]),
            "tiny": torch.randn(77, 5, generator=g) * 1e-39,
            "huge": (torch.rand(129, 6, generator=g) * 2 - 1) * 3.4e38,
            "ties": (torch.arange(-20, 22, dtype=torch.float32) / 2).reshape(7, 6),
            "no columns": torch.empty(5, 0),
            "no rows": torch.empty(0, 7),
            "nothing": torch.empty(0, 0),
        }
    )
    return inputs


def _check(x: torch.Tensor, device: str, bits: int, rounding: str, seed: int, offset: int) -> None:
    ops = library(device)
    q, scale = ops.quantize_symmetric_cols(
        x.to(device), bits, rounding == "stochastic", op_seed(seed), offset
    )
    want_q, want_scale = quantize_cols_symmetric(x, bits, rounding, seed, offset)
    assert q.device.type == scale.device.type == torch.device(device).type
    assert scale.shape == (1, x.shape[1])
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
        n = x.numel()
        for seed, offset in (
            (1, 17),
            (2**40 + 3, 2**32 - 100),  # the counter's high word changes inside the tensor
            (-5, 6 * 10**9),
            (2**64 - 1, 3),
            (7, MAX_COUNTER - n),  # the last counters there are
        ):
            _check(x, device, 8, rounding, seed, offset)


@pytest.mark.parametrize("device", DEVICES)
def test_each_column_is_quantize_symmetric_of_the_column(device: str) -> None:
    ops = library(device)
    x = _mixed(129, 11, 9)
    for bits in (3, 8):
        q, scale = ops.quantize_symmetric_cols(x.to(device), bits, False, 0, 0)
        assert scale.shape == (1, x.shape[1])
        for j in range(x.shape[1]):
            want_q, want_scale = quantize_symmetric(x[:, j].contiguous(), bits, "nearest")
            what = f"column {j}, bits={bits}"
            assert_same(q[:, j], want_q, what)
            assert_same(scale[0, j], want_scale, what)
    # one column: its counters are offset + i, quantize_symmetric's own
    col = _mixed(300, 1, 4)
    for seed, offset in ((5, 0), (2**63 + 1, 2**32 - 150)):
        q, scale = ops.quantize_symmetric_cols(col.to(device), 5, True, op_seed(seed), offset)
        want_q, want_scale = quantize_symmetric(col[:, 0], 5, "stochastic", seed, offset)
        assert_same(q[:, 0], want_q, f"seed={seed}, offset={offset}")
        assert_same(scale[0, 0], want_scale, f"seed={seed}, offset={offset}")


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_views(device: str) -> None:
    base = torch.randn(4099 * 3, generator=gen(1))
    for x in (base[1:4001].reshape(40, 100), base[3:3003].reshape(3, 1000)[:, 1:]):
        _check(x, device, 6, "stochastic", 5, 11)
    # a view at an odd element offset of a tensor already on the device
    ops = library(device)
    x = base.to(device)[1:4001].reshape(100, 40)
    q, scale = ops.quantize_symmetric_cols(x, 4, False, 0, 0)
    want_q, want_scale = quantize_cols_symmetric(x.cpu(), 4, "nearest", 0, 0)
    assert_same(q, want_q)
    assert_same(scale, want_scale)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("shape", [(701, 1601), (600_001, 2), (3, 400_000)])
def test_cpu_same_for_any_thread_count_and_isa(
    rounding: str, shape: tuple[int, int], threads: None
) -> None:
    # over 2^20 elements, so two threads split the rows (and combine their column maxima)
    ops = library("cpu")
    cols = shape[1]
    x = torch.randn(*shape, generator=gen(5)) * torch.logspace(-2, 2, cols)[None, :]
    x[:, cols // 2] = 0.0
    x[:, cols // 3] *= 1e-40
    x[-1, cols - 1] = 1e6  # a column's max in the last thread's rows
    offset = 2**32 - 555_555  # the high word changes inside the tensor (inside a row for 1601)
    stochastic = rounding == "stochastic"
    want_q, want_scale = quantize_cols_symmetric(x, 4, rounding, 11, offset)
    for what in variants("cpu"):
        q, scale = ops.quantize_symmetric_cols(x, 4, stochastic, op_seed(11), offset)
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
        opcheck(ops.quantize_symmetric_cols.default, args)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_front_dispatches_to_the_kernel(rounding: str) -> None:
    library("cpu")
    dispatch.reset()
    try:
        x = torch.randn(1001, 21, dtype=torch.float64, generator=gen(3))[::3]
        a = quantize_per_column(x, 5, rounding, seed=3, offset=2**33, backend="ext-cpu")
        b = quantize_per_column(x, 5, rounding, seed=3, offset=2**33, backend="reference")
        c = quantize_per_column(x, 5, rounding, seed=3, offset=2**33)  # auto: the CPU kernel
        for got in (a, c):
            assert_same(got[0], b[0])
            assert_same(got[1], b[1])
        assert dispatch.snapshot() == {"quantize_cols": {"ext-cpu": 2, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    op = "ops.quantize_symmetric_cols"
    own = [
        ErrorCase(
            "Inf at the end of a tall column",
            f"x = torch.zeros(5000, 3, device=dev); x[4999, 2] = float('inf'); {op}(x, 4)",
            "ValueError",
            "NaN or Inf",
        ),
        ErrorCase(
            "NaN in a wide row, two threads",
            "torch.set_num_threads(2); x = torch.zeros(3, 400_000, device=dev); "
            f"x[2, 399_999] = float('nan'); {op}(x, 4, True)",
            "ValueError",
            "NaN or Inf",
        ),
    ]
    expect_errors([*quantizer_error_cases(op), *own], device)
