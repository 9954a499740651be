// quantize_symmetric_rows4 on CUDA (front: ops/quantize_symmetric_rows4.cpp; reference
// qtrain/ops/quantize.py reference_quantize_rows4, CPU twin
// cpu/quantize_symmetric_rows4_kernel.cpp): the row kernels of cuda/quantize_rows_body.cuh
// writing rows of 4-bit values packed two per byte, each thread the two values of a byte.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/common.cuh"
#include "cuda/quantize_rows_body.cuh"

namespace qtrain {
namespace cuda {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_rows4(const at::Tensor& x_in, int64_t bits,
                                                            bool stochastic, int64_t seed,
                                                            int64_t offset) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  at::Tensor packed = at::empty({rows, (cols + 1) / 2}, x.options().dtype(at::kByte));
  if (rows * cols == 0) return {packed, at::zeros({rows, 1}, x.options())};  // range 0

  at::Tensor scale = at::empty({rows, 1}, x.options());
  quantize_rows::launch<true>("qtrain::quantize_symmetric_rows4", x,
                              packed.mutable_data_ptr<uint8_t>(),
                              scale.mutable_data_ptr<float>(), bits, stochastic, seed, offset);
  return {packed, scale};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_symmetric_rows4", &qtrain::cuda::quantize_symmetric_rows4);
}
