// What the CPU kernels over CSR rows share (cpu/qspmm_kernel.cpp, cpu/int8_spmm_kernel.cpp):
// the check of indptr before any thread starts, the index check of a row, and the prefetch of
// the input row a few entries ahead.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>

#include "cpu/isa.h"

namespace qtrain {
namespace csr_rows {

constexpr int64_t kPrefetch = 12;  // entries ahead whose input row is prefetched
constexpr int64_t kRowChunk = 32;  // rows per dynamic OpenMP chunk

// indptr must start at 0, never decrease and end at nnz.
template <typename I>
void check_indptr(const char* fn, const I* ip, int64_t rows, int64_t nnz) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(ip[0]) == 0, fn, ": indptr[0] must be 0, got ",
                    static_cast<int64_t>(ip[0]));
  TORCH_CHECK_VALUE(static_cast<int64_t>(ip[rows]) == nnz, fn,
                    ": indptr[-1] must equal the number of entries (", nnz, "), got ",
                    static_cast<int64_t>(ip[rows]));
  int64_t bad = -1;
  for (int64_t r = 0; r < rows; ++r) {
    if (ip[r + 1] < ip[r]) {
      bad = r;
      break;
    }
  }
  TORCH_CHECK_VALUE(bad < 0, fn, ": indptr must be non-decreasing, but indptr[", bad + 1,
                    "] < indptr[", bad, "]");
}

// Whether every entry p[b .. e) lies in [0, n).
template <typename I>
QT_ALWAYS_INLINE bool row_in_range(const I* p, int64_t b, int64_t e, int64_t n) {
  bool ok = true;
  for (int64_t k = b; k < e; ++k) ok &= static_cast<uint64_t>(static_cast<int64_t>(p[k])) <
                                        static_cast<uint64_t>(n);
  return ok;
}

// Prefetches `bytes` of the input row of entry k + kPrefetch (rows of F bytes), from byte
// f0 on (T: int8_t rows, or uint8_t rows of packed 4-bit values).
template <typename I, typename T>
QT_ALWAYS_INLINE void prefetch_row(const I* ix, int64_t k, int64_t nnz, const T* q, int64_t F,
                                   int64_t f0, int64_t bytes) {
  if (k + kPrefetch < nnz) {
    const T* p = q + static_cast<int64_t>(ix[k + kPrefetch]) * F + f0;
    __builtin_prefetch(p);
    __builtin_prefetch(p + bytes - 1);
  }
}

}  // namespace csr_rows
}  // namespace qtrain
