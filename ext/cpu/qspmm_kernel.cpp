// qspmm on the CPU (front: ops/qspmm.cpp): quantized SpMM on a CSR graph
// (tango-sc23 sec. 3.2-3.3); the definition is qtrain/ops/sparse.py (reference_qspmm):
//
//   copy:      out[r] = fl32(float(sum_k q[indices[k]]) * scale)             exact integer sum
//   weighted:  acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))  float32, CSR order
//              out[r] = fl32(acc[r] * scale)
//
// Each output row is computed by one thread, entries in CSR order, so the
// result does not depend on the thread count; rows are handed out in small
// dynamic chunks because power-law degrees make static splits uneven. The
// feature width is walked in register tiles of W * NV lanes (NV accumulators
// of the ISA's W lanes), each tile summing all
// of the row's entries before it is scaled and stored, with the neighbour
// row kPrefetch entries ahead prefetched. The copy form accumulates in int32
// (int8 -> int32 widening adds), which is exact for rows of degree below
// 2^31 / 128; longer rows take an int64 path.
//
// The front has checked dtypes, shapes and devices; what only the data shows is
// refused here: indptr not 0 .. nnz and non-decreasing (checked before any thread
// starts), an index outside q's rows or an eid outside weight's rows (found in the
// row loop: the row is zeroed and the op raises after the loop).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/sparse_operands.h"
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


struct SpmmArgs {
  const void* indptr;
  const void* indices;
  const void* eids;  // null: entry k uses weight row k
  const int8_t* q;
  const float* w;  // weighted form only (null when weight has no elements)
  float* out;
  int64_t nnz;
  int64_t n_in;  // rows of q
  int64_t n_w;   // rows of w
  int64_t F;     // H * D lanes per row
  int64_t H;
  int64_t D;
  int64_t Hw;  // weights per edge: 1 or H
  float scale;
  bool weighted;  // false: copy form
};

// ---------------------------------------------------------------- kernel bodies

// Lanes [f0, f0 + W NV) of one row, copy form.
template <int ISA, int NV, typename I>
QT_ALWAYS_INLINE void copy_tile(const I* ix, int64_t b, int64_t e, int64_t nnz, const int8_t* q,
                                int64_t F, int64_t f0, float scale, float* o) {
  using L = Lanes<ISA>;
  typename L::vi acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = typename L::vi{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, F, f0, L::W * NV);
    const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
    for (int v = 0; v < NV; ++v) acc[v] += L::load(r + L::W * v);
  }
  for (int v = 0; v < NV; ++v) {
    const typename L::vf y = __builtin_convertvector(acc[v], typename L::vf) * scale;
    std::memcpy(o + f0 + L::W * v, &y, sizeof y);
  }
}

// Fewer than W lanes [f0, f0 + nl), copy form.
template <typename I>
QT_ALWAYS_INLINE void copy_tail(const I* ix, int64_t b, int64_t e, const int8_t* q, int64_t F,
                                int64_t f0, int64_t nl, float scale, float* o) {
  int32_t acc[16] = {};  // nl < W <= 16
  for (int64_t k = b; k < e; ++k) {
    const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
    for (int64_t t = 0; t < nl; ++t) acc[t] += r[t];
  }
  for (int64_t t = 0; t < nl; ++t) o[f0 + t] = static_cast<float>(acc[t]) * scale;
}

// A row too long for int32 sums: int64 accumulators, 16 lanes at a time.
template <typename I>
QT_ALWAYS_INLINE void copy_row_wide(const I* ix, int64_t b, int64_t e, const int8_t* q,
                                    int64_t F, float scale, float* o) {
  for (int64_t f0 = 0; f0 < F; f0 += 16) {
    const int64_t nl = std::min<int64_t>(16, F - f0);
    int64_t acc[16] = {};
    for (int64_t k = b; k < e; ++k) {
      const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
      for (int64_t t = 0; t < nl; ++t) acc[t] += r[t];
    }
    for (int64_t t = 0; t < nl; ++t) o[f0 + t] = static_cast<float>(acc[t]) * scale;
  }
}

// Lanes [f0, f0 + W NV) of one row, weighted form; w_col selects the head's weight.
template <int ISA, int NV, typename I>
QT_ALWAYS_INLINE void weighted_tile(const I* ix, const I* ex, int64_t b, int64_t e, int64_t nnz,
                                    const int8_t* q, int64_t F, int64_t f0, const float* w,
                                    int64_t Hw, int64_t w_col, float scale, float* o) {
  using L = Lanes<ISA>;
  typename L::vf acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = typename L::vf{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, F, f0, L::W * NV);
    const int64_t eid = ex != nullptr ? static_cast<int64_t>(ex[k]) : k;
    const float wk = w[eid * Hw + w_col];
    const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
    for (int v = 0; v < NV; ++v) {
      const typename L::vf x = __builtin_convertvector(L::load(r + L::W * v), typename L::vf);
      acc[v] += x * wk;  // fl32(w * q) then the float32 add: -ffp-contract=off keeps them apart
    }
  }
  for (int v = 0; v < NV; ++v) {
    const typename L::vf y = acc[v] * scale;
    std::memcpy(o + f0 + L::W * v, &y, sizeof y);
  }
}

