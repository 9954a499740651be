// dequantize_rows on the CPU (front: ops/dequantize_rows.cpp; the codec: rowwise.h).
// Threads take blocks of whole rows that start on byte boundaries of the packed
// stream, unpack a tile at a time and dequantize it row by row
// (rowwise::dequantize_block).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>

#include "cpu/mem.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

at::Tensor dequantize_rows(const at::Tensor& packed, const at::Tensor& zero,
                           const at::Tensor& range, int64_t bits, int64_t width) {
  const int64_t rows = zero.numel();
  at::Tensor out = at::empty({rows, width}, packed.options().dtype(at::kFloat));
  if (rows * width == 0) return out;
  const QuantizedInput q = quantized_input(packed, zero, range, bits, width);
  OutputRows sink{out.mutable_data_ptr<float>(), width};
  advise_huge_pages(sink.out, static_cast<size_t>(rows * width) * sizeof(float));
  parallel_rows(rows, width,
                [&](int, int64_t r0, int64_t r1) { dequantize_block(q.args, r0, r1, sink); });
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("dequantize_rows", &qtrain::dequantize_rows); }
