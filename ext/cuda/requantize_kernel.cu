// requantize on CUDA (front: ops/requantize.cpp; reference qtrain/ops/integer.py
// reference_requantize, CPU twin cpu/requantize_kernel.cpp): int32 to int8 through the
// window [shift, shift + 6], elementwise, the rule of cuda/integer.cuh (requantize_one).
// A grid-stride loop, 4 elements per step (one int4 load, one 32-bit store) where x is
// 16-byte aligned; integers only, so the result is the reference's for any launch shape.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda/common.cuh"
#include "cuda/integer.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    requantize_kernel(const int32_t* __restrict__ x, int8_t* __restrict__ q, int64_t n,
                      int shift) {
  requantize_range<VEC>(x, q, n, shift);
}

at::Tensor requantize(const at::Tensor& x_in, int64_t shift) {
  const int64_t n = x_in.numel();
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (n == 0) return q;
  const int32_t* xp = x.const_data_ptr<int32_t>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  const bool vec = is_aligned(xp, 16) && is_aligned(qp, 4);
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kThreads);
  if (vec) {
    requantize_kernel<true><<<grid, kThreads, 0, current_stream()>>>(xp, qp, n,
                                                                     static_cast<int>(shift));
  } else {
    requantize_kernel<false><<<grid, kThreads, 0, current_stream()>>>(xp, qp, n,
                                                                      static_cast<int>(shift));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return q;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("requantize", &qtrain::cuda::requantize); }