template <typename I>
QT_ALWAYS_INLINE void weighted_tail(const I* ix, const I* ex, int64_t b, int64_t e,
                                    const int8_t* q, int64_t F, int64_t f0, int64_t nl,
                                    const float* w, int64_t Hw, int64_t w_col, float scale,
                                    float* o) {
  float acc[16] = {};
  for (int64_t k = b; k < e; ++k) {
    const int64_t eid = ex != nullptr ? static_cast<int64_t>(ex[k]) : k;
    const float wk = w[eid * Hw + w_col];
    const int8_t* r = q + static_cast<int64_t>(ix[k]) * F + f0;
    for (int64_t t = 0; t < nl; ++t) acc[t] += wk * static_cast<float>(r[t]);
  }
  for (int64_t t = 0; t < nl; ++t) o[f0 + t] = acc[t] * scale;
}

// copy_tile<nv> for a run-time nv in 1..NV (the last partial group of W-lane chunks).
template <int ISA, int NV, typename I>
QT_ALWAYS_INLINE void copy_tile_n(int nv, const I* ix, int64_t b, int64_t e, int64_t nnz,
                                  const int8_t* q, int64_t F, int64_t f0, float scale, float* o) {
  if constexpr (NV >= 1) {
    if (nv == NV) {
      copy_tile<ISA, NV>(ix, b, e, nnz, q, F, f0, scale, o);
    } else {
      copy_tile_n<ISA, NV - 1>(nv, ix, b, e, nnz, q, F, f0, scale, o);
    }
  }
}

template <int ISA, int NV, typename I>
QT_ALWAYS_INLINE void weighted_tile_n(int nv, const I* ix, const I* ex, int64_t b, int64_t e,
                                      int64_t nnz, const int8_t* q, int64_t F, int64_t f0,
                                      const float* w, int64_t Hw, int64_t w_col, float scale,
                                      float* o) {
  if constexpr (NV >= 1) {
    if (nv == NV) {
      weighted_tile<ISA, NV>(ix, ex, b, e, nnz, q, F, f0, w, Hw, w_col, scale, o);
    } else {
      weighted_tile_n<ISA, NV - 1>(nv, ix, ex, b, e, nnz, q, F, f0, w, Hw, w_col, scale, o);
    }
  }
}

// A whole row, copy form: tiles of W * MAXNV lanes, then W * nv, then a scalar tail.
template <int ISA, int MAXNV, typename I>
QT_ALWAYS_INLINE void copy_row(const I* ix, int64_t b, int64_t e, int64_t nnz, const int8_t* q,
                               int64_t F, float scale, float* o) {
  constexpr int W = Lanes<ISA>::W;
  int64_t f0 = 0;
  for (; f0 + W * MAXNV <= F; f0 += W * MAXNV) {
    copy_tile<ISA, MAXNV>(ix, b, e, nnz, q, F, f0, scale, o);
  }
  const int nv = static_cast<int>((F - f0) / W);
  if (nv > 0) {
    copy_tile_n<ISA, MAXNV - 1>(nv, ix, b, e, nnz, q, F, f0, scale, o);
    f0 += W * nv;
  }
  if (f0 < F) copy_tail(ix, b, e, q, F, f0, F - f0, scale, o);
}

// Lanes [lo, hi) of a row, weighted form with weight column w_col.
template <int ISA, int MAXNV, typename I>
QT_ALWAYS_INLINE void weighted_lanes(const I* ix, const I* ex, int64_t b, int64_t e, int64_t nnz,
                                     const int8_t* q, int64_t F, int64_t lo, int64_t hi,
                                     const float* w, int64_t Hw, int64_t w_col, float scale,
                                     float* o) {
  constexpr int W = Lanes<ISA>::W;
  int64_t f0 = lo;
  for (; f0 + W * MAXNV <= hi; f0 += W * MAXNV) {
    weighted_tile<ISA, MAXNV>(ix, ex, b, e, nnz, q, F, f0, w, Hw, w_col, scale, o);
  }
  const int nv = static_cast<int>((hi - f0) / W);
  if (nv > 0) {
    weighted_tile_n<ISA, MAXNV - 1>(nv, ix, ex, b, e, nnz, q, F, f0, w, Hw, w_col, scale, o);
    f0 += W * nv;
  }
  if (f0 < hi) weighted_tail(ix, ex, b, e, q, F, f0, hi - f0, w, Hw, w_col, scale, o);
}

