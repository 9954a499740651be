// quantize_rows_means on CUDA (front: ops/quantize_rows_means.cpp; the levels and the
// bytes: common/row_means.h). Two kernels: a warp per row sums it in float64 (lanes strided,
// then a shuffle tree), then its two sides, and writes its threshold and levels; then a
// thread per output byte compares its 8 values with their rows' thresholds. The sums'
// order is not the CPU's, so a row's levels are the reference's wherever its sums are
// exact (values spanning under 53 bits).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "common/row_means.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

__device__ __forceinline__ double warp_sum(double v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

__global__ void __launch_bounds__(kThreads)
    row_levels_kernel(const float* __restrict__ x, int64_t rows, int64_t width,
                      float* __restrict__ t_out, c10::BFloat16* __restrict__ zero,
                      c10::BFloat16* __restrict__ range) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t r = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5); r < rows; r += warps) {
    const float* h = x + r * width;
    double sum = 0.0;
    for (int64_t j = lane; j < width; j += 32) sum += h[j];
    const float t = row_means::threshold(warp_sum(sum), width);
    double high_sum = 0.0, low_sum = 0.0;
    int64_t high_count = 0;
    for (int64_t j = lane; j < width; j += 32) {
      const float v = h[j];
      if (v >= t) {
        high_sum += v;
        ++high_count;
      } else {
        low_sum += v;
      }
    }
    high_sum = warp_sum(high_sum);
    low_sum = warp_sum(low_sum);
    high_count = warp_sum(high_count);
    if (lane == 0) {
      const row_means::Levels l =
          row_means::levels(t, high_sum, high_count, low_sum, width - high_count);
      t_out[r] = t;
      zero[r] = l.zero;
      range[r] = l.range;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    pack_sides_kernel(const float* __restrict__ x, const float* __restrict__ t, int64_t width,
                      int64_t n, int64_t nbytes, uint8_t* __restrict__ out) {
  for (int64_t b = blockIdx.x * int64_t{kThreads} + threadIdx.x; b < nbytes;
       b += int64_t{gridDim.x} * kThreads) {
    out[b] = row_means::side_byte(x, t, width, n, b);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows_means(const at::Tensor& x_in) {
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Quantized q = allocate_quantized(x_in.options(), rows, width, 1);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  at::Tensor t = at::empty({rows}, x.options());
  const cudaStream_t stream = current_stream();
  row_levels_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(
      x.const_data_ptr<float>(), rows, width, t.mutable_data_ptr<float>(),
      static_cast<c10::BFloat16*>(q.zero.mutable_data_ptr()),
      static_cast<c10::BFloat16*>(q.range.mutable_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t nbytes = q.packed.numel();
  pack_sides_kernel<<<blocks_for(nbytes), kThreads, 0, stream>>>(
      x.const_data_ptr<float>(), t.const_data_ptr<float>(), width, rows * width, nbytes,
      static_cast<uint8_t*>(q.packed.mutable_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_rows_means", &qtrain::cuda::quantize_rows_means);
}
