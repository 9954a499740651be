// quantize_rows_means on the CPU (front: ops/quantize_rows_means.cpp; the levels:
// common/row_means.h). Threads take blocks of whole rows that start on byte boundaries of
// the packed stream (rowwise::parallel_rows). Each row is read once from memory for its
// float64 sum, then twice from cache: its two sides' sums, then its comparisons with the
// threshold into a staging tile that is packed 8 values a byte, as quantize_rows packs
// its levels. The sums use the ISA variant's kSumLanes accumulators (rowwise_variants.cpp),
// so a row's levels are the reference's wherever its sums are exact, for any thread count.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "common/row_means.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

// One thread's rows [r0, r1) of x [.., width]; r0 * width is a multiple of 8.
void means_block(const Kernels& K, const float* x, int64_t width, int64_t r0, int64_t r1,
                 uint8_t* packed, c10::BFloat16* zero, c10::BFloat16* range) {
  alignas(64) uint8_t buf[kTile + 8];
  int64_t fill = 0;
  uint8_t* out = packed + r0 * width / 8;
  const PackFn pack = K.pack[bits_index(1)];
  for (int64_t r = r0; r < r1; ++r) {
    const float* h = x + r * width;
    const float t = row_means::threshold(K.row_sum(h, width), width);
    const SideSums s = K.side_sums(h, width, t);
    const row_means::Levels l =
        row_means::levels(t, s.high, s.high_count, s.low, width - s.high_count);
    zero[r] = l.zero;
    range[r] = l.range;
    for (int64_t j = 0; j < width;) {
      const int64_t len = std::min(width - j, kTile - fill);
      K.at_least(h + j, buf + fill, len, t);
      j += len;
      fill += len;
      if (fill == kTile) {
        pack(buf, out, kTile / 8);
        out += kTile / 8;
        fill = 0;
      }
    }
  }
  if (fill > 0) {  // the block's end: a byte boundary, or the stream's last partial byte
    const int64_t groups = fill / 8;
    pack(buf, out, groups);
    pack_tail(K, buf + 8 * groups, fill - 8 * groups, out + groups, 1);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows_means(const at::Tensor& x_in) {
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  QuantizedRows q = allocate_quantized(x_in.options(), rows, width, 1);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const float* xp = x.const_data_ptr<float>();
  auto* packed = static_cast<uint8_t*>(q.packed.mutable_data_ptr());
  auto* zero = static_cast<c10::BFloat16*>(q.zero.mutable_data_ptr());
  auto* range = static_cast<c10::BFloat16*>(q.range.mutable_data_ptr());
  const Kernels& K = kernels();
  parallel_rows(
      rows, width,
      [&](int, int64_t r0, int64_t r1) { means_block(K, xp, width, r0, r1, packed, zero, range); },
      3 * width);
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_rows_means", &qtrain::quantize_rows_means);
}
