// fill_counter_uniform on CUDA (front: ops/fill_counter_uniform.cpp): out[i] is the
// counter stream's uniform at (seed, offset + i), a pure function of i, so any launch
// shape matches the reference qtrain/quant/rng.py counter_uniform bit for bit.
#include <torch/library.h>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// VEC: 4 elements per step (one float4 store); out 16-byte aligned.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    uniform_kernel(float* __restrict__ out, int64_t n, rng::Keys keys, uint64_t offset) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = tid; i < n4; i += stride) {
      float u[4];
      uniform4(keys, offset + static_cast<uint64_t>(4 * i), u);
      o4[i] = make_float4(u[0], u[1], u[2], u[3]);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    out[i] = rng::uniform(keys, offset + static_cast<uint64_t>(i));
  }
}

void fill_counter_uniform(const at::Tensor& out, int64_t seed, int64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(out.device());
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  cudaStream_t stream = current_stream();
  float* op = out.mutable_data_ptr<float>();
  const unsigned grid = grid_for((n + 3) / 4, kThreads);
  const auto start = static_cast<uint64_t>(offset);
  if (is_aligned(op, 16)) {
    uniform_kernel<true><<<grid, kThreads, 0, stream>>>(op, n, keys, start);
  } else {
    uniform_kernel<false><<<grid, kThreads, 0, stream>>>(op, n, keys, start);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("fill_counter_uniform", &qtrain::cuda::fill_counter_uniform);
}
