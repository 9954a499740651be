"""The merge-path work partition (qtrain.ops.partition): balance on power-law graphs, the
cut points' invariants, edge cases, and the split-row sums against the row-wise sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qtrain.data.synthetic import SyntheticOptions, generate
from qtrain.ops.graph import build_csr
from qtrain.ops.partition import (
    WorkPartition,
    merge_path_partition,
    reference_spmm_by_units,
    spmm_items_per_unit,
)
from tests.ops.support import DEVICES

# the generator's power-law graphs at the mean degrees of its arxiv and products presets
POWER_LAW = {
    "arxiv-degree": SyntheticOptions(nodes=20_000, avg_degree=2 * 1_166_243 / 169_343),
    "products-degree": SyntheticOptions(nodes=20_000, avg_degree=2 * 61_859_140 / 2_449_029),
    "heavy-tail": SyntheticOptions(nodes=20_000, avg_degree=20.0, power_law_exponent=2.05),
}


def power_law_csr(opts: SyntheticOptions) -> tuple[torch.Tensor, torch.Tensor]:
    arrays = generate(opts)
    u = torch.from_numpy(np.concatenate([arrays["edge_u"], arrays["edge_v"]]).astype(np.int64))
    v = torch.from_numpy(np.concatenate([arrays["edge_v"], arrays["edge_u"]]).astype(np.int64))
    csr = build_csr(u, v, opts.nodes, opts.nodes)
    return csr.in_indptr, csr.in_indices


def row_partition(indptr: torch.Tensor, rows_per_unit: int) -> WorkPartition:
    """What the merge path replaces, for comparison: ``rows_per_unit`` whole rows a unit."""
    rows = indptr.numel() - 1
    units = max(1, -(-rows // rows_per_unit))
    row_start = torch.clamp(torch.arange(units + 1) * rows_per_unit, max=rows)
    return WorkPartition(row_start, indptr.to(torch.int64)[row_start], rows_per_unit)


def imbalance(partition: WorkPartition) -> float:
    """Largest unit's work over the mean unit's, work counted from the cut points alone."""
    work = partition.work().to(torch.float64)
    return float(work.max() / work.mean())


def check_cuts(partition: WorkPartition, indptr: torch.Tensor, nnz: int) -> None:
    rows = indptr.numel() - 1
    r, e = partition.row_start, partition.entry_start
    assert r.dtype == e.dtype == torch.int64
    assert int(r[0]) == 0 and int(e[0]) == 0
    assert int(r[-1]) == rows and int(e[-1]) == nnz
    assert bool((r[1:] >= r[:-1]).all()) and bool((e[1:] >= e[:-1]).all())
    # a cut never lies before the entries of the rows ended before it, nor past its row's
    ptr = indptr.to(torch.int64)
    assert bool((ptr[r] <= e).all())
    inside = r < rows
    assert bool((e[inside] <= ptr[r[inside] + 1]).all())


@pytest.mark.parametrize("name", sorted(POWER_LAW))
@pytest.mark.parametrize("items_per_unit", [32, 256, 4096])
def test_largest_unit_within_1_25x_of_the_mean(name: str, items_per_unit: int) -> None:
    indptr, indices = power_law_csr(POWER_LAW[name])
    degrees = indptr[1:] - indptr[:-1]
    assert float(degrees.max()) > 15 * float(degrees.float().mean()), "not power-law"
    partition = merge_path_partition(indptr, indices.numel(), items_per_unit)
    check_cuts(partition, indptr, indices.numel())
    assert partition.units >= 2
    assert imbalance(partition) <= 1.25
    # every unit but the last holds exactly items_per_unit items
    assert bool((partition.work()[:-1] == items_per_unit).all())
    # the same number of units by rows misses the bar on these graphs
    rows = indptr.numel() - 1
    by_rows = row_partition(indptr, -(-rows // partition.units))
    assert imbalance(by_rows) > 1.25


@pytest.mark.parametrize("name", sorted(POWER_LAW))
def test_the_kernels_units_are_balanced(name: str) -> None:
    """The units the qspmm kernels hand out (spmm_items_per_unit) meet the bar too."""
    indptr, indices = power_law_csr(POWER_LAW[name])
    rows, nnz = indptr.numel() - 1, indices.numel()
    partition = merge_path_partition(indptr, nnz, spmm_items_per_unit(rows, nnz))
    assert partition.units >= 30 and imbalance(partition) <= 1.25


def test_the_kernels_unit_size() -> None:
    """About 2^13 units, 256 to 2^16 items each (ext/common/merge_path.h computes the same)."""
    assert spmm_items_per_unit(0, 0) == 256
    assert spmm_items_per_unit(2_708, 10_556) == 256  # Cora: 52 units
    assert spmm_items_per_unit(2_449_029, 123_718_280) == 15_402  # products: 8,192 units
    assert spmm_items_per_unit(1 << 20, (1 << 21) + 1) == 385  # rounds up
    assert spmm_items_per_unit(1 << 40, 0) == 1 << 16  # capped: a piece stays exact in float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "degrees",
    [
        [],  # no rows
        [0, 0, 0],  # rows without entries
        [0, 0, 40, 0, 0],  # one hub between empty rows
        [1] * 17,
        [3, 0, 100, 1, 0, 0, 7, 250, 0],
        [0] * 5 + [1000],  # the hub at the end
    ],
)
@pytest.mark.parametrize("items_per_unit", [1, 2, 7, 64, 10_000])
def test_cuts_and_split_sums(device: str, degrees: list[int], items_per_unit: int) -> None:
    gen = torch.Generator().manual_seed(len(degrees) * 31 + items_per_unit)
    indptr = torch.tensor([0, *np.cumsum(degrees, dtype=np.int64)], dtype=torch.int64)
    nnz = int(indptr[-1])
    n_in = 13
    indices = torch.randint(0, n_in, (nnz,), generator=gen)
    indptr, indices = indptr.to(device), indices.to(device)
    partition = merge_path_partition(indptr.to(torch.int32), nnz, items_per_unit)
    assert partition.row_start.device.type == device
    check_cuts(partition, indptr, nnz)
    assert int(partition.work().sum()) == len(degrees) + nnz
    assert bool((partition.work()[:-1] == items_per_unit).all())
    # integer sums are exact however a row is split: equal to the row-wise sum
    q = torch.randint(-128, 128, (n_in, 5), generator=gen, dtype=torch.int8).to(device)
    rows = len(degrees)
    expected = torch.zeros((rows, 5), dtype=torch.int64, device=device)
    row_of = torch.repeat_interleave(torch.arange(rows, device=device), indptr.diff())
    expected.index_add_(0, row_of, q[indices].to(torch.int64))
    got = reference_spmm_by_units(indptr, indices, q, partition)
    assert torch.equal(got, expected)
    # float sums: the row-wise sum's value, to rounding (the split changes the order)
    x = torch.randn((n_in, 3), generator=gen).to(device)
    w = torch.rand(nnz, generator=gen).to(device)
    reference = torch.zeros((rows, 3), device=device)
    reference.index_add_(0, row_of, w[:, None] * x[indices])
    got = reference_spmm_by_units(indptr, indices, x, partition, weight=w)
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


def sequential_sums(indptr: torch.Tensor, indices: torch.Tensor, x: torch.Tensor) -> list:
    out = []
    for r in range(indptr.numel() - 1):
        acc = torch.zeros((), dtype=torch.float32)
        for k in range(int(indptr[r]), int(indptr[r + 1])):
            acc = acc + x[int(indices[k]), 0]
        out.append(float(acc))
    return out


def test_a_row_inside_one_unit_is_summed_in_entry_order() -> None:
    """Rows no cut splits come out bit for bit as a sequential float32 row-wise sum; a split
    row adds its pieces in unit order (here a different float32 value, on purpose)."""
    indptr = torch.tensor([0, 3, 3, 9])
    indices = torch.tensor([0, 1, 2, 1, 1, 1, 0, 2, 1])
    x = torch.tensor([[1e8], [1.0], [-1e8]])
    whole = merge_path_partition(indptr, 9, 1000)
    assert whole.units == 1
    got = reference_spmm_by_units(indptr, indices, x, whole)
    assert got[:, 0].tolist() == sequential_sums(indptr, indices, x) == [0.0, 0.0, 1.0]
    # cut after the third entry of row 2: pieces 1 + 1 + 1 = 3 and 1e8 - 1e8 + 1 = 1
    split = merge_path_partition(indptr, 9, 8)
    assert split.entry_start.tolist() == [0, 6, 9]
    assert reference_spmm_by_units(indptr, indices, x, split)[:, 0].tolist() == [0.0, 0.0, 4.0]


def test_no_host_sync_needed_for_the_unit_count() -> None:
    """The number of units follows from the shapes: rows + nnz items, rounded up."""
    indptr = torch.tensor([0, 5, 5, 12])
    partition = merge_path_partition(indptr, 12, 4)
    assert partition.units == 4  # 15 items
    assert partition.work().tolist() == [4, 4, 4, 3]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.zeros((2, 2), dtype=torch.int64), 0, 4), "indptr must be 1-d"),
        ((torch.zeros(0, dtype=torch.int64), 0, 4), "indptr must be 1-d"),
        ((torch.zeros(3), 0, 4), "indptr must be int32 or int64"),
        ((torch.zeros(3, dtype=torch.int64), 0, 0), "items_per_unit must be at least 1"),
        ((torch.zeros(3, dtype=torch.int64), -1, 4), "nnz must be non-negative"),
    ],
)
def test_bad_arguments(args: tuple, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        merge_path_partition(*args)
