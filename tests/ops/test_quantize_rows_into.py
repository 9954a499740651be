"""torch.ops.qtrain.quantize_rows_into on every device against its reference
(qtrain.quant.rowwise.quantize_rows of the gathered rows, laid out as packed values,
bfloat16 zeros, bfloat16 ranges), bit for bit: gathers with repeated rows and empty
ones, segments at odd addresses, rows without values, every ISA variant and 1 / 2
threads on the CPU. The CUDA kernel composes the quantize_rows kernel with ATen's
gather and copies; the CPU kernel gathers while it quantizes."""

from __future__ import annotations

import pytest
import torch
from compress_cases import BITS, STREAMS, misaligned, segment_reference, varied_rows
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

from qtrain.quant import rowwise as ref
from qtrain.quant.rng import op_seed


def _index_cases() -> list[torch.Tensor | None]:
    return [
        None,
        torch.randperm(300, generator=gen(1))[:97],
        torch.tensor([4, 4, 0]),  # a gather may repeat rows
        torch.empty(0, dtype=torch.int64),
    ]


def _segment(
    device: str, x: torch.Tensor, index: torch.Tensor | None, bits: int, seed: int, offset: int
) -> torch.Tensor:
    rows = x.shape[0] if index is None else index.numel()
    out = torch.full((ref.segment_bytes(rows, x.shape[1], bits),), 7, dtype=torch.uint8)
    out = out.to(device)
    library(device).quantize_rows_into(
        x.to(device),
        None if index is None else index.to(device),
        bits,
        True,
        op_seed(seed),
        offset,
        out,
    )
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_matches_reference(device: str, bits: int) -> None:
    for width in (1, 5, 17, 129, 256):
        x = varied_rows(300, width, seed=width + bits)
        for index in _index_cases():
            for seed, offset in STREAMS:
                want, _ = segment_reference(x, index, bits, seed, offset)
                got = _segment(device, x, index, bits, seed, offset)
                n = None if index is None else index.numel()
                assert_same(got, want, f"width={width}, index={n}, seed={seed}, offset={offset}")


@pytest.mark.parametrize("device", DEVICES)
def test_segments_at_odd_addresses_and_strided_inputs(device: str) -> None:
    """The segment's zero points start at an odd byte; x is a transposed view."""
    ops = library(device)
    x = varied_rows(129, 300, seed=5).t()  # [300, 129], not contiguous
    index = torch.randperm(300, generator=gen(2))[:201]
    for bits in BITS:
        want, _ = segment_reference(x, index, bits, 3, 2**32 - 77)
        out = misaligned(torch.zeros(want.numel(), dtype=torch.uint8), device)
        ops.quantize_rows_into(x.to(device), index.to(device), bits, True, 3, 2**32 - 77, out)
        assert_same(out, want, f"bits={bits}")


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    """Enough rows for two threads (width 129: blocks of 8 rows), on every ISA variant."""
    ops = library("cpu")
    x = varied_rows(5000, 129, seed=5)
    index = torch.randperm(5000, generator=gen(3))[:4321]
    for bits in BITS:
        want, _ = segment_reference(x, index, bits, 3, 2**32 - 77)
        for what in variants("cpu"):
            out = misaligned(torch.zeros(want.numel(), dtype=torch.uint8), "cpu")
            ops.quantize_rows_into(x, index, bits, True, 3, 2**32 - 77, out)
            assert_same(out, want, f"bits={bits}, {what}")


