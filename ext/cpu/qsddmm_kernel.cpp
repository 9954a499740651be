// qsddmm on the CPU (front: ops/qsddmm.cpp): quantized SDDMM (tango-sc23 sec. 3.3);
// the definition is qtrain/ops/sparse.py (reference_qsddmm). For edge e,
// i = lhs_index[e], j = rhs_index[e]:
//
//   add / sub: out[e] = fl32(q_l[i] * s_l) +/- fl32(q_r[j] * s_r)
//   mul:       out[e] = fl32(float(q_l[i] * q_r[j]) * fl32(s_l * s_r))
//   dot:       out[e, h, 0] = fl32(float(sum_d q_l[i,h,d] * q_r[j,h,d]) * fl32(s_l * s_r))
//
// With row scales s_l is fl32(scale_lhs * row_scale_lhs[i, h]) (s_r the same on the right),
// read per edge and head as the rows are gathered (heads_body, cpu/sddmm_body.h, which
// qsddmm4 shares).
//
// Every output element is exact integer arithmetic or the same elementwise
// float32 operations as the reference, so any split of the edges gives the
// same bits; edges are cut into one contiguous range per thread. Rows are
// gathered one vector register of int8 lanes at a time and widened to int32 (products of two int8
// are exact in int32, and so is a dot of up to 2^31 / 128^2 lanes, which
// longer rows split into int64 partial sums); narrow rows (GAT's per-head
// scalars, [N, H, 1]) use width-specialised loops. The front has checked dtypes,
// shapes and devices; an index outside its operand's rows, which only the data
// shows, is found in the edge loop (the edge's row is zeroed and the op raises
// after the loop).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "common/sparse_operands.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/sddmm_body.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace {

using sparse::Int8Rows;
using sparse::Lanes;

using sparse_operands::kAdd;
using sparse_operands::kDot;
using sparse_operands::kMul;
using sparse_operands::kSub;

using sddmm_cpu::dot_values;
using sddmm_cpu::elem;
using sddmm_cpu::elementwise_lanes;
using sddmm_cpu::heads_by_op;
using sddmm_cpu::kDotChunk;
using sddmm_cpu::kPrefetch;
using sddmm_cpu::prefetch_edge_rows;

using SddmmArgs = sddmm_cpu::SddmmArgs<int8_t>;

// ---------------------------------------------------------------- kernel bodies

// 4 lanes of add / sub / mul (rows of width 4 and 8).
template <int ISA, int OP>
QT_ALWAYS_INLINE sparse::v4f elem4(const int8_t* x, const int8_t* y, float sl, float sr,
                                   float both) {
  using sparse::v4f;
  const sparse::v4i32 a = Lanes<ISA>::load4(x);
  const sparse::v4i32 b = Lanes<ISA>::load4(y);
  if constexpr (OP == kAdd) {
    return __builtin_convertvector(a, v4f) * sl + __builtin_convertvector(b, v4f) * sr;
  } else if constexpr (OP == kSub) {
    return __builtin_convertvector(a, v4f) * sl - __builtin_convertvector(b, v4f) * sr;
  } else {
    return __builtin_convertvector(a * b, v4f) * both;
  }
}

// add / sub / mul over edges [e0, e1); FC > 0 fixes the row width at compile time.
template <int ISA, int OP, int FC, typename I>
QT_ALWAYS_INLINE bool elementwise_body(const SddmmArgs& a, int64_t e0, int64_t e1) {
  // locals, so the stores to out cannot force reloads of the arguments
  const I* li = static_cast<const I*>(a.li);
  const I* ri = static_cast<const I*>(a.ri);
  const int8_t* ql = a.ql;
  const int8_t* qr = a.qr;
  float* out = a.out;
  const uint64_t n_l = static_cast<uint64_t>(a.n_l);
  const uint64_t n_r = static_cast<uint64_t>(a.n_r);
  const float sl = a.sl;
  const float sr = a.sr;
  const float both = a.both;
  const int64_t F = FC > 0 ? FC : a.F;
  bool all_ok = true;
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t i = static_cast<int64_t>(li[e]);
    const int64_t j = static_cast<int64_t>(ri[e]);
    float* o = out + e * F;
    if (static_cast<uint64_t>(i) >= n_l || static_cast<uint64_t>(j) >= n_r) {
      for (int64_t f = 0; f < F; ++f) o[f] = 0.0f;
      all_ok = false;
      continue;
    }
    const int8_t* x = ql + i * F;
    const int8_t* y = qr + j * F;
    if constexpr (FC == 4 || FC == 8) {
      for (int c = 0; c < FC; c += 4) {
        const sparse::v4f v = elem4<ISA, OP>(x + c, y + c, sl, sr, both);
        std::memcpy(o + c, &v, sizeof v);
      }
    } else if constexpr (FC > 0) {
      for (int64_t f = 0; f < FC; ++f) o[f] = elem<OP>(x[f], y[f], sl, sr, both);
    } else {
      if (F >= 32 && e + kPrefetch < e1) {
        __builtin_prefetch(ql + static_cast<int64_t>(li[e + kPrefetch]) * F);
        __builtin_prefetch(qr + static_cast<int64_t>(ri[e + kPrefetch]) * F);
      }
      elementwise_lanes<ISA, OP, Int8Rows>(x, y, F, sl, sr, both, o);
    }
  }
  return all_ok;
}

