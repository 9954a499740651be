// The body of the CPU quantized SpMM, shared by qspmm (int8 rows, cpu/qspmm_kernel.cpp) and
// qspmm4 (4-bit values packed two per byte, cpu/qspmm4_kernel.cpp): one body, templated on
// how a row's values are loaded (Row: Int8Rows or Int4Rows), so both ops sum the same
// values in the same order and qspmm4 is bit for bit qspmm of the unpacked rows.
//
//   copy:      out[r] = fl32(float(sum_k q[indices[k]]) * scale)             exact integer sum
//   weighted:  acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))  float32
//              out[r] = fl32(acc[r] * scale)
//   row_scale: w[eids[k], h] above is fl32(w[eids[k], h] * row_scale[indices[k], h]) (w
//              taken as 1 without weight), read as the entry is gathered
//
// Work is handed out by the merge path (common/merge_path.h, qtrain/ops/partition.py):
// units of P items (rows' ends plus entries), so a hub row of a power-law graph is split
// across units and threads instead of holding one thread. A row inside one unit is
// summed in CSR order; a split row is summed piece by piece (each piece in CSR order)
// and its pieces added in unit order afterwards (reference_spmm_by_units), the order
// the CUDA kernel uses too, so the two agree bit for bit at any thread count. The copy
// form sums in int32 within a piece (at most P <= 2^16 entries: exact, and exact again
// as float32) and in int64 across pieces, so it is the exact integer sum at any degree.
// The feature width is walked in register tiles of W * NV lanes (NV accumulators of
// the ISA's W lanes), each tile summing all of a piece's entries before it is scaled
// and stored, with the neighbour row kPrefetch entries ahead prefetched. Each output
// lane is its own sum, so how the lanes are tiled never changes a result.
//
// A row is walked in segments: the whole row, or one segment per head where each head
// has its own weight (per-head weights) or its own byte-aligned start (packed rows with
// an odd width and several heads: every head's values start on a byte).
//
// The front has checked dtypes, shapes and devices; what only the data shows is
// refused here: indptr not 0 .. nnz and non-decreasing (checked before any thread
// starts), an index outside q's rows or an eid outside weight's rows (found as the
// pieces are read; the op raises after the loop).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/merge_path.h"
#include "common/sparse_operands.h"
#include "cpu/csr_rows.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/mem.h"
#include "cpu/threads.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace spmm_cpu {

using csr_rows::check_indptr;
using csr_rows::prefetch_row;
using csr_rows::row_in_range;
using sparse::Lanes;

// how a row is read: sparse::Int8Rows (qspmm) or sparse::Int4Rows (qspmm4), cpu/lanes.h
using sparse::Int4Rows;
using sparse::Int8Rows;

template <class Row>
struct SpmmArgs {
  using T = typename Row::T;
  const void* indptr;
  const void* indices;
  const void* eids;  // null: entry k uses weight row k
  const T* q;
  const float* w;   // weighted form with a weight only (null when it has no elements)
  const float* rs;  // row_scale (null when absent)
  float* out;
  float* carry;               // [units, F]: the piece of the row in progress at a unit's end
  const int64_t* row_start;   // the merge-path partition (common/merge_path.h)
  const int64_t* entry_start;
  int64_t per_unit;
  int64_t rows;
  int64_t nnz;
  int64_t n_in;    // rows of q
  int64_t n_w;     // rows of w
  int64_t F;       // H * D output lanes per row
  int64_t H;
  int64_t D;
  int64_t Hw;      // weights per edge: 1 or H
  int64_t Hr;      // row scales per input row: 1 or H
  int64_t stride;  // elements (T) per row of q
  int64_t Ds;      // elements (T) per head of q's rows
  float scale;
  bool weighted;     // false: copy form
  bool split_heads;  // walk each head as its own segment (its values start on an element)
};

