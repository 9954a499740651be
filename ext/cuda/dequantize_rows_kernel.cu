// dequantize_rows on CUDA (front: ops/dequantize_rows.cpp; the kernel, shared with
// dequantize_rows_into and the unfused back-projection: rowwise.cu): a thread per group
// of 8 values, one load of `bits` bytes, two float4 stores.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

at::Tensor dequantize_rows(const at::Tensor& packed_in, const at::Tensor& zero_in,
                           const at::Tensor& range_in, int64_t bits, int64_t width) {
  const int64_t rows = zero_in.numel();
  const c10::cuda::CUDAGuard guard(packed_in.device());
  at::Tensor out = at::empty({rows, width}, packed_in.options().dtype(at::kFloat));
  if (rows * width == 0) return out;
  const at::Tensor packed = packed_in.contiguous();
  const at::Tensor zero = zero_in.contiguous();
  const at::Tensor range = range_in.contiguous();
  launch_dequantize_rows(static_cast<const uint8_t*>(packed.const_data_ptr()),
                         static_cast<const uint16_t*>(zero.const_data_ptr()),
                         static_cast<const uint16_t*>(range.const_data_ptr()), rows, width, bits,
                         out.mutable_data_ptr<float>(), current_stream());
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("dequantize_rows", &qtrain::cuda::dequantize_rows); }
