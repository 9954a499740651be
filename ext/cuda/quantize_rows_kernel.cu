// quantize_rows on CUDA (front: ops/quantize_rows.cpp; the kernel, shared with
// quantize_rows_into and the unfused projection: rowwise.cu, see rowwise.cuh): tiles of
// rows per block, row statistics then quantization and packing of whole output bytes.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in, int64_t bits,
                                                             bool stochastic, int64_t seed,
                                                             int64_t offset) {
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Quantized q = allocate_quantized(x_in.options(), rows, width, bits);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  launch_quantize_rows(x.const_data_ptr<float>(), rows, width, bits, stochastic,
                       rng::keys_from_seed(static_cast<uint64_t>(seed)), offset, q,
                       current_stream());
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("quantize_rows", &qtrain::cuda::quantize_rows); }
