// The merge-path work partition of a CSR (qtrain/ops/partition.py defines it and its
// tests check its balance): the rows' ends and the entries, as one sequence of
// rows + nnz items, cut into units of P items, so a hub row is split across units
// and every unit but the last does the same work. The qspmm kernels of every device
// hand out these units (cpu/qspmm_kernel.cpp, cuda/qspmm_kernel.cu) and add a split
// row's pieces in unit order, so they agree bit for bit.
//
// Built with at::searchsorted on indptr's device (no host sync, no data read back).
// indptr is not checked here: the kernels check it and clamp what they read, so an
// invalid indptr gives a wrong partition but never an access out of bounds.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/sub.h>

#include <algorithm>
#include <cstdint>

namespace qtrain {
namespace merge_path {

// P from the size: about kTargetUnits units (a wave of warps on an H100, many units per
// CPU thread), never fewer than kMinItems items (every unit boundary inside a row splits
// it, and a split row costs a round trip of its partial sums through memory: with 8,192
// units at most 8,192 rows are split), never more than kMaxItems (so that a copy-form
// piece, at most P entries of |q| <= 128, is exact in float32: P * 128 <= 2^24).
// qtrain/ops/partition.py (spmm_items_per_unit) mirrors this.
constexpr int64_t kTargetUnits = int64_t{1} << 13;
constexpr int64_t kMinItems = 256;
constexpr int64_t kMaxItems = int64_t{1} << 16;

inline int64_t items_per_unit(int64_t rows, int64_t nnz) {
  const int64_t total = rows + nnz;
  return std::clamp<int64_t>((total + kTargetUnits - 1) / kTargetUnits, kMinItems, kMaxItems);
}

inline int64_t units(int64_t rows, int64_t nnz, int64_t per_unit) {
  return std::max<int64_t>(1, (rows + nnz + per_unit - 1) / per_unit);
}

struct Partition {
  at::Tensor row_start;    // int64 [units + 1]: rows ended before unit u's first item
  at::Tensor entry_start;  // int64 [units + 1]: entries before it (u * P - row_start[u])
  int64_t units = 1;
  int64_t per_unit = kMinItems;
};

// indptr: [rows + 1] int32 or int64 on any device; nnz: the number of entries.
inline Partition partition(const at::Tensor& indptr, int64_t nnz) {
  const int64_t rows = indptr.numel() - 1;
  Partition p;
  p.per_unit = items_per_unit(rows, nnz);
  p.units = units(rows, nnz, p.per_unit);
  const at::TensorOptions longs = indptr.options().dtype(at::kLong);
  // row r ends at item indptr[r + 1] + r (its entries and the earlier rows' ends before it)
  const at::Tensor row_ends = at::add(indptr.slice(0, 1).to(at::kLong), at::arange(rows, longs));
  const at::Tensor diagonals =
      at::clamp_max(at::mul(at::arange(p.units + 1, longs), p.per_unit), rows + nnz);
  p.row_start = at::searchsorted(row_ends, diagonals, /*out_int32=*/false, /*right=*/false);
  p.entry_start = at::sub(diagonals, p.row_start);
  return p;
}

}  // namespace merge_path
}  // namespace qtrain
