// dyq on CUDA (front: ops/dyq.cpp; reference qtrain/ops/integer.py reference_dyq, CPU twin
// cpu/dyq_kernel.cpp): GCINT's dynamic quantization, int32 to int8 through the 7-bit window
// of bit positions that holds the most nonzero magnitudes, chosen on the device.
//
// Two kernels on one stream, no host round trip (the shift never visits the host):
//
//   1. the MSB histogram (msb_histogram): bin 31 - clz(|x|) of each nonzero element, |x|
//      unsigned so that -2^31 lands in bin 31. Each thread counts into its own column of a
//      shared [33][256] table (bank = thread, so no conflicts and no atomics; row 32 takes
//      the zeros), then each warp sums 4 bins over the block and adds them with one 64-bit
//      atomicAdd each into a zero-filled global unsigned long long [32].
//   2. the requantization: thread 0 of every block derives k from the histogram
//      (window_shift: the sums of 7 consecutive bins for k = 0..25, the first maximum, so
//      the lowest k on ties; 0 when all bins are 0; or, with a tail, bounded_window_shift:
//      the lowest k whose bins k + 7 .. 31 hold at most one nonzero value in 2^tail), block
//      0 writes it to the int64 0-d shift tensor, and every thread applies
//      cuda/integer.cuh's requantize_one with it.
//
// Integer counts and integer arithmetic only: the result is the reference's bit for bit, for
// any launch shape. Both passes load 4 elements at a time (int4) where x is 16-byte aligned.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "cuda/common.cuh"
#include "cuda/integer.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBins = 32;
constexpr int kWindow = 7;     // magnitude bits of an int8
constexpr int kMaxShift = 25;  // k = 0..25: the window's top bit is at most 31

// The bin of x's magnitude: its leading one's position, kBins (no bin) for 0.
__device__ __forceinline__ int msb_bin(int32_t x) {
  const uint32_t m = x < 0 ? 0u - static_cast<uint32_t>(x) : static_cast<uint32_t>(x);
  return m == 0u ? kBins : 31 - __clz(static_cast<int>(m));
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    histogram_kernel(const int32_t* __restrict__ x, int64_t n,
                     unsigned long long* __restrict__ hist) {
  // counts[b][t]: thread t's count of bin b (row kBins: zeros, never read)
  __shared__ uint32_t counts[kBins + 1][kThreads];
#pragma unroll
  for (int b = 0; b <= kBins; ++b) counts[b][threadIdx.x] = 0u;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    const int4* x4 = reinterpret_cast<const int4*>(x);
    for (int64_t i = tid; i < n4; i += stride) {
      const int4 v = __ldg(x4 + i);
      ++counts[msb_bin(v.x)][threadIdx.x];
      ++counts[msb_bin(v.y)][threadIdx.x];
      ++counts[msb_bin(v.z)][threadIdx.x];
      ++counts[msb_bin(v.w)][threadIdx.x];
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) ++counts[msb_bin(__ldg(x + i))][threadIdx.x];
  __syncthreads();
  // warp w sums bins w, w + 8, w + 16, w + 24 over the block's threads
  const int lane = threadIdx.x & 31;
  for (int b = threadIdx.x >> 5; b < kBins; b += kThreads / 32) {
    unsigned long long s = 0;
#pragma unroll
    for (int t = lane; t < kThreads; t += 32) s += counts[b][t];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0 && s != 0) atomicAdd(hist + b, s);
  }
}

// DyQ's k from the histogram: the first maximum of the 7-bin window sums over k = 0..25.
__device__ __forceinline__ int window_shift(const unsigned long long* __restrict__ hist) {
  unsigned long long h[kBins];
#pragma unroll
  for (int b = 0; b < kBins; ++b) h[b] = hist[b];
  unsigned long long w = 0;
#pragma unroll
  for (int b = 0; b < kWindow; ++b) w += h[b];
  unsigned long long best = w;
  int k = 0;
#pragma unroll
  for (int s = 1; s <= kMaxShift; ++s) {
    w = w - h[s - 1] + h[s + kWindow - 1];
    if (w > best) {  // strictly greater: ties keep the lowest k
      best = w;
      k = s;
    }
  }
  return k;
}

// dyq with a saturation bound: the first k in 0..25 whose bins k + 7 .. 31 hold at most one
// nonzero value in 2^tail (k = 25 saturates none).
__device__ __forceinline__ int bounded_window_shift(const unsigned long long* __restrict__ hist,
                                                    int tail) {
  unsigned long long nonzero = 0;
#pragma unroll
  for (int b = 0; b < kBins; ++b) nonzero += hist[b];
  unsigned long long saturated = 0;
  int best = kMaxShift;
  for (int k = kMaxShift; k >= 0; --k) {
    if (k + kWindow < kBins) saturated += hist[k + kWindow];
    if ((saturated << tail) <= nonzero) best = k;
  }
  return best;
}

// tail < 0: the paper's fullest window; else bounded_window_shift.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    dyq_requantize_kernel(const int32_t* __restrict__ x, int8_t* __restrict__ q, int64_t n,
                          const unsigned long long* __restrict__ hist, int tail,
                          int64_t* __restrict__ shift_out) {
  __shared__ int shift_s;
  if (threadIdx.x == 0) {
    const int k = tail < 0 ? window_shift(hist) : bounded_window_shift(hist, tail);
    shift_s = k;
    if (blockIdx.x == 0) *shift_out = k;
  }
  __syncthreads();
  requantize_range<VEC>(x, q, n, shift_s);
}

std::tuple<at::Tensor, at::Tensor> dyq(const at::Tensor& x_in, std::optional<int64_t> tail_in) {
  const int tail = tail_in.has_value() ? static_cast<int>(*tail_in) : -1;
  const int64_t n = x_in.numel();
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (n == 0) return {q, at::zeros({}, x.options().dtype(at::kLong))};  // no bins: k = 0
  at::Tensor hist = at::zeros({kBins}, x.options().dtype(at::kLong));
  at::Tensor shift = at::empty({}, x.options().dtype(at::kLong));
  const int32_t* xp = x.const_data_ptr<int32_t>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  auto* hp = reinterpret_cast<unsigned long long*>(hist.mutable_data_ptr<int64_t>());
  int64_t* sp = shift.mutable_data_ptr<int64_t>();
  const bool vec = is_aligned(xp, 16) && is_aligned(qp, 4);
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kThreads);
  cudaStream_t stream = current_stream();
  if (vec) {
    histogram_kernel<true><<<grid, kThreads, 0, stream>>>(xp, n, hp);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    dyq_requantize_kernel<true><<<grid, kThreads, 0, stream>>>(xp, qp, n, hp, tail, sp);
  } else {
    histogram_kernel<false><<<grid, kThreads, 0, stream>>>(xp, n, hp);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    dyq_requantize_kernel<false><<<grid, kThreads, 0, stream>>>(xp, qp, n, hp, tail, sp);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {q, shift};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("dyq", &qtrain::cuda::dyq); }
