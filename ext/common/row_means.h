// The row statistics and the packed bytes of quantize_rows_means (reference:
// qtrain/quant/rowwise.py), shared by the CPU and CUDA kernels: from a row's float64 sums
// to its threshold and its two stored levels, and each output byte from the thresholds.
// Host and device code alike (no intrinsics the two would round apart).
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace qtrain {
namespace row_means {

// t = fl32(sum / width): values >= t take the high level.
C10_HOST_DEVICE inline float threshold(double sum, int64_t width) {
  return static_cast<float>(sum / static_cast<double>(width));
}

struct Levels {
  c10::BFloat16 zero, range;
};

// zero = bf16(lo), range = bf16(fl32(hi - zero)); hi = the high side's mean (t where the
// side is empty: a NaN row), lo = the low side's (hi where it is empty).
C10_HOST_DEVICE inline Levels levels(float t, double high_sum, int64_t high_count,
                                     double low_sum, int64_t low_count) {
  const float hi =
      high_count > 0 ? static_cast<float>(high_sum / static_cast<double>(high_count)) : t;
  const float lo =
      low_count > 0 ? static_cast<float>(low_sum / static_cast<double>(low_count)) : hi;
  const c10::BFloat16 zero(lo);
  return {zero, c10::BFloat16(hi - static_cast<float>(zero))};
}

// Byte b of the packed stream of the n values of rows `width` wide: bit k is
// x[8b + k] >= t[its row]. (The CUDA kernel's bytes; the CPU kernel stages its
// comparisons and packs them as quantize_rows packs its levels.)
C10_HOST_DEVICE inline uint8_t side_byte(const float* x, const float* t, int64_t width, int64_t n,
                                         int64_t b) {
  int64_t i = 8 * b;
  int64_t row = i / width, col = i % width;
  uint32_t byte = 0;
  for (int k = 0; k < 8 && i < n; ++k, ++i) {
    byte |= static_cast<uint32_t>(x[i] >= t[row]) << k;
    if (++col == width) {
      col = 0;
      ++row;
    }
  }
  return static_cast<uint8_t>(byte);
}

}  // namespace row_means
}  // namespace qtrain
