// The row statistics of quantize_rows_means (reference: qtrain/quant/rowwise.py), shared
// by the CPU and CUDA kernels: from a row's float64 sums to its threshold and its two
// stored levels. Host and device code alike (no intrinsics the two would round apart).
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

}  // namespace row_means
}  // namespace qtrain
