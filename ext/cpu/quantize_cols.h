// The CPU column quantizer as a C++ function: quantize_symmetric_cols's kernel
// (cpu/quantize_symmetric_cols_kernel.cpp, which defines it) and quantize_symmetric_cols4's
// (cpu/quantize_symmetric_cols4_kernel.cpp) run the same bodies, int8 or packed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace qtrain {
namespace cpu {

// (q, scale) of x (float32 [rows, cols], as the front checked it): q int8 in x's shape, or
// with `packed` (bits <= 4) uint8 [rows, ceil(cols / 2)], two values a byte; scale float32
// [1, cols] (block 0) or [ceil(rows / block), cols].
std::tuple<at::Tensor, at::Tensor> quantize_cols(const at::Tensor& x, int64_t bits,
                                                 bool stochastic, int64_t seed, int64_t offset,
                                                 int64_t block, bool packed);

}  // namespace cpu
}  // namespace qtrain
