// quantize_rows on the CPU (front: ops/quantize_rows.cpp; the codec: rowwise.h). Threads
// take blocks of whole rows that start on byte boundaries of the packed stream; each
// row is reduced to its min / max keys, then quantized into a staging tile that is
// packed 8 values at a time (rowwise::quantize_block).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in, int64_t bits,
                                                             bool stochastic, int64_t seed,
                                                             int64_t offset) {
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  QuantizedRows q = allocate_quantized(x_in.options(), rows, width, bits);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const QuantizeArgs a =
      quantize_args(q, width, bits, stochastic, static_cast<uint64_t>(seed), offset);
  InputRows src{x.const_data_ptr<float>(), width};
  parallel_rows(rows, width, [&](int, int64_t r0, int64_t r1) { quantize_block(a, r0, r1, src); });
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("quantize_rows", &qtrain::quantize_rows); }
