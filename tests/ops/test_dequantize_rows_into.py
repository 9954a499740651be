"""torch.ops.qtrain.dequantize_rows_into on every device against its reference
(qtrain.quant.rowwise.dequantize_rows of the segment's rows, written into or added onto
the rows an index names), bit for bit: indexed and in-order rows, add or write, outputs
at odd addresses, segments whose zero points start at an odd byte, rows without values,
every ISA variant and 1 / 2 threads on the CPU. The CUDA kernel composes the
dequantize_rows kernel with ATen's index_copy_ / index_add_; the CPU kernel writes the
rows as it decodes them."""

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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_matches_reference(device: str, bits: int) -> None:
    ops = library(device)
    g = gen(bits)
    for width in (1, 5, 17, 129, 256):
        x = varied_rows(300, width, seed=width + bits)
        for index in (torch.randperm(300, generator=g)[:97], torch.empty(0, dtype=torch.int64)):
            for seed, offset in STREAMS[:2]:
                segment, back = segment_reference(x, index, bits, seed, offset)
                rows = back.shape[0]
                where = torch.randperm(rows + 11, generator=g)[:rows]
                base = torch.randn(rows + 11, width, generator=g)
                for add in (False, True):
                    got = base.to(device, copy=True)
                    ops.dequantize_rows_into(
                        segment.to(device), rows, bits, got, where.to(device), add
                    )
                    expect = base.clone()
                    expect[where] = base[where] + back if add else back
                    assert_same(got, expect, f"width={width}, rows={rows}, add={add}")
                    ref_out = base.clone()
                    ref.dequantize_rows_into(segment, rows, bits, ref_out, where, add)
                    assert_same(got, ref_out, "the reference")
                    # the rows in order, without an index
                    got = base[:rows].to(device, copy=True)
                    ops.dequantize_rows_into(segment.to(device), rows, bits, got, None, add)
                    assert_same(got, base[:rows] + back if add else back, f"in order, add={add}")


@pytest.mark.parametrize("device", DEVICES)
def test_odd_addresses(device: str) -> None:
    """A segment whose zero points start at an odd byte (at an odd address itself), and
    outputs that are runs of a larger tensor (not 16-byte aligned)."""
    ops = library(device)
    x = varied_rows(300, 129, seed=7)
    index = torch.randperm(300, generator=gen(4))[:201]
    for bits in BITS:
        segment, back = segment_reference(x, index, bits, 3, 2**32 - 77)
        seg = misaligned(segment, device)
        for add in (False, True):
            big = torch.randn(210, 129, generator=gen(bits))
            run = big.to(device, copy=True)[3:204]  # starts 3 * 129 floats in: not 16-byte aligned
            ops.dequantize_rows_into(seg, 201, bits, run, None, add)
            assert_same(run, big[3:204] + back if add else back, f"bits={bits}, add={add}")


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    ops = library("cpu")
    x = varied_rows(5000, 129, seed=5)
    index = torch.randperm(5000, generator=gen(3))[:4321]
    where = torch.randperm(4400, generator=gen(5))[:4321]
    for bits in BITS:
        segment, back = segment_reference(x, index, bits, 3, 2**32 - 77)
        seg = misaligned(segment, "cpu")
        for what in variants("cpu"):
            into = torch.zeros(4321, 129)
            ops.dequantize_rows_into(seg, 4321, bits, into, None, True)
            assert_same(into, back + 0.0, f"bits={bits}, {what}")
            into = torch.ones(4400, 129)
            ops.dequantize_rows_into(seg, 4321, bits, into, where, False)
            expect = torch.ones(4400, 129)
            expect[where] = back
            assert_same(into, expect, f"bits={bits}, {what}, indexed")


