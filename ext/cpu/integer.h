// GCINT's int32 -> int8 window rule and DyQ's histogram on the CPU, shared by the requantize
// and dyq kernels (cpu/requantize_kernel.cpp, cpu/dyq_kernel.cpp); the definitions are
// qtrain/ops/integer.py (reference_requantize, msb_histogram, window_shift).
//
// The rule works on the magnitude as uint32, which holds |-2^31| too, and cannot overflow:
// m <= 2^31 and the rounding half <= 2^24.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "cpu/isa.h"
#include "cpu/threads.h"

namespace qtrain {
namespace integer {

constexpr int kWindow = 7;     // magnitude bits of an int8
constexpr int kMaxShift = 25;  // the window's top bit is at most 31
constexpr int64_t kGrain = 1 << 16;

QT_ALWAYS_INLINE uint32_t magnitude(int32_t x) {
  return x < 0 ? 0u - static_cast<uint32_t>(x) : static_cast<uint32_t>(x);
}

// sign(x) * min(round_half_up(|x| / 2^shift), 127)
QT_ALWAYS_INLINE int8_t requantize_one(int32_t x, int shift, uint32_t half) {
  const uint32_t m = std::min<uint32_t>((magnitude(x) + half) >> shift, 127u);
  const int32_t s = static_cast<int32_t>(m);
  return static_cast<int8_t>(x < 0 ? -s : s);
}

// out[i] = requantize_one(x[i]) for i in [0, n); plain loops the compiler vectorizes.
void requantize_range(const int32_t* x, int8_t* out, int64_t n, int shift);

// hist[b] = #{ i : |x[i]| in [2^b, 2^(b+1)) } over [0, n), added into hist.
QT_ALWAYS_INLINE void msb_histogram(const int32_t* x, int64_t n, int64_t* hist) {
  int64_t local[32] = {};
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t m = magnitude(x[i]);
    if (m != 0) ++local[31 - __builtin_clz(m)];
  }
  for (int b = 0; b < 32; ++b) hist[b] += local[b];
}

// DyQ's k: the first k in 0..25 whose bins k .. k + 6 hold the most (0 when all are empty).
inline int window_shift(const int64_t* hist) {
  int best = 0;
  int64_t best_count = -1;
  for (int k = 0; k <= kMaxShift; ++k) {
    int64_t count = 0;
    for (int b = k; b < k + kWindow; ++b) count += hist[b];
    if (count > best_count) {
      best = k;
      best_count = count;
    }
  }
  return best;
}

// dyq with a saturation bound: the first k in 0..25 whose window saturates at most one
// nonzero magnitude in 2^tail (those in bins k + 7 .. 31); k = 25 saturates none.
inline int bounded_window_shift(const int64_t* hist, int tail) {
  int64_t nonzero = 0;
  for (int b = 0; b < 32; ++b) nonzero += hist[b];
  int64_t saturated = 0;  // bins k + 7 .. 31, for k from 25 down
  int best = kMaxShift;
  for (int k = kMaxShift; k >= 0; --k) {
    if (k + kWindow <= 31) saturated += hist[k + kWindow];
    if ((saturated << tail) <= nonzero) best = k;
  }
  return best;
}

}  // namespace integer
}  // namespace qtrain
