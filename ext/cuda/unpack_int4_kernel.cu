// unpack_int4 on CUDA (front: ops/unpack_int4.cpp): the inverse of pack_int4, each nibble
// sign-extended to int8 (value j of a row from byte j / 2, low nibble for an even j);
// reference qtrain/quant/packed.py unpack_int4, CPU twin cpu/unpack_int4_kernel.cpp. One
// thread per output value (grid-stride).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// packed: rows of `bytes` bytes; out: rows of `width` values, n = rows * width.
__global__ void unpack_int4_kernel(const uint8_t* __restrict__ packed, int64_t bytes,
                                   int64_t width, int64_t n, int8_t* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, j = i - r * width;
    const uint32_t b = packed[r * bytes + j / 2];
    out[i] = static_cast<int8_t>(static_cast<int32_t>(b << (28 - 4 * (j & 1))) >> 28);
  }
}

at::Tensor unpack_int4(const at::Tensor& packed_in, int64_t width) {
  const c10::cuda::CUDAGuard guard(packed_in.device());
  const at::Tensor packed = packed_in.contiguous();
  std::vector<int64_t> shape(packed.sizes().begin(), packed.sizes().end());
  shape.back() = width;
  at::Tensor out = at::empty(shape, packed.options().dtype(at::kChar));
  const int64_t n = out.numel();
  if (n == 0) return out;
  cudaStream_t stream = current_stream();
  unpack_int4_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      packed.const_data_ptr<uint8_t>(), packed.size(-1), width, n,
      out.mutable_data_ptr<int8_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("unpack_int4", &qtrain::cuda::unpack_int4); }
