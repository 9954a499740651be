// The column quantizer of each device as a C++ function, int8 or packed: quantize_symmetric_cols's
// kernels (cpu/quantize_symmetric_cols_kernel.cpp, cuda/quantize_symmetric_cols_kernel.cu,
// which define them) and quantize_symmetric_cols4's (cpu/..._cols4_kernel.cpp,
// cuda/..._cols4_kernel.cu) run the same code; and what those two definitions share.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <tuple>

namespace qtrain {
namespace col_quantizer {

// The op whose errors a kernel raises: quantize_symmetric_cols, or PACKED its packed form.
template <bool PACKED>
constexpr const char* op_name() {
  return PACKED ? "qtrain::quantize_symmetric_cols4" : "qtrain::quantize_symmetric_cols";
}

// The output of x [rows, cols]: int8 in x's shape, or PACKED uint8 [rows, ceil(cols / 2)].
template <bool PACKED>
at::Tensor output(const at::Tensor& x) {
  if constexpr (PACKED) {
    return at::empty({x.size(0), (x.size(1) + 1) / 2}, x.options().dtype(at::kByte));
  }
  return at::empty(x.sizes(), x.options().dtype(at::kChar));
}

}  // namespace col_quantizer

// (q, scale) of x (float32 [rows, cols] on the function's device, as the front checked it):
// q int8 in x's shape, or with `packed` (bits <= 4) uint8 [rows, ceil(cols / 2)], two values
// a byte; scale float32 [1, cols] (block 0) or [ceil(rows / block), cols].
namespace cpu {
std::tuple<at::Tensor, at::Tensor> quantize_cols(const at::Tensor& x, int64_t bits,
                                                 bool stochastic, int64_t seed, int64_t offset,
                                                 int64_t block, bool packed);
}  // namespace cpu
namespace cuda {
std::tuple<at::Tensor, at::Tensor> quantize_cols(const at::Tensor& x, int64_t bits,
                                                 bool stochastic, int64_t seed, int64_t offset,
                                                 int64_t block, bool packed);
}  // namespace cuda

}  // namespace qtrain
