// quantize_rows_means on the CPU (front: ops/quantize_rows_means.cpp; the levels and the
// bytes: common/row_means.h). Two passes: threads take blocks of rows for their thresholds and
// levels (each row read twice from cache: its sum, then its two sides' sums), then
// contiguous ranges of output bytes, each byte the comparisons of its 8 values with
// their rows' thresholds. Sums run left to right in float64, so a row's levels are the
// reference's wherever its sums are exact.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "common/row_means.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

void row_levels(const float* x, int64_t width, int64_t r0, int64_t r1, float* t_out,
                c10::BFloat16* zero, c10::BFloat16* range) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* h = x + r * width;
    double sum = 0.0;
    for (int64_t j = 0; j < width; ++j) sum += h[j];
    const float t = row_means::threshold(sum, width);
    double high_sum = 0.0, low_sum = 0.0;
    int64_t high_count = 0;
    for (int64_t j = 0; j < width; ++j) {
      if (h[j] >= t) {
        high_sum += h[j];
        ++high_count;
      } else {
        low_sum += h[j];
      }
    }
    const row_means::Levels l =
        row_means::levels(t, high_sum, high_count, low_sum, width - high_count);
    t_out[r] = t;
    zero[r] = l.zero;
    range[r] = l.range;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows_means(const at::Tensor& x_in) {
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  QuantizedRows q = allocate_quantized(x_in.options(), rows, width, 1);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const float* xp = x.const_data_ptr<float>();
  at::Tensor t = at::empty({rows}, x.options());
  float* tp = t.mutable_data_ptr<float>();
  auto* zero = static_cast<c10::BFloat16*>(q.zero.mutable_data_ptr());
  auto* range = static_cast<c10::BFloat16*>(q.range.mutable_data_ptr());
  parallel_rows(
      rows, width,
      [&](int, int64_t r0, int64_t r1) { row_levels(xp, width, r0, r1, tp, zero, range); },
      2 * width);
  const int64_t n = rows * width;
  auto* out = static_cast<uint8_t*>(q.packed.mutable_data_ptr());
  parallel_ranges(q.packed.numel(), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) out[b] = row_means::side_byte(xp, tp, width, n, b);
  });
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_rows_means", &qtrain::quantize_rows_means);
}