// The weighted form's weight of an entry in one segment (a head, or the whole row):
// w[eid, w_col] (1 without weight) times row_scale[src, r_col] (when given), in float32.
struct EntryWeight {
  const float* w;
  const float* rs;
  int64_t Hw, w_col, Hr, r_col;
  QT_ALWAYS_INLINE float at(int64_t eid, int64_t src) const {
    float wk = w != nullptr ? w[eid * Hw + w_col] : 1.0f;
    if (rs != nullptr) wk *= rs[src * Hr + r_col];
    return wk;
  }
  // the row scale of entry k + kPrefetch's source (a random read), as prefetch_row does its row
  template <typename I>
  QT_ALWAYS_INLINE void prefetch(const I* ix, int64_t k, int64_t nnz) const {
    if (rs != nullptr && k + csr_rows::kPrefetch < nnz) {
      __builtin_prefetch(rs + static_cast<int64_t>(ix[k + csr_rows::kPrefetch]) * Hr + r_col);
    }
  }
};

// ---------------------------------------------------------------- kernel bodies
//
// q is a segment's first element in row 0 and `stride` the elements per row; lanes are
// counted from the segment's start and o is the segment's first output lane.

// Lanes [f0, f0 + W NV) of one segment, copy form.
template <int ISA, int NV, class Row, typename I>
QT_ALWAYS_INLINE void copy_tile(const I* ix, int64_t b, int64_t e, int64_t nnz,
                                const typename Row::T* q, int64_t stride, int64_t f0, float scale,
                                float* o) {
  using L = Lanes<ISA>;
  typename L::vi acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = typename L::vi{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, stride, Row::bytes(f0), Row::bytes(L::W * NV));
    const typename Row::T* r = q + static_cast<int64_t>(ix[k]) * stride + Row::bytes(f0);
    for (int v = 0; v < NV; ++v) acc[v] += Row::template load<ISA>(r + Row::bytes(L::W * v));
  }
  for (int v = 0; v < NV; ++v) {
    const typename L::vf y = __builtin_convertvector(acc[v], typename L::vf) * scale;
    std::memcpy(o + f0 + L::W * v, &y, sizeof y);
  }
}

// Fewer than W lanes [f0, f0 + nl), copy form.
template <class Row, typename I>
QT_ALWAYS_INLINE void copy_tail(const I* ix, int64_t b, int64_t e, const typename Row::T* q,
                                int64_t stride, int64_t f0, int64_t nl, float scale, float* o) {
  int32_t acc[16] = {};  // nl < W <= 16
  for (int64_t k = b; k < e; ++k) {
    const typename Row::T* r = q + static_cast<int64_t>(ix[k]) * stride;
    for (int64_t t = 0; t < nl; ++t) acc[t] += Row::value(r, f0 + t);
  }
  for (int64_t t = 0; t < nl; ++t) o[f0 + t] = static_cast<float>(acc[t]) * scale;
}

// Lanes [f0, f0 + W NV) of one segment, weighted form; ew gives the entries' weights.
template <int ISA, int NV, class Row, typename I>
QT_ALWAYS_INLINE void weighted_tile(const I* ix, const I* ex, int64_t b, int64_t e, int64_t nnz,
                                    const typename Row::T* q, int64_t stride, int64_t f0,
                                    const EntryWeight& ew, float scale, float* o) {
  using L = Lanes<ISA>;
  typename L::vf acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = typename L::vf{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, stride, Row::bytes(f0), Row::bytes(L::W * NV));
    if (f0 == 0) ew.prefetch(ix, k, nnz);
    const int64_t eid = ex != nullptr ? static_cast<int64_t>(ex[k]) : k;
    const int64_t src = static_cast<int64_t>(ix[k]);
    const float wk = ew.at(eid, src);
    const typename Row::T* r = q + src * stride + Row::bytes(f0);
    for (int v = 0; v < NV; ++v) {
      const typename L::vf x = __builtin_convertvector(
          Row::template load<ISA>(r + Row::bytes(L::W * v)), typename L::vf);
      acc[v] += x * wk;  // fl32(w * q) then the float32 add: -ffp-contract=off keeps them apart
    }
  }
  for (int v = 0; v < NV; ++v) {
    const typename L::vf y = acc[v] * scale;
    std::memcpy(o + f0 + L::W * v, &y, sizeof y);
  }
}