@pytest.mark.parametrize("device", DEVICES)
def test_rows_without_values(device: str) -> None:
    """Width 0: each row still carries its (zero) zero point and range, as the reference."""
    ops = library(device)
    x = torch.empty(5, 0, device=device)
    out = torch.full((ref.segment_bytes(3, 0, 2),), 9, dtype=torch.uint8, device=device)
    ops.quantize_rows_into(x, torch.tensor([4, 0, 2], device=device), 2, True, 0, 0, out)
    assert_same(out, torch.zeros(12, dtype=torch.uint8))
    ref_out = torch.full((12,), 9, dtype=torch.uint8)
    ref.quantize_rows_into(x.cpu(), torch.tensor([4, 0, 2]), 2, "stochastic", 0, 0, ref_out)
    assert_same(out, ref_out)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = varied_rows(30, 7, seed=1).to(device)
    index = torch.tensor([3, 1, 29, 3], device=device)

    def seg(rows: int, bits: int) -> torch.Tensor:
        return torch.zeros(ref.segment_bytes(rows, 7, bits), dtype=torch.uint8, device=device)

    for args in (
        (x, index, 4, True, 1, 2, seg(4, 4)),
        (x, None, 2, False, -1, 0, seg(30, 2)),
        (x, index[:0], 1, True, 0, 0, seg(0, 1)),
    ):
        opcheck(ops.quantize_rows_into.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    setup = (
        "x = torch.randn(6, 5, device=dev); "
        "i = torch.tensor([0, 1, 2], device=dev); "
        "out = torch.empty(20, dtype=torch.uint8, device=dev); "
    )

    expect_errors(
        [
            ErrorCase(
                "bits 3",
                "ops.quantize_rows_into(x, i, 3, True, 0, 0, out)",
                "ValueError",
                "1, 2, 4, 8",
            ),
            ErrorCase(
                "float64",
                "ops.quantize_rows_into(x.double(), i, 4, True, 0, 0, out)",
                "TypeError",
                "2-d float32",
            ),
            ErrorCase(
                "float index",
                "ops.quantize_rows_into(x, i.float(), 4, True, 0, 0, out)",
                "TypeError",
                "index must be a 1-d int64 tensor",
            ),
            ErrorCase(
                "int32 index",
                "ops.quantize_rows_into(x, i.int(), 4, True, 0, 0, out)",
                "TypeError",
                "index must be a 1-d int64 tensor",
            ),
            ErrorCase(
                "index outside",
                "ops.quantize_rows_into(x, torch.tensor([0, 6, 1], device=dev), 4, True, 0, 0, out)",
                "IndexError",
                r"index\[1\] = 6 is outside \[0, 6\)",
            ),
            ErrorCase(
                "negative index",
                "ops.quantize_rows_into(x, torch.tensor([0, 1, -1], device=dev), 4, True, 0, 0, out)",
                "IndexError",
                r"index\[2\] = -1 is outside \[0, 6\)",
            ),
            ErrorCase(
                "short segment",
                "ops.quantize_rows_into(x, torch.arange(5, device=dev), 4, True, 0, 0, out)",
                "ValueError",
                "the segment has 20 bytes, its rows need 33",
            ),
            ErrorCase(
                "int8 segment",
                "ops.quantize_rows_into(x, i, 4, True, 0, 0, out.to(torch.int8))",
                "TypeError",
                "the segment must be a 1-d uint8 tensor",
            ),
            ErrorCase(
                "strided segment",
                "ops.quantize_rows_into(x, i, 4, True, 0, 0, "
                "torch.empty(40, dtype=torch.uint8, device=dev)[::2])",
                "ValueError",
                "the segment must be a contiguous tensor",
            ),
            ErrorCase(
                "negative offset",
                "ops.quantize_rows_into(x, i, 4, True, 0, -1, out)",
                "ValueError",
                "offset must be >= 0",
            ),
            ErrorCase(
                "counter overflow",
                "ops.quantize_rows_into(x, i, 4, True, 0, 2**63 - 5, out)",
                "ValueError",
                r"2\^63",
            ),
            ErrorCase(
                "index elsewhere",
                "ops.quantize_rows_into(x, i.to(other), 4, True, 0, 0, out)",
                "ValueError",
                "index is on",
            ),
            ErrorCase(
                "segment elsewhere",
                "ops.quantize_rows_into(x, i, 4, True, 0, 0, out.to(other))",
                "ValueError",
                "out is on",
            ),
        ],
        device,
        setup,
    )
