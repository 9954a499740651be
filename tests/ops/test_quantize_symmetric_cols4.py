"""torch.ops.qtrain.quantize_symmetric_cols4 (issue 32, packed storage: the X columns tango
keeps for a GEMM's weight gradient) on every device: bit for bit pack_int4 of
quantize_symmetric_cols (and of its reference) at 2 to 4 bits, both roundings, one scale
per column and per block of rows, every column shape (odd widths, zero / constant / tiny /
huge columns, no rows, no columns, views), every CPU variant and thread count; its
reference; the Python front (dispatch); opcheck; the fake kernel's shapes; every error
path."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import column_inputs, packed_quantizer_error_cases, power_law_columns
from support import DEVICES, ErrorCase, assert_same, expect_errors, gen, library, opcheck, variants

from qtrain.ops import dispatch, fakes
from qtrain.ops.quantize import (
    quantize_per_column,
    quantize_per_column_packed,
    reference_quantize_cols4,
)
from qtrain.quant import packed as packed_ref
from qtrain.quant.granular import quantize_col_blocks, quantize_cols_symmetric
from qtrain.quant.rng import op_seed

ROUNDINGS = ("nearest", "stochastic")
BLOCKS = (0, 1, 7, 64, 10_000)  # per column, one row a block, odd, tango's, past the rows


def _want(
    x: torch.Tensor, bits: int, rounding: str, seed: int, offset: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """pack_int4 of the column quantizer's reference, and its scales."""
    if block:
        q, scale = quantize_col_blocks(x, bits, block, rounding, seed, offset)
    else:
        q, scale = quantize_cols_symmetric(x, bits, rounding, seed, offset)
    return packed_ref.pack_int4(q), scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(column_inputs()))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_packed_reference(device: str, name: str, rounding: str) -> None:
    x = column_inputs()[name]
    ops = library(device)
    for block in BLOCKS:
        for bits in (2, 3, 4):
            seed, offset = bits, 2**32 - 50 if rounding == "stochastic" else 0
            want, want_scale = _want(x, bits, rounding, seed, offset, block)
            what = f"block={block}, bits={bits}"
            ref_packed, ref_scale = reference_quantize_cols4(x, bits, rounding, seed, offset, block)
            assert_same(ref_packed, want, what)
            assert_same(ref_scale, want_scale, what)
            packed, scale = ops.quantize_symmetric_cols4(
                x.to(device), bits, rounding == "stochastic", op_seed(seed), offset, block
            )
            assert packed.device.type == scale.device.type == torch.device(device).type
            assert_same(packed, want, what)
            assert_same(scale, want_scale, what)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("block", [0, 64])
def test_cpu_same_for_any_thread_count_and_isa(rounding: str, block: int) -> None:
    """Over 2^20 elements (two threads split the rows or the blocks); an odd width, the
    counter's high word changing inside the tensor."""
    ops = library("cpu")
    x = power_law_columns(150_001, 9, 4)
    x[-1, 8] = 1e6  # a column's (a block's) max in the last thread's rows
    offset = 2**32 - 555_555
    want, want_scale = _want(x, 4, rounding, 11, offset, block)
    for what in variants("cpu"):
        packed, scale = ops.quantize_symmetric_cols4(
            x, 4, rounding == "stochastic", op_seed(11), offset, block
        )
        assert_same(packed, want, what)
        assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_front_packs_what_quantize_per_column_gives(device: str, rounding: str) -> None:
    """float64 input, a strided view, per column and per block; every backend; counted as
    the primitive "quantize_cols"."""
    library(device)
    g = gen(8)
    cases = [
        torch.randn(500, 9, generator=g),
        torch.randn(1001, 7, dtype=torch.float64, generator=g)[::3],
    ]
    for x in cases:
        x = x.to(device)
        for block in (0, 64):
            want_q, want_scale = quantize_per_column(x, 3, rounding, 3, 2**33, block=block)
            for backend in ("auto", "reference"):
                packed, scale = quantize_per_column_packed(x, 3, rounding, 3, 2**33, backend, block)
                what = f"{backend}, {tuple(x.shape)}, block={block}"
                assert_same(packed, packed_ref.pack_int4(want_q.cpu()), what)
                assert_same(scale, want_scale, what)
    dispatch.reset()
    try:
        quantize_per_column_packed(cases[0].to(device), 4, block=64)
        quantize_per_column_packed(cases[0].to(device), 4, backend="reference")
        kernel = "ext-cuda" if device == "cuda" else "ext-cpu"
        assert dispatch.snapshot() == {"quantize_cols": {kernel: 1, "reference": 1}}
    finally:
        dispatch.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = torch.randn(130, 5, generator=gen(2)).to(device)
    for args in (
        (x, 4, True, 3, 7, 64),
        (x, 3, False, 0, 0, 0),
        (x.t(), 2, False, 0, 0, 1),
        (x[:, :4], 3, True, 1, 0, 7),
        (x[:0], 2, True, -1, 0, 8),
        (x[:, :0], 3, False, 0, 0, 0),
    ):
        opcheck(ops.quantize_symmetric_cols4.default, args)


def test_fake_shapes() -> None:
    x = torch.empty(130, 5, device="meta")
    packed, scale = fakes.quantize_symmetric_cols4(x, 4)
    assert packed.shape == (130, 3) and packed.dtype == torch.uint8
    assert scale.shape == (1, 5) and scale.dtype == torch.float32
    packed, scale = fakes.quantize_symmetric_cols4(x[:, :4], 2, block=64)
    assert packed.shape == (130, 2) and scale.shape == (3, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    op = "ops.quantize_symmetric_cols4"
    ref_call = "reference_quantize_cols4"
    own = [
        ErrorCase(
            "raw Inf, two threads",
            "torch.set_num_threads(2); x = torch.zeros(400_000, 3, device=dev); "
            f"x[1, 0] = float('inf'); {op}(x, 2, False, 0, 0, 64)",
            "ValueError",
            "NaN or Inf",
        )
    ]
    for call in (op, ref_call):  # the block argument: both refuse a bad one
        tag = "raw" if call == op else "reference"
        stochastic = "True" if call == op else "'stochastic'"
        own += [
            ErrorCase(
                f"{tag} NaN in a late block",
                f"x = torch.zeros(5000, 3, device=dev); x[4999, 2] = float('nan'); "
                f"{call}(x, 4, {stochastic}, 0, 0, 64)",
                "ValueError",
                "NaN or Inf",
            ),
            ErrorCase(
                f"{tag} negative block",
                f"{call}(torch.ones(4, 3, device=dev), 4, {stochastic}, 0, 0, -1)",
                "ValueError",
                "block must be >= 0",
            ),
        ]
    expect_errors(
        [*packed_quantizer_error_cases(op, ref_call), *own],
        device,
        setup=f"from qtrain.ops.quantize import {ref_call}\n",
    )
