// What the CUDA kernels of GCINT's integer ops share (int8_gemm_int32 through cuda/gemm.cuh,
// int8_spmm, requantize, dyq): int32 saturation and the device-side requantization rule of
// qtrain/ops/integer.py (reference_requantize), in one place for requantize_kernel.cu and
// dyq_kernel.cu. Integers only: every result is exact, whatever the launch shape.
#pragma once

#include <cstdint>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {

#if defined(__CUDACC__)

// An exact int64 sum clamped to [-2^31, 2^31 - 1] (the references' clamp before .to(int32)).
__device__ __forceinline__ int32_t saturate_int32(long long v) {
  return static_cast<int32_t>(max(min(v, 2147483647LL), -2147483648LL));
}

// One int32 through the window [shift, shift + 6] (shift in 0..25): m = |x|, rounded to
// nearest at bit `shift` ((m + 2^(shift-1)) >> shift), at most 127, x's sign. The
// magnitude is unsigned 32-bit: |-2^31| = 2^31 fits, and m + 2^24 < 2^32, so it is the
// reference's int64 arithmetic exactly.
__device__ __forceinline__ int32_t requantize_one(int32_t x, int shift) {
  uint32_t m = x < 0 ? 0u - static_cast<uint32_t>(x) : static_cast<uint32_t>(x);
  const uint32_t half = shift > 0 ? 1u << (shift - 1) : 0u;
  m = min((m + half) >> shift, 127u);
  const int32_t s = static_cast<int32_t>(m);
  return x < 0 ? -s : s;
}

// q[i] = requantize_one(x[i], shift) for i in [0, n), a grid-stride loop. VEC: 4 elements
// per step (one int4 load, one 32-bit store); x 16-byte and q 4-byte aligned.
template <bool VEC>
__device__ __forceinline__ void requantize_range(const int32_t* __restrict__ x,
                                                 int8_t* __restrict__ q, int64_t n, int shift) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    const int4* x4 = reinterpret_cast<const int4*>(x);
    uint32_t* q4 = reinterpret_cast<uint32_t*>(q);
    for (int64_t i = tid; i < n4; i += stride) {
      const int4 v = __ldg(x4 + i);
      q4[i] = pack4(requantize_one(v.x, shift), requantize_one(v.y, shift),
                    requantize_one(v.z, shift), requantize_one(v.w, shift));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    q[i] = static_cast<int8_t>(requantize_one(__ldg(x + i), shift));
  }
}

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace qtrain
