// unpack_bits on CUDA (front: ops/unpack_bits.cpp; Packing: rowwise.cuh): 4 * bits
// bytes per thread (one load) to 32 values (two 16-byte stores); unaligned inputs and
// the stream's end value by value. 8 bits: a copy of the first n bytes.
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

// 4 * B bytes per thread -> 32 values. aligned: `in` is 16-byte aligned.
template <int B>
__global__ void __launch_bounds__(kThreads)
    unpack_bits_kernel(const uint8_t* __restrict__ in, bool aligned, int64_t n,
                       uint8_t* __restrict__ out) {
  using P = Packing<B>;
  const int64_t chunks = (n + 31) >> 5;
  for (int64_t ch = blockIdx.x * int64_t{kThreads} + threadIdx.x; ch < chunks;
       ch += int64_t{gridDim.x} * kThreads) {
    const int64_t e0 = ch << 5;
    if (aligned && e0 + 32 <= n) {
      const uint8_t* src = in + ch * 4 * B;
      uint64_t s[4];
      if (B == 1) {
        const uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(src));
        for (int q = 0; q < 4; ++q) s[q] = (w >> (8 * q)) & 0xffu;
      } else if (B == 2) {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
        s[0] = w.x & 0xffffu, s[1] = w.x >> 16, s[2] = w.y & 0xffffu, s[3] = w.y >> 16;
      } else {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(src));
        s[0] = w.x, s[1] = w.y, s[2] = w.z, s[3] = w.w;
      }
      uint64_t t[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) t[q] = P::spread(s[q]);
      uint4* dst = reinterpret_cast<uint4*>(out + e0);  // out is fresh: 32-byte aligned
      dst[0] = make_uint4(static_cast<uint32_t>(t[0]), static_cast<uint32_t>(t[0] >> 32),
                          static_cast<uint32_t>(t[1]), static_cast<uint32_t>(t[1] >> 32));
      dst[1] = make_uint4(static_cast<uint32_t>(t[2]), static_cast<uint32_t>(t[2] >> 32),
                          static_cast<uint32_t>(t[3]), static_cast<uint32_t>(t[3] >> 32));
    } else {
      for (int j = 0; j < 32 && e0 + j < n; ++j) {
        const int64_t bit = (e0 + j) * B;
        out[e0 + j] = static_cast<uint8_t>((__ldg(in + (bit >> 3)) >> (bit & 7)) & ((1u << B) - 1u));
      }
    }
  }
}

at::Tensor unpack_bits(const at::Tensor& packed_in, int64_t bits, int64_t n) {
  const c10::cuda::CUDAGuard guard(packed_in.device());
  at::Tensor out = at::empty({n}, packed_in.options());
  if (n == 0) return out;
  if (bits == 8) {
    out.copy_(packed_in.narrow(0, 0, n));
    return out;
  }
  const at::Tensor packed = packed_in.contiguous();
  const auto* in = static_cast<const uint8_t*>(packed.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  const bool aligned = is_aligned(in, 16);
  const unsigned int grid = blocks_for((n + 31) / 32);
  const cudaStream_t stream = current_stream();
  if (bits == 1) {
    unpack_bits_kernel<1><<<grid, kThreads, 0, stream>>>(in, aligned, n, op);
  } else if (bits == 2) {
    unpack_bits_kernel<2><<<grid, kThreads, 0, stream>>>(in, aligned, n, op);
  } else {
    unpack_bits_kernel<4><<<grid, kThreads, 0, stream>>>(in, aligned, n, op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("unpack_bits", &qtrain::cuda::unpack_bits); }
