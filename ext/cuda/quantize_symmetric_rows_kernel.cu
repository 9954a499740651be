// quantize_symmetric_rows on CUDA (front: ops/quantize_symmetric_rows.cpp; reference
// qtrain/quant/granular.py quantize_rows_symmetric, CPU twin
// cpu/quantize_symmetric_rows_kernel.cpp): the row kernels of cuda/quantize_rows_body.cuh
// writing int8 rows.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/common.cuh"
#include "cuda/quantize_rows_body.cuh"

namespace qtrain {
namespace cuda {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_rows(const at::Tensor& x_in, int64_t bits,
                                                           bool stochastic, int64_t seed,
                                                           int64_t offset) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (rows * cols == 0) return {q, at::zeros({rows, 1}, x.options())};  // no columns: range 0

  at::Tensor scale = at::empty({rows, 1}, x.options());
  quantize_rows::launch<false>("qtrain::quantize_symmetric_rows", x, q.mutable_data_ptr<int8_t>(),
                               scale.mutable_data_ptr<float>(), bits, stochastic, seed, offset);
  return {q, scale};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_symmetric_rows", &qtrain::cuda::quantize_symmetric_rows);
}
