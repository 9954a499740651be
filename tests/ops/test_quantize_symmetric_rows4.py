"""torch.ops.qtrain.quantize_symmetric_rows4 (issue 32, packed storage) on every device:
bit for bit pack_int4 of quantize_symmetric_rows (and of its reference) at 2 to 4 bits,
both roundings, every row shape (odd widths, zero / constant / tiny / huge rows, no rows,
no columns, views), every CPU variant and thread count; its reference; the Python front
(3-d rows, dispatch); opcheck; the fake kernel's shapes; every error path."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import mixed_rows, packed_quantizer_error_cases, row_inputs
from support import DEVICES, ErrorCase, assert_same, expect_errors, gen, library, opcheck, variants

from qtrain.ops import dispatch, fakes
from qtrain.ops.quantize import quantize_per_row, quantize_per_row_packed, reference_quantize_rows4
from qtrain.quant import packed as packed_ref
from qtrain.quant.granular import quantize_rows_symmetric
from qtrain.quant.rng import op_seed

ROUNDINGS = ("nearest", "stochastic")


def _check(x: torch.Tensor, device: str, bits: int, rounding: str, seed: int, offset: int) -> None:
    """The op and its reference against pack_int4 of the row quantizer's reference."""
    q, want_scale = quantize_rows_symmetric(x, bits, rounding, seed, offset)
    want = packed_ref.pack_int4(q)
    what = f"bits={bits}, {rounding}, seed={seed}, offset={offset}"
    ref_packed, ref_scale = reference_quantize_rows4(x, bits, rounding, seed, offset)
    assert_same(ref_packed, want, what)
    assert_same(ref_scale, want_scale, what)
    packed, scale = library(device).quantize_symmetric_rows4(
        x.to(device), bits, rounding == "stochastic", op_seed(seed), offset
    )
    assert packed.device.type == scale.device.type == torch.device(device).type
    assert_same(packed, want, what)
    assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(row_inputs()))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_packed_reference(device: str, name: str, rounding: str) -> None:
    x = row_inputs()[name]
    for bits in (2, 3, 4):
        _check(x, device, bits, rounding, seed=bits, offset=0)
    if rounding == "stochastic":
        for seed, offset in ((1, 17), (2**40 + 3, 2**32 - 100), (-5, 6 * 10**9)):
            _check(x, device, 4, rounding, seed, offset)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("shape", [(701, 1601), (600_001, 2), (40_001, 33)])
def test_cpu_same_for_any_thread_count_and_isa(rounding: str, shape: tuple[int, int]) -> None:
    """Over 2^20 elements (two threads split the rows); odd and even widths."""
    ops = library("cpu")
    x = mixed_rows(*shape, seed=5)
    offset = 2**32 - 555_555  # the counter's high word changes inside the tensor
    q, want_scale = quantize_rows_symmetric(x, 4, rounding, 11, offset)
    want = packed_ref.pack_int4(q)
    for what in variants("cpu"):
        packed, scale = ops.quantize_symmetric_rows4(x, 4, rounding == "stochastic", 11, offset)
        assert_same(packed, want, what)
        assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_front_packs_what_quantize_per_row_gives(device: str, rounding: str) -> None:
    """2-d and 3-d ([N, H, D]: a scale per node and head) x, float64 input, a strided view;
    every backend; counted as the primitive "quantize_rows"."""
    library(device)
    g = gen(8)
    cases = [
        torch.randn(50, 9, generator=g),
        torch.randn(30, 4, 7, generator=g) * torch.logspace(-2, 2, 4)[None, :, None],
        torch.randn(7, 1001, dtype=torch.float64, generator=g)[:, ::3],
    ]
    for x in cases:
        x = x.to(device)
        want_q, want_scale = quantize_per_row(x, 3, rounding, seed=3, offset=2**33)
        for backend in ("auto", "reference"):
            packed, scale = quantize_per_row_packed(
                x, 3, rounding, seed=3, offset=2**33, backend=backend
            )
            assert_same(packed, packed_ref.pack_int4(want_q.cpu()), f"{backend}, {x.shape}")
            assert_same(scale, want_scale, f"{backend}, {x.shape}")
    dispatch.reset()
    try:
        quantize_per_row_packed(cases[1].to(device), 4)
        quantize_per_row_packed(cases[1].to(device), 4, backend="reference")
        kernel = "ext-cuda" if device == "cuda" else "ext-cpu"
        assert dispatch.snapshot() == {"quantize_rows": {kernel: 1, "reference": 1}}
    finally:
        dispatch.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = torch.randn(33, 5, generator=gen(2)).to(device)
    for args in (
        (x, 4, True, 3, 7),
        (x.t(), 2, False, 0, 0),
        (x[:, :4], 3, True, 1, 0),
        (x[:0], 2, True, -1, 0),
        (x[:, :0], 3, False, 0, 0),
    ):
        opcheck(ops.quantize_symmetric_rows4.default, args)


def test_fake_shapes() -> None:
    x = torch.empty(7, 5, device="meta")
    packed, scale = fakes.quantize_symmetric_rows4(x, 4)
    assert packed.shape == (7, 3) and packed.dtype == torch.uint8
    assert scale.shape == (7, 1) and scale.dtype == torch.float32
    assert fakes.quantize_symmetric_rows4(x[:, :4], 2)[0].shape == (7, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    op = "ops.quantize_symmetric_rows4"
    own = ErrorCase(
        "raw Inf in a wide row",
        f"x = torch.zeros(3, 5000, device=dev); x[2, 4999] = float('inf'); {op}(x, 4)",
        "ValueError",
        "NaN or Inf",
    )
    expect_errors(
        [*packed_quantizer_error_cases(op, "reference_quantize_rows4"), own],
        device,
        setup="from qtrain.ops.quantize import reference_quantize_rows4\n",
    )
