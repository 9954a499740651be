// quantize_symmetric_cols4 on the CPU (front: ops/quantize_symmetric_cols4.cpp; reference
// qtrain/ops/quantize.py reference_quantize_cols4): quantize_symmetric_cols's kernel
// (cpu/quantize_symmetric_cols_kernel.cpp, through common/quantize_cols.h) writing x's rows as
// 4-bit values packed two per byte: 16 rows at a time quantized into a per-thread buffer
// and packed from there while in cache, so no int8 copy of x is written.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "common/quantize_cols.h"

namespace qtrain {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_cols4(const at::Tensor& x, int64_t bits,
                                                            bool stochastic, int64_t seed,
                                                            int64_t offset, int64_t block) {
  return cpu::quantize_cols(x, bits, stochastic, seed, offset, block, true);
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_symmetric_cols4", &qtrain::quantize_symmetric_cols4);
}
