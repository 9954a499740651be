// int8_spmm on the CPU (front: ops/int8_spmm.cpp; reference qtrain/ops/integer.py
// reference_int_spmm; CUDA twin cuda/int8_spmm_kernel.cu): GCINT's sparse product, int8
// edge values times int8 rows, exact int32 sums.
//
//   out[r] = saturate_int32(sum_k values[k] * q[indices[k]])     k = indptr[r] .. indptr[r+1]
//
// qspmm's copy form (cpu/qspmm_kernel.cpp) with an int8 factor per entry: one thread owns an
// output row and walks its entries in CSR order, the feature width in register tiles of
// W * NV int32 lanes (int8 -> int32 sign-extending loads, one multiply-add by the entry's
// value per lane), the neighbour row kPrefetch entries ahead prefetched; rows are handed out
// in small dynamic chunks (power-law degrees make static splits uneven). |value * q| <= 2^14,
// so int32 sums are exact for rows of at most 131071 entries; longer rows sum in int64 and
// saturate. Integer sums: the result does not depend on the thread count or the ISA.
//
// The front has checked dtypes, shapes and devices; what only the data shows is refused
// here: indptr not 0 .. nnz and non-decreasing (before any thread starts), an index outside
// q's rows (found in the row loop: the row is zeroed and the op raises after the loop).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/csr_rows.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/mem.h"
#include "cpu/threads.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace {

using csr_rows::check_indptr;
using csr_rows::kRowChunk;
using csr_rows::prefetch_row;
using csr_rows::row_in_range;
using sparse::Lanes;

// Longest row whose int32 sum cannot overflow: 2^14 per term (-128 * -128), 2^31 in all.
constexpr int64_t kMaxEntriesInt32 = (int64_t{1} << 31) / (int64_t{1} << 14) - 1;

struct Args {
  const void* indptr;
  const void* indices;
  const int8_t* values;
  const int8_t* q;
  int32_t* out;
  int64_t nnz;
  int64_t n_in;  // rows of q
  int64_t F;     // row width
};

// Lanes [f0, f0 + W NV) of one row.
template <int ISA, int NV, typename I>
QT_ALWAYS_INLINE void tile(const I* ix, const int8_t* val, int64_t b, int64_t e, int64_t nnz,
                           const int8_t* q, int64_t F, int64_t f0, int32_t* o) {
  using L = Lanes<ISA>;
  typename L::vi acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = typename L::vi{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, F, f0, L::W * NV);
    const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
    const int32_t w = val[k];
    for (int v = 0; v < NV; ++v) acc[v] += L::load(r + L::W * v) * w;
  }
  std::memcpy(o + f0, acc, sizeof acc);
}

template <int ISA, int NV, typename I>
QT_ALWAYS_INLINE void tile_n(int nv, const I* ix, const int8_t* val, int64_t b, int64_t e,
                             int64_t nnz, const int8_t* q, int64_t F, int64_t f0, int32_t* o) {
  if constexpr (NV >= 1) {
    if (nv == NV) {
      tile<ISA, NV>(ix, val, b, e, nnz, q, F, f0, o);
    } else {
      tile_n<ISA, NV - 1>(nv, ix, val, b, e, nnz, q, F, f0, o);
    }
  }
}

// Lanes [f0, F), fewer than W of them; ACC int32, or int64 for a long row (then saturated).
template <typename ACC, typename I>
QT_ALWAYS_INLINE void scalar_lanes(const I* ix, const int8_t* val, int64_t b, int64_t e,
                                   const int8_t* q, int64_t F, int64_t f0, int32_t* o) {
  for (; f0 < F; f0 += 16) {
    const int64_t nl = std::min<int64_t>(16, F - f0);
    ACC acc[16] = {};
    for (int64_t k = b; k < e; ++k) {
      const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
      const ACC w = val[k];
      for (int64_t t = 0; t < nl; ++t) acc[t] += w * r[t];
    }
    for (int64_t t = 0; t < nl; ++t) {
      const int64_t lo = std::numeric_limits<int32_t>::min();
      const int64_t hi = std::numeric_limits<int32_t>::max();
      o[f0 + t] = static_cast<int32_t>(std::min(hi, std::max(lo, static_cast<int64_t>(acc[t]))));
    }
  }
}

