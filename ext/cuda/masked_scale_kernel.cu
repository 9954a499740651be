// masked_scale on CUDA (front: ops/masked_scale.cpp): a thread per mask byte, its 8
// gradient values loaded as two float4 where aligned; each product fl32(grad * scale)
// is kept or cleared to +0 by its mask bit.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

// out[i] = grad[i] * s where bit i of the mask is set, else +0; 8 values per mask byte.
__global__ void __launch_bounds__(kThreads)
    masked_scale_kernel(const float* __restrict__ grad, bool aligned,
                        const uint8_t* __restrict__ mask, int64_t n, float s,
                        float* __restrict__ out) {
  const int64_t bytes = (n + 7) >> 3;
  for (int64_t b = blockIdx.x * int64_t{kThreads} + threadIdx.x; b < bytes;
       b += int64_t{gridDim.x} * kThreads) {
    const uint32_t m = __ldg(mask + b);
    const int64_t e0 = b << 3;
    if (aligned && e0 + 8 <= n) {
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(grad + e0));
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(grad + e0) + 1);
      float v[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // keep the product's bits or clear them (+0)
        v[j] = __uint_as_float(__float_as_uint(__fmul_rn(v[j], s)) & (0u - ((m >> j) & 1u)));
      }
      reinterpret_cast<float4*>(out + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(out + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      for (int j = 0; j < 8 && e0 + j < n; ++j) {
        out[e0 + j] = ((m >> j) & 1u) ? __fmul_rn(__ldg(grad + e0 + j), s) : 0.0f;
      }
    }
  }
}

at::Tensor masked_scale(const at::Tensor& grad_in, const at::Tensor& packed_in, double scale) {
  const int64_t n = grad_in.numel();
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor packed = packed_in.contiguous();
  at::Tensor out = at::empty(grad.sizes(), grad.options());
  if (n == 0) return out;
  const auto* g = grad.const_data_ptr<float>();
  masked_scale_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, current_stream()>>>(
      g, is_aligned(g, 16), static_cast<const uint8_t*>(packed.const_data_ptr()), n,
      static_cast<float>(scale), out.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("masked_scale", &qtrain::cuda::masked_scale); }