template <class Row, typename I>
QT_ALWAYS_INLINE void weighted_tail(const I* ix, const I* ex, int64_t b, int64_t e,
                                    const typename Row::T* q, int64_t stride, int64_t f0,
                                    int64_t nl, const EntryWeight& ew, float scale, float* o) {
  float acc[16] = {};
  for (int64_t k = b; k < e; ++k) {
    const int64_t eid = ex != nullptr ? static_cast<int64_t>(ex[k]) : k;
    const int64_t src = static_cast<int64_t>(ix[k]);
    const float wk = ew.at(eid, src);
    const typename Row::T* r = q + src * stride;
    for (int64_t t = 0; t < nl; ++t) acc[t] += wk * static_cast<float>(Row::value(r, f0 + t));
  }
  for (int64_t t = 0; t < nl; ++t) o[f0 + t] = acc[t] * scale;
}

// ---------------------------------------------------------------- packed rows, in pairs
//
// Tiles of packed rows (Row::kNibblePairs) read W bytes at a time as int8 lanes: each
// byte's low nibble (shifted up and back, sign-extending) is an even value and its high
// nibble (an arithmetic shift of the sign-extended byte) the odd one after it, so 2W values
// take one widening load and three shifts instead of two in-order nibble loads. The even
// and odd values of each W bytes sum in accumulators of their own, interleaved into value
// order as the tile is stored: every output lane still sums the same values in the same
// order, so the results are those of the in-order tiles bit for bit.

// The 2W values of the W bytes at p: even[t] is value 2t, odd[t] value 2t + 1.
template <int ISA>
QT_ALWAYS_INLINE void load_nibble_pairs(const uint8_t* p, typename Lanes<ISA>::vi& even,
                                        typename Lanes<ISA>::vi& odd) {
  using vi = typename Lanes<ISA>::vi;
  typedef uint32_t vu __attribute__((vector_size(sizeof(vi))));
  const vi bytes = Lanes<ISA>::load(reinterpret_cast<const int8_t*>(p));
  even = reinterpret_cast<vi>(reinterpret_cast<vu>(bytes) << 28) >> 28;
  odd = bytes >> 4;
}

// Half H (0: lanes 0 .. W/2 - 1, 1: the rest) of a and b interleaved: a[h], b[h], a[h + 1], ...
template <int W, int H, typename V, size_t... J>
QT_ALWAYS_INLINE V zip_half(V a, V b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, ((J % 2) ? W + H * W / 2 + J / 2 : H * W / 2 + J / 2)...);
}

// Stores 2W values at o in value order: even[t] at o[2t], odd[t] at o[2t + 1].
template <int ISA>
QT_ALWAYS_INLINE void store_interleaved(float* o, typename Lanes<ISA>::vf even,
                                        typename Lanes<ISA>::vf odd) {
  constexpr int W = Lanes<ISA>::W;
  const auto lo = zip_half<W, 0>(even, odd, std::make_index_sequence<W>{});
  const auto hi = zip_half<W, 1>(even, odd, std::make_index_sequence<W>{});
  std::memcpy(o, &lo, sizeof lo);
  std::memcpy(o + W, &hi, sizeof hi);
}

// Values [f0, f0 + 2W NP) of one packed segment (f0 a multiple of 2W), copy form.
template <int ISA, int NP, typename I>
QT_ALWAYS_INLINE void copy_pairs_tile(const I* ix, int64_t b, int64_t e, int64_t nnz,
                                      const uint8_t* q, int64_t stride, int64_t f0, float scale,
                                      float* o) {
  using L = Lanes<ISA>;
  typename L::vi even[NP], odd[NP];
  for (int u = 0; u < NP; ++u) even[u] = odd[u] = typename L::vi{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, stride, f0 / 2, int64_t{L::W} * NP);
    const uint8_t* r = q + static_cast<int64_t>(ix[k]) * stride + f0 / 2;
    for (int u = 0; u < NP; ++u) {
      typename L::vi ev, od;
      load_nibble_pairs<ISA>(r + L::W * u, ev, od);
      even[u] += ev;
      odd[u] += od;
    }
  }
  for (int u = 0; u < NP; ++u) {
    store_interleaved<ISA>(o + f0 + 2 * L::W * u,
                           __builtin_convertvector(even[u], typename L::vf) * scale,
                           __builtin_convertvector(odd[u], typename L::vf) * scale);
  }
}