template <int ISA, int MAXNV, typename I>
QT_ALWAYS_INLINE bool rows_body(const SpmmArgs& a, int64_t r0, int64_t r1) {
  const I* ip = static_cast<const I*>(a.indptr);
  const I* ix = static_cast<const I*>(a.indices);
  const I* ex = static_cast<const I*>(a.eids);
  const int64_t F = a.F;
  bool all_ok = true;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t b = static_cast<int64_t>(ip[r]);
    const int64_t e = static_cast<int64_t>(ip[r + 1]);
    float* o = a.out + r * F;
    bool ok = row_in_range(ix, b, e, a.n_in);
    if (a.weighted && ex != nullptr) ok &= row_in_range(ex, b, e, a.n_w);
    if (!ok) {
      for (int64_t f = 0; f < F; ++f) o[f] = 0.0f;
      all_ok = false;
      continue;
    }
    if (!a.weighted) {
      if (e - b > sparse::kMaxDegreeInt32) {
        copy_row_wide(ix, b, e, a.q, F, a.scale, o);
        continue;
      }
      copy_row<ISA, MAXNV>(ix, b, e, a.nnz, a.q, F, a.scale, o);
    } else {
      // One weight per edge: tile the whole row. One per head: tile each head's D lanes.
      const int64_t groups = a.Hw == 1 ? 1 : a.H;
      const int64_t width = a.Hw == 1 ? F : a.D;
      for (int64_t h = 0; h < groups; ++h) {
        weighted_lanes<ISA, MAXNV>(ix, ex, b, e, a.nnz, a.q, F, h * width, (h + 1) * width, a.w,
                                   a.Hw, h, a.scale, o);
      }
    }
  }
  return all_ok;
}

// ---------------------------------------------------------------- ISA variants

struct Kernels {
  bool (*rows_i32)(const SpmmArgs&, int64_t, int64_t);
  bool (*rows_i64)(const SpmmArgs&, int64_t, int64_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR, ISA, MAXNV)                                  \
  ATTR QT_FLATTEN bool rows_i32_##NAME(const SpmmArgs& a, int64_t r0, int64_t r1) { \
    return rows_body<ISA, MAXNV, int32_t>(a, r0, r1);                             \
  }                                                                               \
  ATTR QT_FLATTEN bool rows_i64_##NAME(const SpmmArgs& a, int64_t r0, int64_t r1) { \
    return rows_body<ISA, MAXNV, int64_t>(a, r0, r1);                             \
  }                                                                               \
  const Kernels kernels_##NAME = {rows_i32_##NAME, rows_i64_##NAME};

// Accumulator tiles of 8 registers: 8 zmm (128 lanes), 8 ymm (64), 8 xmm (32).
#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, isa::kDefault, 8)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, isa::kAvx2, 8)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, isa::kAvx512, 8)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- op

at::Tensor qspmm(const at::Tensor& indptr_in, const at::Tensor& indices_in, const at::Tensor& q_in,
                 double scale, const std::optional<at::Tensor>& weight_in,
                 const std::optional<at::Tensor>& eids_in) {
  constexpr const char* fn = "qtrain::qspmm";
  const sparse_operands::Spmm s =
      sparse_operands::spmm(indptr_in, indices_in, q_in, weight_in, eids_in);
  const bool weighted = s.weighted, wide = s.wide, has_eids = s.eids.defined();
  const at::Tensor &indptr = s.indptr, &indices = s.indices, &eids = s.eids, &q = s.q, &w = s.w,
                   &out = s.out;
  const int64_t rows = s.rows, nnz = s.nnz, H = s.H, D = s.D, Hw = s.Hw;

  if (wide) {
    check_indptr(fn, indptr.const_data_ptr<int64_t>(), rows, nnz);
  } else {
    check_indptr(fn, indptr.const_data_ptr<int32_t>(), rows, nnz);
  }
  if (rows == 0) return out;

  SpmmArgs a{};
  a.indptr = indptr.const_data_ptr();
  a.indices = indices.const_data_ptr();
  a.eids = has_eids ? eids.const_data_ptr() : nullptr;
  a.q = q.const_data_ptr<int8_t>();
  a.w = weighted ? w.const_data_ptr<float>() : nullptr;
  a.out = out.mutable_data_ptr<float>();
  advise_huge_pages(a.out, static_cast<size_t>(out.numel()) * sizeof(float));
  a.nnz = nnz;
  a.n_in = q.size(0);
  a.n_w = weighted ? w.size(0) : 0;
  a.F = H * D;
  a.H = H;
  a.D = D;
  a.Hw = Hw;
  a.scale = static_cast<float>(scale);
  a.weighted = weighted;

  const Kernels& K = kernels();
  const auto run = wide ? K.rows_i64 : K.rows_i32;
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  const int nt = plan_threads(nnz * std::max<int64_t>(a.F, 1) + rows * a.F, 1 << 16);
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
                    ") (rows of q)", has_eids ? " or of eids outside [0, " : "",
                    has_eids ? std::to_string(a.n_w) : std::string(),
                    has_eids ? ") (rows of weight)" : "");
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("qspmm", &qtrain::qspmm); }
