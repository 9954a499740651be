// fill_rademacher on CUDA (front: ops/fill_rademacher.cpp): out[i] = +-fl32(1 / sqrt(k))
// by the top bit of the counter hash at (seed, offset + i), a pure function of i, so
// any launch shape matches the reference qtrain/quant/projection.py rademacher.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

// +-mag by the top bit of the counter hash at offset + i.
__global__ void __launch_bounds__(kThreads)
    rademacher_kernel(float* __restrict__ out, int64_t n, uint32_t mag_bits, rng::Keys keys,
                      uint64_t offset) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const uint64_t c = offset + static_cast<uint64_t>(i);
    const uint32_t h = rng::bits_lo(keys.k1, rng::block_key(keys, static_cast<uint32_t>(c >> 32)),
                                    static_cast<uint32_t>(c));
    out[i] = __uint_as_float(mag_bits | (h & 0x80000000u));
  }
}

void fill_rademacher(const at::Tensor& out, int64_t seed, int64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(out.device());
  rademacher_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      out.mutable_data_ptr<float>(), n, float_bits(rademacher_mag(out.size(1))),
      rng::keys_from_seed(static_cast<uint64_t>(seed)), static_cast<uint64_t>(offset));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("fill_rademacher", &qtrain::cuda::fill_rademacher); }