// dot over edges [e0, e1); DC > 0 fixes the per-head width at compile time.
template <int ISA, int DC, typename I>
QT_ALWAYS_INLINE bool dot_body(const SddmmArgs& a, int64_t e0, int64_t e1) {
  const I* li = static_cast<const I*>(a.li);
  const I* ri = static_cast<const I*>(a.ri);
  const int8_t* ql = a.ql;
  const int8_t* qr = a.qr;
  float* out = a.out;
  const uint64_t n_l = static_cast<uint64_t>(a.n_l);
  const uint64_t n_r = static_cast<uint64_t>(a.n_r);
  const float both = a.both;
  const int64_t H = a.H;
  const int64_t D = DC > 0 ? DC : a.D;
  const int64_t F = H * D;
  bool all_ok = true;
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t i = static_cast<int64_t>(li[e]);
    const int64_t j = static_cast<int64_t>(ri[e]);
    float* o = out + e * H;
    if (static_cast<uint64_t>(i) >= n_l || static_cast<uint64_t>(j) >= n_r) {
      for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
      all_ok = false;
      continue;
    }
    prefetch_edge_rows(a, li, ri, e, e1, F);
    const int8_t* x = ql + i * F;
    const int8_t* y = qr + j * F;
    for (int64_t h = 0; h < H; ++h) {
      const int8_t* xh = x + h * D;
      const int8_t* yh = y + h * D;
      if constexpr (DC > 0 && DC < 16) {
        int32_t s = 0;
        for (int64_t d = 0; d < DC; ++d) {
          s += static_cast<int32_t>(xh[d]) * static_cast<int32_t>(yh[d]);
        }
        o[h] = static_cast<float>(s) * both;
      } else if (D <= kDotChunk) {
        o[h] = static_cast<float>(dot_values<ISA>(xh, yh, D)) * both;
      } else {
        int64_t s = 0;
        for (int64_t d0 = 0; d0 < D; d0 += kDotChunk) {
          s += dot_values<ISA>(xh + d0, yh + d0, std::min(kDotChunk, D - d0));
        }
        o[h] = static_cast<float>(s) * both;
      }
    }
  }
  return all_ok;
}

template <int ISA, int OP, typename I>
QT_ALWAYS_INLINE bool elementwise_by_width(const SddmmArgs& a, int64_t e0, int64_t e1) {
  switch (a.F) {
    case 1:
      return elementwise_body<ISA, OP, 1, I>(a, e0, e1);
    case 2:
      return elementwise_body<ISA, OP, 2, I>(a, e0, e1);
    case 4:
      return elementwise_body<ISA, OP, 4, I>(a, e0, e1);
    case 8:
      return elementwise_body<ISA, OP, 8, I>(a, e0, e1);
    default:
      return elementwise_body<ISA, OP, 0, I>(a, e0, e1);
  }
}

// Width dispatch: specialised loops for the narrow rows GAT uses, the generic one otherwise.
template <int ISA, typename I>
QT_ALWAYS_INLINE bool edges_body(int op, const SddmmArgs& a, int64_t e0, int64_t e1) {
  if (a.rsl != nullptr || a.rsr != nullptr) return heads_by_op<ISA, Int8Rows, I>(op, a, e0, e1);
  if (op == kDot) {
    switch (a.D) {
      case 1:
        return dot_body<ISA, 1, I>(a, e0, e1);
      case 2:
        return dot_body<ISA, 2, I>(a, e0, e1);
      case 4:
        return dot_body<ISA, 4, I>(a, e0, e1);
      case 8:
        return dot_body<ISA, 8, I>(a, e0, e1);
      default:
        return dot_body<ISA, 0, I>(a, e0, e1);
    }
  }
  if (op == kAdd) return elementwise_by_width<ISA, kAdd, I>(a, e0, e1);
  if (op == kSub) return elementwise_by_width<ISA, kSub, I>(a, e0, e1);
  return elementwise_by_width<ISA, kMul, I>(a, e0, e1);
}

// ---------------------------------------------------------------- ISA variants

struct Kernels {
  bool (*edges_i32)(int, const SddmmArgs&, int64_t, int64_t);
  bool (*edges_i64)(int, const SddmmArgs&, int64_t, int64_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR, ISA)                                               \
  ATTR QT_FLATTEN bool edges_i32_##NAME(int op, const SddmmArgs& a, int64_t e0, int64_t e1) { \
    return edges_body<ISA, int32_t>(op, a, e0, e1);                                         \
  }                                                                                         \
  ATTR QT_FLATTEN bool edges_i64_##NAME(int op, const SddmmArgs& a, int64_t e0, int64_t e1) { \
    return edges_body<ISA, int64_t>(op, a, e0, e1);                                         \
  }                                                                                         \
  const Kernels kernels_##NAME = {edges_i32_##NAME, edges_i64_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, isa::kDefault)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, isa::kAvx2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, isa::kAvx512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- op

at::Tensor qsddmm(c10::string_view op_name, const at::Tensor& q_lhs_in, double scale_lhs,
                  const at::Tensor& lhs_index_in, const at::Tensor& q_rhs_in, double scale_rhs,
                  const at::Tensor& rhs_index_in, const std::optional<at::Tensor>& row_scale_lhs,
                  const std::optional<at::Tensor>& row_scale_rhs) {
  constexpr const char* fn = "qtrain::qsddmm";
  const sparse_operands::Sddmm s = sparse_operands::sddmm(
      op_name, q_lhs_in, lhs_index_in, q_rhs_in, rhs_index_in, row_scale_lhs, row_scale_rhs);
  if (s.E == 0) return s.out;

  const SddmmArgs a = sddmm_cpu::make_args<int8_t>(s, scale_lhs, scale_rhs);
  const Kernels& K = kernels();
  const auto run = s.wide ? K.edges_i64 : K.edges_i32;
  sddmm_cpu::run_edges(fn, "q_lhs", "q_rhs", a, s.E,
                       [&](const SddmmArgs& args, int64_t e0, int64_t e1) {
                         return run(s.op, args, e0, e1);
                       });
  return s.out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("qsddmm", &qtrain::qsddmm); }
