// The loop bodies of quantize_symmetric's rule on the CPU (reference
// qtrain/quant/quantize.py), written once as QT_ALWAYS_INLINE functions for the kernels
// that instantiate them per ISA variant (QT_DEFINE_VARIANT): quantize_symmetric (one
// range for the whole tensor, cpu/quantize_symmetric_kernel.cpp),
// quantize_symmetric_rows (one range a row, cpu/quantize_symmetric_rows_kernel.cpp) and
// quantize_symmetric_cols (one range a column, cpu/quantize_symmetric_cols_kernel.cpp: the
// *_cols bodies, which take a (pre, inv) per element of the row they quantize).
// Every body does the same IEEE float32 operations in the same order on every ISA, so
// the results are bit-identical whichever variant runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/rng.h"
#include "cpu/isa.h"

namespace qtrain {
namespace cpu {

// max over |x| as bit patterns: for non-negative floats the integer order is
// the float order, and NaN/Inf compare above every finite value.
QT_ALWAYS_INLINE uint32_t absmax_bits_body(const float* __restrict x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    b &= 0x7fffffffu;
    m = b > m ? b : m;
  }
  return m;
}

// clamp to [-qmax, qmax] in float, before the conversion to int: with a given range
// (quantize_with_absmax) |v| may be far beyond int32. Rounding (or floor) and clamping
// to integer bounds commute, so this is the reference's clamp(round(v)) (floor(w)).
QT_ALWAYS_INLINE float clamp_q(float v, float qmax) {
  v = v < -qmax ? -qmax : v;
  return v > qmax ? qmax : v;
}

// Ties-to-even rounding that vectorizes on every x86 level: for |v| < 2^22,
// v + 1.5*2^23 lands where the float spacing is 1, so the add rounds v to the
// nearest integer (ties to even) and the subtraction is exact.
QT_ALWAYS_INLINE float rint_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (v + magic) - magic;
}

QT_ALWAYS_INLINE void nearest_body(const float* __restrict x, int8_t* __restrict q, int64_t n,
                                   float pre, float inv, int32_t qmax) {
  const float qf = static_cast<float>(qmax);
  for (int64_t i = 0; i < n; ++i) {
    const float v = clamp_q((x[i] * pre) * inv, qf);
    q[i] = static_cast<int8_t>(static_cast<int32_t>(rint_small(v)));
  }
}

QT_ALWAYS_INLINE void stochastic_body(const float* __restrict x, int8_t* __restrict q, int64_t n,
                                      float pre, float inv, int32_t qmax, uint32_t lo0,
                                      uint32_t k1, uint32_t kh) {
  const float qf = static_cast<float>(qmax);
  for (int64_t i = 0; i < n; ++i) {
    const float u = rng::to_unit(rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(i)));
    const float w = clamp_q((x[i] * pre) * inv + u, qf);
    int32_t k = static_cast<int32_t>(w);  // toward zero; |w| <= qmax
    k -= (w < static_cast<float>(k)) ? 1 : 0;  // floor
    q[i] = static_cast<int8_t>(k);
  }
}

// The column variants: one row of x [.., cols] (n of its values) against per-column state.

// m[j] = max(m[j], |x[j]| as a bit pattern) for j < n: the columns' absmax, one row at a time.
QT_ALWAYS_INLINE void absmax_bits_cols_body(const float* __restrict x, uint32_t* __restrict m,
                                            int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t b;
    std::memcpy(&b, x + j, sizeof b);
    b &= 0x7fffffffu;
    m[j] = b > m[j] ? b : m[j];
  }
}

// nearest_body with the pre / inv of each value's column.
QT_ALWAYS_INLINE void nearest_cols_body(const float* __restrict x, int8_t* __restrict q, int64_t n,
                                        const float* __restrict pre,
                                        const float* __restrict inv, int32_t qmax) {
  const float qf = static_cast<float>(qmax);
  for (int64_t j = 0; j < n; ++j) {
    const float v = clamp_q((x[j] * pre[j]) * inv[j], qf);
    q[j] = static_cast<int8_t>(static_cast<int32_t>(rint_small(v)));
  }
}

// stochastic_body with the pre / inv of each value's column.
QT_ALWAYS_INLINE void stochastic_cols_body(const float* __restrict x, int8_t* __restrict q,
                                           int64_t n, const float* __restrict pre,
                                           const float* __restrict inv, int32_t qmax,
                                           uint32_t lo0, uint32_t k1, uint32_t kh) {
  const float qf = static_cast<float>(qmax);
  for (int64_t j = 0; j < n; ++j) {
    const float u = rng::to_unit(rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(j)));
    const float w = clamp_q((x[j] * pre[j]) * inv[j] + u, qf);
    int32_t k = static_cast<int32_t>(w);  // toward zero; |w| <= qmax
    k -= (w < static_cast<float>(k)) ? 1 : 0;  // floor
    q[j] = static_cast<int8_t>(k);
  }
}

// pre, inv of qtrain.quant.quantize.scale_params for a finite absmax > 0: inv =
// fl32(qmax / absmax), and if that overflows (absmax below ~1e-37) x and absmax are
// first multiplied by 2^64 (exact), as the reference does.
struct ScaleParams {
  float pre;
  float inv;
};

QT_ALWAYS_INLINE ScaleParams scale_params(float absmax, int32_t qmax) {
  ScaleParams p{1.0f, static_cast<float>(qmax) / absmax};
  if (!std::isfinite(p.inv)) {
    p.pre = 18446744073709551616.0f;  // 2^64
    p.inv = static_cast<float>(qmax) / (absmax * p.pre);
  }
  return p;
}

}  // namespace cpu
}  // namespace qtrain