// Values [f0, f0 + 2W NP) of one packed segment, weighted form.
template <int ISA, int NP, typename I>
QT_ALWAYS_INLINE void weighted_pairs_tile(const I* ix, const I* ex, int64_t b, int64_t e,
                                          int64_t nnz, const uint8_t* q, int64_t stride,
                                          int64_t f0, const EntryWeight& ew, float scale,
                                          float* o) {
  using L = Lanes<ISA>;
  using vf = typename L::vf;
  vf even[NP], odd[NP];
  for (int u = 0; u < NP; ++u) even[u] = odd[u] = vf{};
  for (int64_t k = b; k < e; ++k) {
    prefetch_row(ix, k, nnz, q, stride, f0 / 2, int64_t{L::W} * NP);
    if (f0 == 0) ew.prefetch(ix, k, nnz);
    const int64_t eid = ex != nullptr ? static_cast<int64_t>(ex[k]) : k;
    const int64_t src = static_cast<int64_t>(ix[k]);
    const float wk = ew.at(eid, src);
    const uint8_t* r = q + src * stride + f0 / 2;
    for (int u = 0; u < NP; ++u) {
      typename L::vi ev, od;
      load_nibble_pairs<ISA>(r + L::W * u, ev, od);
      even[u] += __builtin_convertvector(ev, vf) * wk;  // fl32(w * q), then the add
      odd[u] += __builtin_convertvector(od, vf) * wk;
    }
  }
  for (int u = 0; u < NP; ++u) {
    store_interleaved<ISA>(o + f0 + 2 * L::W * u, even[u] * scale, odd[u] * scale);
  }
}

// copy_pairs_tile<np> / weighted_pairs_tile<np> for a run-time np in 1..NP.
template <int ISA, int NP, typename I>
QT_ALWAYS_INLINE void copy_pairs_tile_n(int np, const I* ix, int64_t b, int64_t e, int64_t nnz,
                                        const uint8_t* q, int64_t stride, int64_t f0,
                                        float scale, float* o) {
  if constexpr (NP >= 1) {
    if (np == NP) {
      copy_pairs_tile<ISA, NP>(ix, b, e, nnz, q, stride, f0, scale, o);
    } else {
      copy_pairs_tile_n<ISA, NP - 1>(np, ix, b, e, nnz, q, stride, f0, scale, o);
    }
  }
}

