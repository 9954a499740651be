// What the CUDA kernels share: launch sizing, the current stream, reading back a
// device flag, and the device-side quantization rule of qtrain/quant/quantize.py
// (the reference). Argument checks are not here: each op's front (ext/ops/) makes
// them once for every device.
//
// Bit-exactness: every float operation that must match the reference is written
// as an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn,
// __int2float_rn), which nvcc never contracts into an FMA, on top of --fmad=false.
#pragma once

// The CPU wheel of torch (cuda_check.py on machines without a GPU) ships c10/cuda
// without its generated config header, whose only macro matters on Windows.
#if !__has_include(<c10/cuda/impl/cuda_cmake_macros.h>) && !defined(C10_CUDA_NO_CMAKE_CONFIGURE_FILE)
#define C10_CUDA_NO_CMAKE_CONFIGURE_FILE
#endif

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include <ATen/core/Tensor.h>

#include "common/rng.h"

namespace qtrain {
namespace cuda {

// ---------------------------------------------------------------- host helpers

// (ATen/cuda/CUDAContext.h would pull in cuSPARSE / cuBLAS headers the build does not need.)
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

inline int sm_count() {
  int dev = 0;
  int n = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// Blocks for a grid-stride loop over `items` with `threads` per block: enough to fill
// every SM `per_sm` times over, no more (the loop covers the rest).
inline unsigned grid_for(int64_t items, int threads, int per_sm = 16) {
  const int64_t need = (items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count()) * per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(need, cap)));
}

inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Copy a small device buffer to the host and wait (errors only the data shows, found by a
// kernel: an index out of range, a NaN).
template <typename T>
T read_back(const T* dev, cudaStream_t stream) {
  T host{};
  C10_CUDA_CHECK(cudaMemcpyAsync(&host, dev, sizeof(T), cudaMemcpyDeviceToHost, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

// quantize_symmetric_kernel.cu: q[i] = quantize_one(x[i]) with pre / inv from *absmax (device
// memory, so the scale never visits the host); counters offset + i; *scale_out (if
// not null) = fl32(absmax / qmax). Used by quantize_symmetric and quantized_gemm.
void launch_quantize_given(const float* x, int8_t* q, int64_t n, const float* absmax, int qmax,
                           bool stochastic, uint64_t seed, uint64_t offset, float* scale_out,
                           cudaStream_t stream);

// ---------------------------------------------------------------- device helpers

#if defined(__CUDACC__)

// |x| as a bit pattern: for non-negative floats the integer order is the float order,
// and NaN / Inf compare above every finite value (the CPU kernel's trick).
__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// Block-wide max of v; the result is valid in thread 0. blockDim.x must be a multiple of 32.
__device__ __forceinline__ uint32_t block_max(uint32_t v) {
  __shared__ uint32_t warp_max[32];
  v = __reduce_max_sync(0xffffffffu, v);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nw = static_cast<int>(blockDim.x >> 5);
    v = lane < nw ? warp_max[lane] : 0u;
    v = __reduce_max_sync(0xffffffffu, v);
  }
  return v;
}

// pre, inv of qtrain.quant.quantize.scale_params, from absmax (float32 division, IEEE).
struct QuantParams {
  float pre;
  float inv;
  float qmax;
};

__device__ __forceinline__ QuantParams quant_params(float absmax, int qmax) {
  QuantParams p;
  p.qmax = static_cast<float>(qmax);
  p.pre = 1.0f;
  p.inv = 0.0f;
  if (absmax != 0.0f) {
    p.inv = __fdiv_rn(p.qmax, absmax);
    if (!isfinite(p.inv)) {
      p.pre = 18446744073709551616.0f;  // 2^64: exact, keeps tiny tensors on every level
      p.inv = __fdiv_rn(p.qmax, __fmul_rn(absmax, p.pre));
    }
  }
  return p;
}

// One element: v = fl32(fl32(x * pre) * inv); nearest: rint(v) (ties to even),
// stochastic: floor(fl32(v + u)); clamped to [-qmax, qmax] (in float, as torch.clamp).
template <bool STOCH>
__device__ __forceinline__ int32_t quantize_one(float x, const QuantParams& p, float u) {
  const float v = __fmul_rn(__fmul_rn(x, p.pre), p.inv);
  float r;
  if constexpr (STOCH) {
    r = floorf(__fadd_rn(v, u));
  } else {
    r = rintf(v);
  }
  r = fminf(fmaxf(r, -p.qmax), p.qmax);
  return static_cast<int32_t>(r);
}

// The stochastic-rounding uniform of counter c of a stream (its high word's block key hashed
// here: for scattered counters; uniform4 reuses it for a run).
__device__ __forceinline__ float uniform_at(const rng::Keys& keys, uint64_t c) {
  const uint32_t kh = rng::block_key(keys, static_cast<uint32_t>(c >> 32));
  return rng::to_unit(rng::bits_lo(keys.k1, kh, static_cast<uint32_t>(c)));
}

// q[i] = quantize_one(x[i]), stochastic rounding drawing counter offset + i.
template <bool STOCH>
__device__ __forceinline__ void quantize_at(const float* __restrict__ x, int8_t* __restrict__ q,
                                            int64_t i, const QuantParams& p,
                                            const rng::Keys& keys, uint64_t offset) {
  const float u = STOCH ? uniform_at(keys, offset + static_cast<uint64_t>(i)) : 0.0f;
  q[i] = static_cast<int8_t>(quantize_one<STOCH>(__ldg(x + i), p, u));
}

// Four consecutive counters c0 .. c0 + 3 of a stream: the block key of the high word
// is hashed once (it changes only where the low word wraps).
__device__ __forceinline__ void uniform4(const rng::Keys& keys, uint64_t c0, float (&u)[4]) {
  const uint32_t hi0 = static_cast<uint32_t>(c0 >> 32);
  const uint32_t kh0 = rng::block_key(keys, hi0);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint64_t c = c0 + static_cast<uint64_t>(j);
    const uint32_t hi = static_cast<uint32_t>(c >> 32);
    const uint32_t kh = hi == hi0 ? kh0 : rng::block_key(keys, hi);
    u[j] = rng::to_unit(rng::bits_lo(keys.k1, kh, static_cast<uint32_t>(c)));
  }
}

// Four int8 values (low byte first) as one 32-bit word.
__device__ __forceinline__ uint32_t pack4(int32_t a, int32_t b, int32_t c, int32_t d) {
  return (static_cast<uint32_t>(a) & 0xffu) | ((static_cast<uint32_t>(b) & 0xffu) << 8) |
         ((static_cast<uint32_t>(c) & 0xffu) << 16) | (static_cast<uint32_t>(d) << 24);
}

// Byte j of a 32-bit word as a signed int.
__device__ __forceinline__ int32_t sbyte(uint32_t w, int j) {
  return static_cast<int32_t>(static_cast<int8_t>((w >> (8 * j)) & 0xffu));
}

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace qtrain
