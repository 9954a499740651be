"""Units of equal work over a CSR matrix, for sparse kernels on power-law graphs.

A kernel that gives each row to one unit of work (a thread, a warp) waits on its
largest row: on a power-law graph a hub has thousands of times the mean degree.
The merge path (Merrill and Garland, "Merge-based parallel sparse matrix-vector
multiplication", SC16) balances by work instead: it walks the rows' ends and the
entries as one sequence of ``rows + nnz`` items (an entry gathers and adds an input
row; a row's end writes an output row) and cuts it into units of
``items_per_unit`` consecutive items. Every unit but the last has exactly that
much work, whatever the degrees; a hub row is split across units.

The cut points are found with one ``searchsorted`` on the device that holds
``indptr`` (no host sync), so a partition can be built where the CSR is built
and kept with it. This module is the host-visible definition the kernels follow
and the CPU tests check; :func:`reference_spmm_by_units` is the order in which a
kernel over these units adds a split row's pieces. The ``qspmm`` kernels (CPU and
CUDA) hand out exactly these units, with :func:`spmm_items_per_unit` items each
(``ext/common/merge_path.h`` computes both the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# ext/common/merge_path.h: about this many units, at least / at most this many items each
SPMM_TARGET_UNITS = 1 << 13
SPMM_MIN_ITEMS = 256
SPMM_MAX_ITEMS = 1 << 16


def spmm_items_per_unit(rows: int, nnz: int) -> int:
    """The items per unit the ``qspmm`` kernels use for a CSR of this size: about 8,192
    units (a wave of warps on an H100, many per CPU thread), few enough that the rows split
    at unit boundaries (each a round trip of partial sums through memory) stay few, and at
    most 2^16 items so that a copy-form piece (|q| <= 128 per entry) is exact in float32."""
    per_unit = -(-(rows + nnz) // SPMM_TARGET_UNITS)
    return min(max(per_unit, SPMM_MIN_ITEMS), SPMM_MAX_ITEMS)


@dataclass(frozen=True)
class WorkPartition:
    """Unit ``u`` owns the items ``[u * items_per_unit, (u + 1) * items_per_unit)`` of the
    merge path: the entries ``entry_start[u] .. entry_start[u + 1]`` and the ends of the
    rows ``row_start[u] .. row_start[u + 1]``. It touches the rows ``row_start[u]`` through
    ``row_start[u + 1]`` (the last only where it holds some of that row's entries)."""

    row_start: torch.Tensor  # [units + 1] int64, non-decreasing, 0 .. rows
    entry_start: torch.Tensor  # [units + 1] int64, non-decreasing, 0 .. nnz
    items_per_unit: int

    @property
    def units(self) -> int:
        return self.row_start.numel() - 1

    def work(self) -> torch.Tensor:
        """Items (entries plus row ends) of every unit: ``items_per_unit`` except the last."""
        return (self.row_start[1:] - self.row_start[:-1]) + (
            self.entry_start[1:] - self.entry_start[:-1]
        )


def merge_path_partition(indptr: torch.Tensor, nnz: int, items_per_unit: int) -> WorkPartition:
    """Cut the merge path of a CSR with ``indptr`` (``nnz`` entries: the caller's
    ``indices.numel()``, so nothing is read back from the device) into units of
    ``items_per_unit`` items. ``indptr`` is assumed valid (0 .. nnz, non-decreasing):
    the kernels check it as they read it."""
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"indptr must be 1-d with at least one element, got {tuple(indptr.shape)}")
    if indptr.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"indptr must be int32 or int64, got {indptr.dtype}")
    if items_per_unit < 1:
        raise ValueError(f"items_per_unit must be at least 1, got {items_per_unit}")
    if nnz < 0:
        raise ValueError(f"nnz must be non-negative, got {nnz}")
    rows = indptr.numel() - 1
    device = indptr.device
    total = rows + nnz
    units = max(1, -(-total // items_per_unit))
    # the end of row r is item indptr[r + 1] + r (its entries and the earlier ends before it)
    row_ends = indptr[1:].to(torch.int64) + torch.arange(rows, dtype=torch.int64, device=device)
    diagonals = torch.clamp(
        torch.arange(units + 1, dtype=torch.int64, device=device) * items_per_unit, max=total
    )
    # rows ended before a cut = row ends at items before it
    row_start = torch.searchsorted(row_ends, diagonals, side="left")
    return WorkPartition(
        row_start=row_start, entry_start=diagonals - row_start, items_per_unit=items_per_unit
    )


def reference_spmm_by_units(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    x: torch.Tensor,
    partition: WorkPartition,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[r] = sum_k weight[k] * x[indices[k]]`` over row r's entries, computed the way
    a kernel over ``partition`` computes it: each unit sums its piece of each row it
    touches in entry order; the pieces of a row are added to zeros in unit order. A row
    inside one unit is summed in entry order, as a row-parallel kernel sums it. Integer
    ``x`` sums exactly (int64). ``weight`` is one value per entry in CSR order ([E]) or
    any [E, ...] that broadcasts against ``x``'s rows (per-head weights: [E, H, 1])."""
    rows = indptr.numel() - 1
    ptr = indptr.to(torch.int64)
    nnz = indices.numel()
    device = x.device
    acc_dtype = torch.int64 if not x.is_floating_point() else torch.float32
    row_of = torch.repeat_interleave(torch.arange(rows, device=device), ptr[1:] - ptr[:-1])
    k = torch.arange(nnz, device=device)
    # entry k of row r is item k + r of the merge path; its unit cuts the row into pieces
    unit_of = (k + row_of) // partition.items_per_unit
    new_piece = torch.ones(nnz, dtype=torch.bool, device=device)
    new_piece[1:] = (row_of[1:] != row_of[:-1]) | (unit_of[1:] != unit_of[:-1])
    piece_of = torch.cumsum(new_piece.to(torch.int64), 0) - 1
    pieces = int(piece_of[-1]) + 1 if nnz else 0
    piece_start = k[new_piece]
    terms = x[indices.to(torch.int64)].to(acc_dtype)
    if weight is not None:
        w = weight.reshape(-1, *([1] * (x.dim() - 1))) if weight.dim() == 1 else weight
        terms = terms * w[:nnz]
    # each piece summed in entry order: one add per piece and position
    piece_sum = torch.zeros((pieces, *x.shape[1:]), dtype=acc_dtype, device=device)
    position = k - piece_start[piece_of]
    for p in range(int(position.max()) + 1 if nnz else 0):
        at = position == p
        piece_sum[piece_of[at]] += terms[at]
    # a row's pieces added to zeros in unit order: one add per row and piece rank
    piece_row = row_of[piece_start]
    first_piece = torch.searchsorted(piece_row, piece_row, side="left")
    rank = torch.arange(pieces, device=device) - first_piece
    out = torch.zeros((rows, *x.shape[1:]), dtype=acc_dtype, device=device)
    for p in range(int(rank.max()) + 1 if pieces else 0):
        at = rank == p
        out[piece_row[at]] += piece_sum[at]
    return out
