// The quantized SDDMM's CPU pieces shared by qsddmm (int8 rows, qsddmm_kernel.cpp) and
// qsddmm4 (4-bit rows packed two per byte, qsddmm4_kernel.cpp), so both ops compute every
// output with the same float32 operations in the same order and qsddmm4 is bit for bit
// qsddmm of the unpacked rows: the arguments, one lane and W lanes of add / sub / mul
// through a row reader (Row: sparse::Int8Rows or sparse::Int4Rows, cpu/lanes.h), exact
// integer dots, the per-head body (qsddmm with row scales; every qsddmm4 call) and the
// threaded edge loop with its error. The definition is qtrain/ops/sparse.py
// (reference_qsddmm); see qsddmm_kernel.cpp for the formulas.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/sparse_operands.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/mem.h"
#include "cpu/threads.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace sddmm_cpu {

using sparse::Int4Rows;
using sparse::Int8Rows;
using sparse::Lanes;

using sparse_operands::kAdd;
using sparse_operands::kDot;
using sparse_operands::kMul;
using sparse_operands::kSub;

constexpr int64_t kPrefetch = 8;        // edges ahead whose rows are prefetched (wide rows)
constexpr int64_t kDotChunk = 1 << 17;  // values per int32 partial sum (|sum| < 2^31); even

// T: the rows' bytes (int8_t, or uint8_t for packed rows).
template <typename T>
struct SddmmArgs {
  const void* li;
  const void* ri;
  const T* ql;
  const T* qr;
  float* out;
  int64_t n_l;  // rows of q_l
  int64_t n_r;  // rows of q_r
  int64_t F;    // H * D values per row
  int64_t H;
  int64_t D;
  int64_t Ds;  // bytes a head takes: D (int8), ceil(D / 2) (packed); a row takes H * Ds
  float sl;
  float sr;
  float both;        // fl32(sl * sr)
  const float* rsl;  // row scales of q_l (null: none), Hl per row
  const float* rsr;  // row scales of q_r (null: none), Hr per row
  int64_t Hl;
  int64_t Hr;
};

// The arguments of a prepared call (sparse_operands::sddmm) whose rows are T.
template <typename T>
SddmmArgs<T> make_args(const sparse_operands::Sddmm& s, double scale_lhs, double scale_rhs) {
  SddmmArgs<T> a{};
  a.li = s.li.const_data_ptr();
  a.ri = s.ri.const_data_ptr();
  a.ql = static_cast<const T*>(s.ql.const_data_ptr());
  a.qr = static_cast<const T*>(s.qr.const_data_ptr());
  a.out = s.out.mutable_data_ptr<float>();
  advise_huge_pages(a.out, static_cast<size_t>(s.out.numel()) * sizeof(float));
  a.n_l = s.ql.size(0);
  a.n_r = s.qr.size(0);
  a.F = s.H * s.D;
  a.H = s.H;
  a.D = s.D;
  a.Ds = s.Ds;
  a.sl = static_cast<float>(scale_lhs);
  a.sr = static_cast<float>(scale_rhs);
  a.both = a.sl * a.sr;
  a.rsl = s.rsl.defined() ? s.rsl.const_data_ptr<float>() : nullptr;
  a.rsr = s.rsr.defined() ? s.rsr.const_data_ptr<float>() : nullptr;
  a.Hl = s.Hl;
  a.Hr = s.Hr;
  return a;
}

// Runs edges(a, e0, e1) over the edges in one contiguous range per thread; raises (op fn,
// the operands named lhs / rhs) if a range found an index outside its operand's rows.
template <typename T, typename Edges>
void run_edges(const char* fn, const char* lhs, const char* rhs, const SddmmArgs<T>& a,
               int64_t E, Edges edges) {
  const int nt = plan_threads(E * (a.F + 4), 1 << 16);
  std::atomic<bool> ok{true};
  for_team_ranges(nt, E, [&](int, int64_t e0, int64_t e1) {
    if (!edges(a, e0, e1)) ok.store(false, std::memory_order_relaxed);
  });
  TORCH_CHECK_VALUE(ok.load(), fn, ": an entry of lhs_index is outside [0, ", a.n_l,
                    ") (rows of ", lhs, ") or of rhs_index outside [0, ", a.n_r, ") (rows of ",
                    rhs, ")");
}

// ---------------------------------------------------------------- lanes

// One lane of add / sub / mul.
template <int OP>
QT_ALWAYS_INLINE float elem(int32_t x, int32_t y, float sl, float sr, float both) {
  if constexpr (OP == kAdd) {
    return static_cast<float>(x) * sl + static_cast<float>(y) * sr;
  } else if constexpr (OP == kSub) {
    return static_cast<float>(x) * sl - static_cast<float>(y) * sr;
  } else {
    return static_cast<float>(x * y) * both;
  }
}