template <int ISA, int NP, typename I>
QT_ALWAYS_INLINE void weighted_pairs_tile_n(int np, const I* ix, const I* ex, int64_t b,
                                            int64_t e, int64_t nnz, const uint8_t* q,
                                            int64_t stride, int64_t f0, const EntryWeight& ew,
                                            float scale, float* o) {
  if constexpr (NP >= 1) {
    if (np == NP) {
      weighted_pairs_tile<ISA, NP>(ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
    } else {
      weighted_pairs_tile_n<ISA, NP - 1>(np, ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
    }
  }
}

// copy_tile<nv> for a run-time nv in 1..NV (the last partial group of W-lane chunks).
template <int ISA, int NV, class Row, typename I>
QT_ALWAYS_INLINE void copy_tile_n(int nv, const I* ix, int64_t b, int64_t e, int64_t nnz,
                                  const typename Row::T* q, int64_t stride, int64_t f0,
                                  float scale, float* o) {
  if constexpr (NV >= 1) {
    if (nv == NV) {
      copy_tile<ISA, NV, Row>(ix, b, e, nnz, q, stride, f0, scale, o);
    } else {
      copy_tile_n<ISA, NV - 1, Row>(nv, ix, b, e, nnz, q, stride, f0, scale, o);
    }
  }
}

template <int ISA, int NV, class Row, typename I>
QT_ALWAYS_INLINE void weighted_tile_n(int nv, const I* ix, const I* ex, int64_t b, int64_t e,
                                      int64_t nnz, const typename Row::T* q, int64_t stride,
                                      int64_t f0, const EntryWeight& ew, float scale, float* o) {
  if constexpr (NV >= 1) {
    if (nv == NV) {
      weighted_tile<ISA, NV, Row>(ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
    } else {
      weighted_tile_n<ISA, NV - 1, Row>(nv, ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
    }
  }
}

// A segment of n lanes, copy form: tiles of W * MAXNV lanes, then W * nv, then a scalar tail.
template <int ISA, int MAXNV, class Row, typename I>
QT_ALWAYS_INLINE void copy_lanes(const I* ix, int64_t b, int64_t e, int64_t nnz,
                                 const typename Row::T* q, int64_t stride, int64_t n, float scale,
                                 float* o) {
  constexpr int W = Lanes<ISA>::W;
  int64_t f0 = 0;
  if constexpr (Row::kNibblePairs) {  // whole tiles of 2W values; what is left below
    constexpr int NP = MAXNV / 2;
    for (; f0 + 2 * W * NP <= n; f0 += 2 * W * NP) {
      copy_pairs_tile<ISA, NP>(ix, b, e, nnz, q, stride, f0, scale, o);
    }
    const int np = static_cast<int>((n - f0) / (2 * W));
    if (np > 0) {
      copy_pairs_tile_n<ISA, NP - 1>(np, ix, b, e, nnz, q, stride, f0, scale, o);
      f0 += 2 * W * np;
    }
  }
  for (; f0 + W * MAXNV <= n; f0 += W * MAXNV) {
    copy_tile<ISA, MAXNV, Row>(ix, b, e, nnz, q, stride, f0, scale, o);
  }
  const int nv = static_cast<int>((n - f0) / W);
  if (nv > 0) {
    copy_tile_n<ISA, MAXNV - 1, Row>(nv, ix, b, e, nnz, q, stride, f0, scale, o);
    f0 += W * nv;
  }
  if (f0 < n) copy_tail<Row>(ix, b, e, q, stride, f0, n - f0, scale, o);
}

// A segment of n lanes, weighted form with the entries' weights ew.
template <int ISA, int MAXNV, class Row, typename I>
QT_ALWAYS_INLINE void weighted_lanes(const I* ix, const I* ex, int64_t b, int64_t e, int64_t nnz,
                                     const typename Row::T* q, int64_t stride, int64_t n,
                                     const EntryWeight& ew, float scale, float* o) {
  constexpr int W = Lanes<ISA>::W;
  int64_t f0 = 0;
  if constexpr (Row::kNibblePairs) {  // whole tiles of 2W values; what is left below
    constexpr int NP = MAXNV / 2;
    for (; f0 + 2 * W * NP <= n; f0 += 2 * W * NP) {
      weighted_pairs_tile<ISA, NP>(ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
    }
    const int np = static_cast<int>((n - f0) / (2 * W));
    if (np > 0) {
      weighted_pairs_tile_n<ISA, NP - 1>(np, ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
      f0 += 2 * W * np;
    }
  }
  for (; f0 + W * MAXNV <= n; f0 += W * MAXNV) {
    weighted_tile<ISA, MAXNV, Row>(ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
  }
  const int nv = static_cast<int>((n - f0) / W);
  if (nv > 0) {
    weighted_tile_n<ISA, MAXNV - 1, Row>(nv, ix, ex, b, e, nnz, q, stride, f0, ew, scale, o);
    f0 += W * nv;
  }
  if (f0 < n) weighted_tail<Row>(ix, ex, b, e, q, stride, f0, n - f0, ew, scale, o);
}

// Entries [lo, hi) of row r (a whole row or a piece of one) into dst, scaled by s.
template <int ISA, int MAXNV, class Row, typename I>
QT_ALWAYS_INLINE bool piece(const SpmmArgs<Row>& a, int64_t lo, int64_t hi, float s, float* dst) {
  const I* ix = static_cast<const I*>(a.indices);
  const I* ex = static_cast<const I*>(a.eids);
  bool ok = row_in_range(ix, lo, hi, a.n_in);
  if (a.weighted && ex != nullptr) ok &= row_in_range(ex, lo, hi, a.n_w);
  if (!ok) return false;  // the op raises: dst is left as it is
  // One segment for the whole row, or one per head (D lanes from element h * Ds).
  const bool per_head = a.split_heads || (a.weighted && (a.Hw != 1 || a.Hr != 1));
  const int64_t groups = per_head ? a.H : 1;
  const int64_t width = per_head ? a.D : a.F;
  for (int64_t h = 0; h < groups; ++h) {
    const typename Row::T* q = a.q + h * a.Ds;
    if (!a.weighted) {
      copy_lanes<ISA, MAXNV, Row>(ix, lo, hi, a.nnz, q, a.stride, width, s, dst + h * width);
    } else {
      const EntryWeight ew{a.w, a.rs, a.Hw, a.Hw == 1 ? 0 : h, a.Hr, a.Hr == 1 ? 0 : h};
      weighted_lanes<ISA, MAXNV, Row>(ix, ex, lo, hi, a.nnz, q, a.stride, width, ew, s,
                                      dst + h * width);
    }
  }
  return true;
}

// Unit u of the merge path: the rows that end in it (row_start[u] .. row_start[u+1]) and
// the piece of the row in progress at its end. A row begun and ended here is written
// scaled; the last piece of a split row is written raw (scale 1) into its output row and
// a piece of the row in progress into carry[u], for fix_split_row.
template <int ISA, int MAXNV, class Row, typename I>
QT_ALWAYS_INLINE bool unit_body(const SpmmArgs<Row>& a, int64_t u) {
  const I* ip = static_cast<const I*>(a.indptr);
  const int64_t rs = a.row_start[u], re = a.row_start[u + 1];
  const int64_t es = a.entry_start[u], ee = a.entry_start[u + 1];
  bool ok = true;
  for (int64_t r = rs; r < re; ++r) {
    const int64_t b = static_cast<int64_t>(ip[r]);
    const bool whole = b >= es;
    ok &= piece<ISA, MAXNV, Row, I>(a, whole ? b : es, static_cast<int64_t>(ip[r + 1]),
                                    whole ? a.scale : 1.0f, a.out + r * a.F);
  }
  if (re < a.rows) {
    const int64_t lo = std::max(static_cast<int64_t>(ip[re]), es);
    if (lo < ee) ok &= piece<ISA, MAXNV, Row, I>(a, lo, ee, 1.0f, a.carry + u * a.F);
  }
  return ok;
}

// The row split across units u_first .. u (its first item in u_first, its end in u): its
// pieces added in unit order (float32 adds for the weighted form; exact integers for the
// copy form, whose pieces are float32 integers of at most 2^24), then scaled.
template <class Row, typename I>
inline void fix_split_row(const SpmmArgs<Row>& a, int64_t u) {
  const I* ip = static_cast<const I*>(a.indptr);
  const int64_t r = a.row_start[u];
  if (r >= a.row_start[u + 1] || static_cast<int64_t>(ip[r]) >= a.entry_start[u]) return;
  const int64_t first = (static_cast<int64_t>(ip[r]) + r) / a.per_unit;
  const bool last_piece = a.entry_start[u] < static_cast<int64_t>(ip[r + 1]);
  float* o = a.out + r * a.F;
  for (int64_t f = 0; f < a.F; ++f) {
    if (a.weighted) {
      float acc = 0.0f;
      for (int64_t v = first; v < u; ++v) acc += a.carry[v * a.F + f];
      if (last_piece) acc += o[f];
      o[f] = acc * a.scale;
    } else {
      int64_t acc = 0;
      for (int64_t v = first; v < u; ++v) acc += static_cast<int64_t>(a.carry[v * a.F + f]);
      if (last_piece) acc += static_cast<int64_t>(o[f]);
      o[f] = static_cast<float>(acc) * a.scale;
    }
  }
}

// ---------------------------------------------------------------- ISA variants

template <class Row>
struct Kernels {
  bool (*unit_i32)(const SpmmArgs<Row>&, int64_t);
  bool (*unit_i64)(const SpmmArgs<Row>&, int64_t);
  void (*fix_i32)(const SpmmArgs<Row>&, int64_t);
  void (*fix_i64)(const SpmmArgs<Row>&, int64_t);
};

// The table kernels_<NAME> of one ISA variant for rows read by ROW (in the including
// file's anonymous namespace). Accumulator tiles of 8 registers: 8 zmm (128 lanes),
// 8 ymm (64), 8 xmm (32).
#define QT_DEFINE_SPMM_VARIANT(ROW, NAME, ATTR, ISA)                                        \
  ATTR QT_FLATTEN bool unit_i32_##NAME(const ::qtrain::spmm_cpu::SpmmArgs<ROW>& a,            \
                                       int64_t u) {                                          \
    return ::qtrain::spmm_cpu::unit_body<ISA, 8, ROW, int32_t>(a, u);                         \
  }                                                                                          \
  ATTR QT_FLATTEN bool unit_i64_##NAME(const ::qtrain::spmm_cpu::SpmmArgs<ROW>& a,            \
                                       int64_t u) {                                          \
    return ::qtrain::spmm_cpu::unit_body<ISA, 8, ROW, int64_t>(a, u);                         \
  }                                                                                          \
  const ::qtrain::spmm_cpu::Kernels<ROW> kernels_##NAME = {                                  \
      unit_i32_##NAME, unit_i64_##NAME, ::qtrain::spmm_cpu::fix_split_row<ROW, int32_t>,     \
      ::qtrain::spmm_cpu::fix_split_row<ROW, int64_t>};

// ---------------------------------------------------------------- op

// The op on prepared operands (s.q: int8 rows, or packed rows whose width s.D the front
// has checked); fn names the op and q_name its rows in errors.
template <class Row>
at::Tensor run(const char* fn, const char* q_name, const Kernels<Row>& K,
               const sparse_operands::Spmm& s, double scale) {
  const bool weighted = s.weighted, wide = s.wide, has_eids = s.eids.defined();
  const at::Tensor &indptr = s.indptr, &indices = s.indices, &eids = s.eids, &q = s.q, &w = s.w,
                   &out = s.out;
  const int64_t rows = s.rows, nnz = s.nnz, H = s.H, D = s.D, Hw = s.Hw;
  const bool has_w = s.w.defined() && s.w.numel() > 0;

  if (wide) {
    check_indptr(fn, indptr.const_data_ptr<int64_t>(), rows, nnz);
  } else {
    check_indptr(fn, indptr.const_data_ptr<int32_t>(), rows, nnz);
  }
  if (rows == 0) return out;

  SpmmArgs<Row> a{};
  a.indptr = indptr.const_data_ptr();
  a.indices = indices.const_data_ptr();
  a.eids = has_eids ? eids.const_data_ptr() : nullptr;
  a.q = static_cast<const typename Row::T*>(q.const_data_ptr());
  a.w = has_w ? w.const_data_ptr<float>() : nullptr;
  a.rs = s.rs.defined() ? s.rs.const_data_ptr<float>() : nullptr;
  a.out = out.mutable_data_ptr<float>();
  advise_huge_pages(a.out, static_cast<size_t>(out.numel()) * sizeof(float));
  a.nnz = nnz;
  a.n_in = q.size(0);
  a.n_w = w.defined() ? w.size(0) : 0;
  a.F = H * D;
  a.H = H;
  a.D = D;
  a.Hw = Hw;
  a.Hr = s.Hr;
  a.Ds = q.size(-1);
  a.stride = H * a.Ds;
  // a head of packed rows of odd width ends in a half byte: the next starts on a byte
  a.split_heads = H > 1 && Row::bytes(D) != a.Ds;
  a.scale = static_cast<float>(scale);
  a.weighted = weighted;

  // Units of equal work (rows' ends plus entries), handed out dynamically; then the rows
  // split across units are summed from their pieces, each by one thread.
  const merge_path::Partition part = merge_path::partition(indptr, nnz);
  const at::Tensor carry = at::empty({part.units, a.F}, out.options());
  a.carry = carry.mutable_data_ptr<float>();
  a.row_start = part.row_start.const_data_ptr<int64_t>();
  a.entry_start = part.entry_start.const_data_ptr<int64_t>();
  a.per_unit = part.per_unit;
  a.rows = rows;
  const auto unit = wide ? K.unit_i64 : K.unit_i32;
  const auto fix = wide ? K.fix_i64 : K.fix_i32;
  const int64_t units = part.units;
  const int nt = plan_threads(nnz * std::max<int64_t>(a.F, 1) + rows * a.F, 1 << 16);
  std::atomic<bool> ok{true};
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
  {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 4)
#endif
    for (int64_t u = 0; u < units; ++u) {
      if (!unit(a, u)) ok.store(false, std::memory_order_relaxed);
    }
    // (the implicit barrier: every piece is written before a split row is summed)
    if (ok.load(std::memory_order_relaxed)) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 64)
#endif
      for (int64_t u = 1; u < units; ++u) fix(a, u);
    }
  }
  (void)nt;
  TORCH_CHECK_VALUE(ok.load(), fn, ": an entry of indices is outside [0, ", a.n_in,
                    ") (rows of ", q_name, ")", has_eids ? " or of eids outside [0, " : "",
                    has_eids ? std::to_string(a.n_w) : std::string(),
                    has_eids ? ") (rows of weight)" : "");
  return out;
}

}  // namespace spmm_cpu
}  // namespace qtrain

#pragma GCC diagnostic pop