template <int ISA, int MAXNV, typename I>
QT_ALWAYS_INLINE bool rows_body(const Args& a, int64_t r0, int64_t r1) {
  constexpr int W = Lanes<ISA>::W;
  const I* ip = static_cast<const I*>(a.indptr);
  const I* ix = static_cast<const I*>(a.indices);
  const int64_t F = a.F;
  bool all_ok = true;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t b = static_cast<int64_t>(ip[r]);
    const int64_t e = static_cast<int64_t>(ip[r + 1]);
    int32_t* o = a.out + r * F;
    if (!row_in_range(ix, b, e, a.n_in)) {
      std::memset(o, 0, static_cast<size_t>(F) * sizeof(int32_t));
      all_ok = false;
      continue;
    }
    if (e - b > kMaxEntriesInt32) {
      scalar_lanes<int64_t>(ix, a.values, b, e, a.q, F, 0, o);
      continue;
    }
    int64_t f0 = 0;
    for (; f0 + W * MAXNV <= F; f0 += W * MAXNV) {
      tile<ISA, MAXNV>(ix, a.values, b, e, a.nnz, a.q, F, f0, o);
    }
    const int nv = static_cast<int>((F - f0) / W);
    if (nv > 0) {
      tile_n<ISA, MAXNV - 1>(nv, ix, a.values, b, e, a.nnz, a.q, F, f0, o);
      f0 += W * nv;
    }
    if (f0 < F) scalar_lanes<int32_t>(ix, a.values, b, e, a.q, F, f0, o);
  }
  return all_ok;
}

struct Kernels {
  bool (*rows_i32)(const Args&, int64_t, int64_t);
  bool (*rows_i64)(const Args&, int64_t, int64_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR, ISA, MAXNV)                                   \
  ATTR QT_FLATTEN bool rows_i32_##NAME(const Args& a, int64_t r0, int64_t r1) {     \
    return rows_body<ISA, MAXNV, int32_t>(a, r0, r1);                              \
  }                                                                                \
  ATTR QT_FLATTEN bool rows_i64_##NAME(const Args& a, int64_t r0, int64_t r1) {     \
    return rows_body<ISA, MAXNV, int64_t>(a, r0, r1);                              \
  }                                                                                \
  const Kernels kernels_##NAME = {rows_i32_##NAME, rows_i64_##NAME};

// Accumulator tiles of 8 registers: 8 zmm (128 lanes), 8 ymm (64), 8 xmm (32).
#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, isa::kDefault, 8)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, isa::kAvx2, 8)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, isa::kAvx512, 8)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

at::Tensor int8_spmm(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                     const at::Tensor& values_in, const at::Tensor& q_in) {
  constexpr const char* fn = "qtrain::int8_spmm";
  const bool wide =
      indptr_in.scalar_type() == at::kLong || indices_in.scalar_type() == at::kLong;
  const at::ScalarType it = wide ? at::kLong : at::kInt;
  const at::Tensor indptr = indptr_in.to(it).contiguous();
  const at::Tensor indices = indices_in.to(it).contiguous();
  const at::Tensor values = values_in.contiguous();
  const at::Tensor q = q_in.contiguous();
  const int64_t rows = indptr.numel() - 1;
  const int64_t nnz = indices.numel();
  at::Tensor out = at::empty({rows, q.size(1)}, q.options().dtype(at::kInt));
  if (wide) {
    check_indptr(fn, indptr.const_data_ptr<int64_t>(), rows, nnz);
  } else {
    check_indptr(fn, indptr.const_data_ptr<int32_t>(), rows, nnz);
  }
  if (rows == 0) return out;  // indptr = [0]: no entries either

  Args a{};
  a.indptr = indptr.const_data_ptr();
  a.indices = indices.const_data_ptr();
  a.values = values.const_data_ptr<int8_t>();
  a.q = q.const_data_ptr<int8_t>();
  a.out = out.mutable_data_ptr<int32_t>();
  advise_huge_pages(a.out, static_cast<size_t>(out.numel()) * sizeof(int32_t));
  a.nnz = nnz;
  a.n_in = q.size(0);
  a.F = q.size(1);

  const Kernels& K = kernels();
  const auto run = wide ? K.rows_i64 : K.rows_i32;
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  const int nt = plan_threads(nnz * a.F + rows * a.F, 1 << 16);
  std::atomic<bool> ok{true};
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
#endif
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * kRowChunk;
    if (!run(a, r0, std::min(rows, r0 + kRowChunk))) ok.store(false, std::memory_order_relaxed);
  }
  (void)nt;
  TORCH_CHECK_VALUE(ok.load(), fn, ": an entry of indices is outside [0, ", a.n_in,
                    ") (rows of q)");
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("int8_spmm", &qtrain::int8_spmm); }