// W lanes of add / sub / mul from W values at x and y.
template <int ISA, int OP, class Row>
QT_ALWAYS_INLINE typename Lanes<ISA>::vf elem_vec(const typename Row::T* x,
                                                  const typename Row::T* y, float sl, float sr,
                                                  float both) {
  using vf = typename Lanes<ISA>::vf;
  const auto a = Row::template load<ISA>(x);
  const auto b = Row::template load<ISA>(y);
  if constexpr (OP == kAdd) {
    return __builtin_convertvector(a, vf) * sl + __builtin_convertvector(b, vf) * sr;
  } else if constexpr (OP == kSub) {
    return __builtin_convertvector(a, vf) * sl - __builtin_convertvector(b, vf) * sr;
  } else {
    return __builtin_convertvector(a * b, vf) * both;
  }
}

// n values of add / sub / mul into o: whole vector registers, then one value at a time.
template <int ISA, int OP, class Row>
QT_ALWAYS_INLINE void elementwise_lanes(const typename Row::T* x, const typename Row::T* y,
                                        int64_t n, float sl, float sr, float both, float* o) {
  constexpr int W = Lanes<ISA>::W;
  int64_t f = 0;
  for (; f + W <= n; f += W) {
    const auto v = elem_vec<ISA, OP, Row>(x + Row::bytes(f), y + Row::bytes(f), sl, sr, both);
    std::memcpy(o + f, &v, sizeof v);
  }
  for (; f < n; ++f) o[f] = elem<OP>(Row::value(x, f), Row::value(y, f), sl, sr, both);
}

// Exact int8 dot of n values (n <= kDotChunk).
template <int ISA>
QT_ALWAYS_INLINE int32_t dot_values(const int8_t* x, const int8_t* y, int64_t n) {
  using L = Lanes<ISA>;
  constexpr int W = L::W;
  typename L::vi acc0 = typename L::vi{};
  typename L::vi acc1 = typename L::vi{};
  int64_t d = 0;
  for (; d + 2 * W <= n; d += 2 * W) {
    acc0 += L::load(x + d) * L::load(y + d);
    acc1 += L::load(x + d + W) * L::load(y + d + W);
  }
  if (d + W <= n) {
    acc0 += L::load(x + d) * L::load(y + d);
    d += W;
  }
  acc0 += acc1;
  int32_t s = 0;
  for (int t = 0; t < W; ++t) s += acc0[t];
  for (; d < n; ++d) s += static_cast<int32_t>(x[d]) * static_cast<int32_t>(y[d]);
  return s;
}

// Exact dot of n 4-bit values packed two per byte (n <= kDotChunk). The order of an
// integer sum does not change it, so W bytes are read as int8 lanes and each byte's
// nibbles multiplied with the other row's in place: the low one shifted up and back
// (sign-extending), the high one an arithmetic shift of the sign-extended byte. An odd
// n's last byte counts its low nibble only.
template <int ISA>
QT_ALWAYS_INLINE int32_t dot_values(const uint8_t* x, const uint8_t* y, int64_t n) {
  using L = Lanes<ISA>;
  using vi = typename L::vi;
  typedef uint32_t vu __attribute__((vector_size(sizeof(vi))));
  constexpr int W = L::W;
  const int8_t* xb = reinterpret_cast<const int8_t*>(x);
  const int8_t* yb = reinterpret_cast<const int8_t*>(y);
  const int64_t pairs = n / 2;
  vi acc = vi{};
  int64_t b = 0;
  for (; b + W <= pairs; b += W) {
    const vi u = L::load(xb + b);
    const vi v = L::load(yb + b);
    const vi u_lo = reinterpret_cast<vi>(reinterpret_cast<vu>(u) << 28) >> 28;
    const vi v_lo = reinterpret_cast<vi>(reinterpret_cast<vu>(v) << 28) >> 28;
    acc += u_lo * v_lo + (u >> 4) * (v >> 4);
  }
  int32_t s = 0;
  for (int t = 0; t < W; ++t) s += acc[t];
  for (int64_t d = 2 * b; d < n; ++d) s += Int4Rows::value(x, d) * Int4Rows::value(y, d);
  return s;
}

// Exact dot of n values of any length: int32 partial sums of kDotChunk values, in int64.
template <int ISA, typename T>
QT_ALWAYS_INLINE int64_t dot_long(const T* x, const T* y, int64_t n) {
  using Row = std::conditional_t<std::is_same_v<T, int8_t>, Int8Rows, Int4Rows>;
  int64_t s = 0;
  for (int64_t d0 = 0; d0 < n; d0 += kDotChunk) {
    s += dot_values<ISA>(x + Row::bytes(d0), y + Row::bytes(d0), std::min(kDotChunk, n - d0));
  }
  return s;
}

// ---------------------------------------------------------------- bodies

