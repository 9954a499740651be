// keep_mask_rows on CUDA (front: ops/keep_mask_rows.cpp; reference qtrain/ops/masks.py
// reference_keep_mask; CPU twin cpu/keep_mask_rows_kernel.cpp). One thread per output
// byte computes its 8 mask bits, so no two threads write one byte and the result is a
// pure function of (seed, ids, width, threshold) whatever the launch shape. An id outside
// [0, 2^62 / width) (its counters would pass 2^63) sets a device flag: the host reads it
// after the launch and raises, as the CPU kernel does while it reads the ids.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    keep_mask_kernel(const int64_t* __restrict__ ids, int64_t width, int64_t n, int64_t bytes,
                     rng::Keys keys, uint32_t threshold, uint8_t* __restrict__ out,
                     int* __restrict__ bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t id_limit = (int64_t{1} << 62) / width;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes;
       b += stride) {
    uint32_t byte = 0;
    const int64_t e0 = 8 * b;
    const int64_t e1 = min(n, e0 + 8);
    int64_t r = e0 / width;
    int64_t j = e0 - r * width;
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t id = __ldg(ids + r);
      if (id < 0 || id >= id_limit) {
        *bad = 1;  // the host raises; the byte's value no longer matters
        break;
      }
      const uint64_t c = static_cast<uint64_t>(id) * static_cast<uint64_t>(width) +
                         static_cast<uint64_t>(j);
      const uint32_t h =
          rng::bits_lo(keys.k1, rng::block_key(keys, static_cast<uint32_t>(c >> 32)),
                       static_cast<uint32_t>(c));
      byte |= static_cast<uint32_t>((h >> 8) >= threshold) << (e - e0);
      if (++j == width) {
        j = 0;
        ++r;
      }
    }
    out[b] = static_cast<uint8_t>(byte);
  }
}

at::Tensor keep_mask_rows(const at::Tensor& ids_in, int64_t width, int64_t threshold,
                          int64_t seed) {
  const c10::cuda::CUDAGuard guard(ids_in.device());
  const at::Tensor ids = ids_in.contiguous();
  const int64_t n = ids.numel() * width;
  const int64_t bytes = (n + 7) / 8;
  at::Tensor out = at::empty({bytes}, ids.options().dtype(at::kByte));
  if (n == 0) return out;
  at::Tensor bad = at::zeros({1}, ids.options().dtype(at::kInt));
  cudaStream_t stream = current_stream();
  keep_mask_kernel<<<grid_for(bytes, kThreads), kThreads, 0, stream>>>(
      ids.const_data_ptr<int64_t>(), width, n, bytes,
      rng::keys_from_seed(static_cast<uint64_t>(seed)), static_cast<uint32_t>(threshold),
      out.mutable_data_ptr<uint8_t>(), bad.mutable_data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  TORCH_CHECK_VALUE(read_back(bad.const_data_ptr<int>(), stream) == 0,
                    "qtrain::keep_mask_rows: ids must be in [0, 2^62 / width)");
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("keep_mask_rows", &qtrain::cuda::keep_mask_rows); }
