// quantize_symmetric_cols4 on CUDA (front: ops/quantize_symmetric_cols4.cpp; reference
// qtrain/ops/quantize.py reference_quantize_cols4; CPU twin
// cpu/quantize_symmetric_cols4_kernel.cpp): quantize_symmetric_cols's kernels
// (cuda/quantize_symmetric_cols_kernel.cu, through common/quantize_cols.h) writing x's rows
// as 4-bit values packed two per byte, each even column's lane writing its byte with its
// odd neighbour's value (a warp shuffle), so no int8 copy of x is written.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "common/quantize_cols.h"

namespace qtrain {
namespace cuda {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_cols4(const at::Tensor& x, int64_t bits,
                                                            bool stochastic, int64_t seed,
                                                            int64_t offset, int64_t block) {
  return quantize_cols(x, bits, stochastic, seed, offset, block, true);
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_symmetric_cols4", &qtrain::cuda::quantize_symmetric_cols4);
}
