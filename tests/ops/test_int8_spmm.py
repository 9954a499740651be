"""``torch.ops.qtrain.int8_spmm`` (GCINT's sparse product) against its reference
``qtrain.ops.integer.reference_int_spmm``, bit for bit, on every device and CPU variant:
random graphs, an empty graph, zero-degree rows, a power-law hub, all-zero and constant
values, odd widths, int32 / int64 indices; a row long enough to saturate; opcheck; and
every error of its front and of its kernels (bad indptr, an index out of range)."""

from __future__ import annotations

import pytest
import torch

from qtrain.ops.graph import group_rows
from qtrain.ops.integer import reference_int_spmm
from tests.ops.support import (
    DEVICES,
    WIDTHS,
    ErrorCase,
    assert_same,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)


def csr(dst: torch.Tensor, src: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """indptr and indices of the edges src -> dst, grouped by destination row."""
    indptr, indices, _ = group_rows(dst, src, torch.arange(src.numel()), rows, torch.int64)
    return indptr, indices


def graph(kind: str, rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    if kind == "empty":
        return csr(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), rows)
    if kind == "hub":  # power-law: degrees ~ 1 / rank, row 0 a hub over every column
        degree = (rows * 2 / torch.arange(1, rows + 1)).long().clamp(max=cols)
        degree[0] = cols
        dst = torch.repeat_interleave(torch.arange(rows), degree)
        return csr(dst, torch.randint(0, cols, (dst.numel(),), generator=g), rows)
    # random, destinations only in the first half: the rest have degree 0
    edges = 4 * rows
    dst = torch.randint(0, max(rows // 2, 1), (edges,), generator=g)
    return csr(dst, torch.randint(0, cols, (edges,), generator=g), rows)


def _int8(shape: tuple[int, ...], seed: int, low: int = -128, high: int = 128) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=gen(seed)).to(torch.int8)


def _check(device: str, indptr, indices, values, q, what: str) -> None:
    ops = library(device)
    want = reference_int_spmm(indptr, indices, values, q)
    for index_dtype in (torch.int64, torch.int32):
        for variant in variants(device):
            got = ops.int8_spmm(
                indptr.to(device, index_dtype),
                indices.to(device, index_dtype),
                values.to(device),
                q.to(device),
            )
            assert_same(got, want, f"{what}, {index_dtype}, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["empty", "hub", "random"])
@pytest.mark.parametrize("width", WIDTHS)
def test_graphs(device: str, kind: str, width: int) -> None:
    rows, cols = 60, 45
    indptr, indices = graph(kind, rows, cols, width)
    values = _int8((indices.numel(),), width + 1)
    _check(device, indptr, indices, values, _int8((cols, width), width + 2), f"{kind}, D {width}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("value", "row"), [(0, 5), (-128, -128), (127, -128), (1, 0)])
def test_constant_values_and_rows(device: str, value: int, row: int) -> None:
    indptr, indices = graph("hub", 40, 30, 3)
    values = torch.full((indices.numel(),), value, dtype=torch.int8)
    q = torch.full((30, 17), row, dtype=torch.int8)
    _check(device, indptr, indices, values, q, f"values {value}, rows {row}")


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows_and_zero_width(device: str) -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    _check(
        device,
        torch.zeros(1, dtype=torch.int64),
        empty,
        empty.to(torch.int8),
        _int8((4, 3), 0),
        "no rows",
    )
    indptr, indices = graph("random", 10, 8, 1)
    _check(device, indptr, indices, _int8((indices.numel(),), 1), _int8((8, 0), 1), "width 0")
    # rows without entries over a q without rows
    no_entries = torch.zeros(6, dtype=torch.int64)
    _check(device, no_entries, empty, empty.to(torch.int8), _int8((0, 5), 1), "q without rows")


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_past_int32_saturates(device: str) -> None:
    """131073 entries of (-128)(-128) sum past 2^31 - 1 and saturate (the long-row path);
    131071 entries of (-128)(127) stay inside it (the int32 path)."""
    long, short = 131_073, 131_071
    indptr = torch.tensor([0, long, long + short], dtype=torch.int64)
    indices = torch.zeros(long + short, dtype=torch.int64)
    values = torch.full((long + short,), -128, dtype=torch.int8)
    q = torch.tensor([[-128, 127, 0]], dtype=torch.int8)
    got = (
        library(device)
        .int8_spmm(indptr.to(device), indices.to(device), values.to(device), q.to(device))
        .cpu()
    )
    assert got[0].tolist() == [2**31 - 1, -128 * 127 * long, 0]
    assert got[1].tolist() == [min(short * 2**14, 2**31 - 1), -128 * 127 * short, 0]
    _check(device, indptr, indices, values, q, "long rows")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for kind in ("random", "empty"):
        indptr, indices = graph(kind, 12, 9, 2)
        args = (indptr, indices, _int8((indices.numel(),), 3), _int8((9, 5), 4))
        opcheck(ops.int8_spmm.default, tuple(t.to(device) for t in args))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    fn = "qtrain::int8_spmm"
    setup = """
ip = torch.tensor([0, 2, 3]).to(dev)
ix = torch.tensor([0, 2, 1]).to(dev)
v = torch.tensor([1, -2, 3], dtype=torch.int8).to(dev)
q = torch.ones(3, 4, dtype=torch.int8).to(dev)
"""
    cases = [
        ErrorCase(
            "float q",
            "ops.int8_spmm(ip, ix, v, q.float())",
            "TypeError",
            f"{fn}: q must be int8, got float32",
        ),
        ErrorCase(
            "3-d q",
            "ops.int8_spmm(ip, ix, v, q.view(3, 2, 2))",
            "ValueError",
            "q must have shape \\[N, D\\]",
        ),
        ErrorCase(
            "float values",
            "ops.int8_spmm(ip, ix, v.float(), q)",
            "TypeError",
            "values must be int8, got float32",
        ),
        ErrorCase(
            "short values",
            "ops.int8_spmm(ip, ix, v[:2], q)",
            "ValueError",
            "values must be 1-d with one entry per index \\(3\\)",
        ),
        ErrorCase(
            "float indptr",
            "ops.int8_spmm(ip.float(), ix, v, q)",
            "TypeError",
            "indptr must be int32 or int64, got float32",
        ),
        ErrorCase(
            "2-d indices",
            "ops.int8_spmm(ip, ix.view(1, 3), v, q)",
            "ValueError",
            "indices must be 1-d",
        ),
        ErrorCase(
            "empty indptr",
            "ops.int8_spmm(ip[:0], ix[:0], v[:0], q)",
            "ValueError",
            "indptr needs at least one entry",
        ),
        ErrorCase("devices", "ops.int8_spmm(ip, ix, v, q.to(other))", "ValueError", "q is on"),
        ErrorCase(
            "indptr start",
            "ops.int8_spmm(ip + 1, ix, v, q)",
            "ValueError",
            "indptr\\[0\\] must be 0, got 1",
        ),
        ErrorCase(
            "indptr end",
            "ops.int8_spmm(torch.tensor([0, 2, 2]).to(dev), ix, v, q)",
            "ValueError",
            "indptr\\[-1\\] must equal the number of entries \\(3\\), got 2",
        ),
        ErrorCase(
            "indptr order",
            "ops.int8_spmm(torch.tensor([0, 3, 2, 3]).to(dev), ix, v, q)",
            "ValueError",
            "indptr must be non-decreasing",
        ),
        ErrorCase(
            "index high",
            "ops.int8_spmm(ip, torch.tensor([0, 3, 1]).to(dev), v, q)",
            "ValueError",
            "an entry of indices is outside \\[0, 3\\) \\(rows of q\\)",
        ),
        ErrorCase(
            "index negative",
            "ops.int8_spmm(ip, torch.tensor([0, -1, 1]).to(dev), v, q)",
            "ValueError",
            "an entry of indices is outside",
        ),
    ]
    expect_errors(cases, device, setup)
