// pack_int4 on CUDA (front: ops/pack_int4.cpp): int8 values in [-8, 7] stored two per byte,
// value j of a row in byte j / 2 (low nibble for an even j); reference
// qtrain/quant/packed.py pack_int4, CPU twin cpu/pack_int4_kernel.cpp. One thread per
// output byte (grid-stride); a value out of range sets a device flag that the host reads
// back once after the launch and turns into the CPU kernel's ValueError.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// q: rows of d int8 values; out: rows of `bytes` = (d + 1) / 2 bytes, n = rows * bytes.
__global__ void pack_int4_kernel(const int8_t* __restrict__ q, int64_t d, int64_t bytes,
                                 int64_t n, uint8_t* __restrict__ out, int* __restrict__ bad) {
  int seen = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / bytes, c = i - r * bytes;
    const int8_t* row = q + r * d;
    const int32_t lo = row[2 * c];
    const int32_t hi = 2 * c + 1 < d ? static_cast<int32_t>(row[2 * c + 1]) : 0;
    seen |= (lo < -8) | (lo > 7) | (hi < -8) | (hi > 7);
    out[i] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
  }
  if (seen) atomicOr(bad, 1);
}

at::Tensor pack_int4(const at::Tensor& q_in) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous();
  const int64_t d = q.size(-1), bytes = (d + 1) / 2;
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  shape.back() = bytes;
  at::Tensor out = at::empty(shape, q.options().dtype(at::kByte));
  const int64_t n = out.numel();
  if (n == 0) return out;
  at::Tensor bad = at::zeros({1}, q.options().dtype(at::kInt));
  cudaStream_t stream = current_stream();
  pack_int4_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      q.const_data_ptr<int8_t>(), d, bytes, n, out.mutable_data_ptr<uint8_t>(),
      bad.mutable_data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  TORCH_CHECK_VALUE(read_back(bad.const_data_ptr<int>(), stream) == 0,
                    "qtrain::pack_int4: every value of q must be in [-8, 7] (4-bit "
                    "two's complement)");
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("pack_int4", &qtrain::cuda::pack_int4); }
