// project_quantize_rows on the CPU (front: ops/project_quantize_rows.cpp; the codec and
// the signed products: rowwise.h). Each thread projects its rows kStageRows at a time
// into a small stage (the signed sums of the reference, one vector lane per output
// column, in input order) and quantizes them from there: the projected [rows, k]
// tensor never exists.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_quantize_rows(
    const at::Tensor& x_in, int64_t k, int64_t bits, bool stochastic, int64_t seed,
    int64_t offset, int64_t projection_offset) {
  const int64_t rows = x_in.size(0), d = x_in.size(1);
  QuantizedRows q = allocate_quantized(x_in.options(), rows, k, bits);
  if (rows == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const float* xp = x.const_data_ptr<float>();
  const QuantizeArgs a = quantize_args(q, k, bits, stochastic, static_cast<uint64_t>(seed), offset);
  const SignMasks m = sign_masks(d, k, a.keys, static_cast<uint64_t>(projection_offset), false);
  parallel_rows(
      rows, k,
      [&](int, int64_t r0, int64_t r1) {
        ProjectedRows src(*a.K, xp, d, k, m, r1);
        quantize_block(a, r0, r1, src);
      },
      std::max<int64_t>(d, k));
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("project_quantize_rows", &qtrain::project_quantize_rows);
}