@pytest.mark.parametrize("device", DEVICES)
def test_rows_without_values(device: str) -> None:
    ops = library(device)
    segment = torch.zeros(ref.segment_bytes(3, 0, 2), dtype=torch.uint8, device=device)
    into = torch.empty(3, 0, device=device)
    ops.dequantize_rows_into(segment, 3, 2, into, None, False)
    ops.dequantize_rows_into(
        segment,
        3,
        2,
        torch.empty(5, 0, device=device),
        torch.tensor([4, 0, 2], device=device),
        True,
    )
    assert into.shape == (3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = varied_rows(30, 7, seed=1)
    segment, _ = segment_reference(x, None, 4, 1, 2)
    segment = segment.to(device)
    index = torch.randperm(40, generator=gen(6))[:30].to(device)
    for args in (
        (segment, 30, 4, torch.zeros(40, 7, device=device), index, True),
        (segment, 30, 4, torch.zeros(30, 7, device=device), None, False),
        (segment[:0], 0, 4, torch.zeros(5, 7, device=device), index[:0], False),
    ):
        opcheck(ops.dequantize_rows_into.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    setup = (
        "seg = torch.zeros(20, dtype=torch.uint8, device=dev); "
        "into = torch.zeros(4, 5, device=dev); "
        "i = torch.tensor([1, 0, 3], device=dev); "
    )

    expect_errors(
        [
            ErrorCase(
                "bits 3",
                "ops.dequantize_rows_into(seg, 3, 3, into, i, False)",
                "ValueError",
                "1, 2, 4, 8",
            ),
            ErrorCase(
                "float64 out",
                "ops.dequantize_rows_into(seg, 3, 4, into.double(), i, False)",
                "TypeError",
                r"out must be a 2-d float32 tensor \[rows, width\]",
            ),
            ErrorCase(
                "1-d out",
                "ops.dequantize_rows_into(seg, 3, 4, into.reshape(-1), i, False)",
                "TypeError",
                "out must be a 2-d float32 tensor",
            ),
            ErrorCase(
                "strided out",
                "ops.dequantize_rows_into(seg, 3, 4, torch.zeros(5, 4, device=dev).t(), i, False)",
                "ValueError",
                "out must be a contiguous tensor",
            ),
            ErrorCase(
                "negative rows",
                "ops.dequantize_rows_into(seg, -1, 4, into, None, False)",
                "ValueError",
                "rows must be >= 0",
            ),
            ErrorCase(
                "index length",
                "ops.dequantize_rows_into(seg, 3, 4, into, i[:2], False)",
                "ValueError",
                "index has 2 entries for 3 rows",
            ),
            ErrorCase(
                "rows without index",
                "ops.dequantize_rows_into(seg, 3, 4, into, None, False)",
                "ValueError",
                "without an index the segment's 3 rows must fill out's 4",
            ),
            ErrorCase(
                "float index",
                "ops.dequantize_rows_into(seg, 3, 4, into, i.float(), False)",
                "TypeError",
                "index must be a 1-d int64 tensor",
            ),
            ErrorCase(
                "short segment",
                "ops.dequantize_rows_into(seg[:15], 3, 4, into, i, False)",
                "ValueError",
                "the segment has 15 bytes, its rows need 20",
            ),
            ErrorCase(
                "strided segment",
                "ops.dequantize_rows_into(torch.zeros(40, dtype=torch.uint8, device=dev)[::2], "
                "3, 4, into, i, False)",
                "ValueError",
                "the segment must be a contiguous tensor",
            ),
            ErrorCase(
                "index outside",
                "ops.dequantize_rows_into(seg, 3, 4, into, torch.tensor([1, 4, 0], device=dev), True)",
                "IndexError",
                r"index\[1\] = 4 is outside \[0, 4\)",
            ),
            ErrorCase(
                "row twice",
                "ops.dequantize_rows_into(seg, 3, 4, into, torch.tensor([1, 0, 1], device=dev), False)",
                "ValueError",
                "index names row 1 twice; each row may be written once",
            ),
            ErrorCase(
                "out elsewhere",
                "ops.dequantize_rows_into(seg, 3, 4, into.to(other), i, False)",
                "ValueError",
                "out is on",
            ),
            ErrorCase(
                "index elsewhere",
                "ops.dequantize_rows_into(seg, 3, 4, into, i.to(other), False)",
                "ValueError",
                "index is on",
            ),
        ],
        device,
        setup,
    )