// Prefetches the rows of edge e + kPrefetch (the first 128 bytes of each; rows of at
// least 32 bytes, RB).
template <typename T, typename I>
QT_ALWAYS_INLINE void prefetch_edge_rows(const SddmmArgs<T>& a, const I* li, const I* ri,
                                         int64_t e, int64_t e1, int64_t RB) {
  if (RB < 32 || e + kPrefetch >= e1) return;
  const T* x = a.ql + static_cast<int64_t>(li[e + kPrefetch]) * RB;
  const T* y = a.qr + static_cast<int64_t>(ri[e + kPrefetch]) * RB;
  __builtin_prefetch(x);
  __builtin_prefetch(y);
  if (RB > 64) {
    __builtin_prefetch(x + 64);
    __builtin_prefetch(y + 64);
  }
}

// One side's scale for row `row`, head h: s, or fl32(s * rs[row, h]) with row scales.
QT_ALWAYS_INLINE float side_scale(float s, const float* rs, int64_t Hs, int64_t row, int64_t h) {
  return rs == nullptr ? s : s * rs[row * Hs + (Hs > 1 ? h : 0)];
}

// Op OP over edges [e0, e1), head by head: each edge and head takes its rows' scales (the
// op's scales without row scales), the values of a head computed as one lane or W lanes
// above. One-value heads (GAT's [N, H, 1] scalars) take a loop of their own.
template <int ISA, int OP, class Row, typename I>
QT_ALWAYS_INLINE bool heads_body(const SddmmArgs<typename Row::T>& a, int64_t e0, int64_t e1) {
  using T = typename Row::T;
  const I* li = static_cast<const I*>(a.li);
  const I* ri = static_cast<const I*>(a.ri);
  const uint64_t n_l = static_cast<uint64_t>(a.n_l);
  const uint64_t n_r = static_cast<uint64_t>(a.n_r);
  const int64_t H = a.H, D = a.D, Ds = a.Ds, RB = H * Ds;
  const int64_t per_edge = OP == kDot ? H : H * D;
  bool all_ok = true;
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t i = static_cast<int64_t>(li[e]);
    const int64_t j = static_cast<int64_t>(ri[e]);
    float* o = a.out + e * per_edge;
    if (static_cast<uint64_t>(i) >= n_l || static_cast<uint64_t>(j) >= n_r) {
      for (int64_t f = 0; f < per_edge; ++f) o[f] = 0.0f;
      all_ok = false;
      continue;
    }
    prefetch_edge_rows(a, li, ri, e, e1, RB);
    if (e + kPrefetch < e1) {  // the row scales of edge e + kPrefetch: a random read each
      const int64_t pi = static_cast<int64_t>(li[e + kPrefetch]);
      const int64_t pj = static_cast<int64_t>(ri[e + kPrefetch]);
      if (a.rsl != nullptr) __builtin_prefetch(a.rsl + pi * a.Hl);
      if (a.rsr != nullptr) __builtin_prefetch(a.rsr + pj * a.Hr);
    }
    const T* x = a.ql + i * RB;
    const T* y = a.qr + j * RB;
    if constexpr (OP != kDot) {
      if (D == 1) {
        for (int64_t h = 0; h < H; ++h) {
          const float sl = side_scale(a.sl, a.rsl, a.Hl, i, h);
          const float sr = side_scale(a.sr, a.rsr, a.Hr, j, h);
          o[h] = elem<OP>(Row::value(x + h * Ds, 0), Row::value(y + h * Ds, 0), sl, sr, sl * sr);
        }
        continue;
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const T* xh = x + h * Ds;
      const T* yh = y + h * Ds;
      const float sl = side_scale(a.sl, a.rsl, a.Hl, i, h);
      const float sr = side_scale(a.sr, a.rsr, a.Hr, j, h);
      const float both = sl * sr;
      if constexpr (OP == kDot) {
        o[h] = static_cast<float>(dot_long<ISA>(xh, yh, D)) * both;
      } else {
        elementwise_lanes<ISA, OP, Row>(xh, yh, D, sl, sr, both, o + h * D);
      }
    }
  }
  return all_ok;
}

// heads_body for the op named by `op` (sparse_operands::SddmmOp).
template <int ISA, class Row, typename I>
QT_ALWAYS_INLINE bool heads_by_op(int op, const SddmmArgs<typename Row::T>& a, int64_t e0,
                                  int64_t e1) {
  if (op == kDot) return heads_body<ISA, kDot, Row, I>(a, e0, e1);
  if (op == kAdd) return heads_body<ISA, kAdd, Row, I>(a, e0, e1);
  if (op == kSub) return heads_body<ISA, kSub, Row, I>(a, e0, e1);
  return heads_body<ISA, kMul, Row, I>(a, e0, e1);
}

}  // namespace sddmm_cpu
}  // namespace qtrain

#pragma GCC diagnostic pop
