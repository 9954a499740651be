// pack_bits on CUDA (front: ops/pack_bits.cpp; Packing: rowwise.cuh): 32 values per
// thread (two 16-byte loads) to 4 * bits bytes with one store; unaligned inputs and the
// stream's end value by value, writing only the bytes that exist. 8 bits: a copy.
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

// 32 values per thread -> 4 * B bytes. aligned: `in` is 16-byte aligned.
template <int B>
__global__ void __launch_bounds__(kThreads)
    pack_bits_kernel(const uint8_t* __restrict__ in, bool aligned, int64_t n,
                     uint8_t* __restrict__ out) {
  using P = Packing<B>;
  const int64_t chunks = (n + 31) >> 5, nbytes = (n * B + 7) / 8;
  for (int64_t ch = blockIdx.x * int64_t{kThreads} + threadIdx.x; ch < chunks;
       ch += int64_t{gridDim.x} * kThreads) {
    const int64_t e0 = ch << 5;
    uint8_t* dst = out + ch * 4 * B;  // out is fresh: aligned for a 4 * B-byte store
    if (aligned && e0 + 32 <= n) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(in + e0));
      const uint4 b = __ldg(reinterpret_cast<const uint4*>(in + e0) + 1);
      const uint64_t s0 = P::squeeze(u64(a.x, a.y)), s1 = P::squeeze(u64(a.z, a.w));
      const uint64_t s2 = P::squeeze(u64(b.x, b.y)), s3 = P::squeeze(u64(b.z, b.w));
      if (B == 1) {
        *reinterpret_cast<uint32_t*>(dst) =
            static_cast<uint32_t>(s0 | (s1 << 8) | (s2 << 16) | (s3 << 24));
      } else if (B == 2) {
        const uint64_t w = s0 | (s1 << 16) | (s2 << 32) | (s3 << 48);
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(static_cast<uint32_t>(w), static_cast<uint32_t>(w >> 32));
      } else {
        *reinterpret_cast<uint4*>(dst) =
            make_uint4(static_cast<uint32_t>(s0), static_cast<uint32_t>(s1),
                       static_cast<uint32_t>(s2), static_cast<uint32_t>(s3));
      }
    } else {  // unaligned input or the stream's end: value by value, existing bytes only
      uint32_t w[4] = {0, 0, 0, 0};
      for (int j = 0; j < 32 && e0 + j < n; ++j) {
        const uint32_t v = static_cast<uint32_t>(in[e0 + j]) & ((1u << B) - 1u);
        w[(j * B) >> 5] |= v << ((j * B) & 31);  // B divides 32: a value never straddles
      }
      const int nb = static_cast<int>(min(int64_t{4 * B}, nbytes - ch * 4 * B));
      for (int b = 0; b < nb; ++b) dst[b] = static_cast<uint8_t>(w[b >> 2] >> (8 * (b & 3)));
    }
  }
}

at::Tensor pack_bits(const at::Tensor& values_in, int64_t bits) {
  const int64_t n = values_in.numel();
  const c10::cuda::CUDAGuard guard(values_in.device());
  const at::Tensor values = values_in.contiguous();
  at::Tensor out = at::empty({(n * bits + 7) / 8}, values.options().dtype(at::kByte));
  if (n == 0) return out;
  if (bits == 8) {  // the stream is the values themselves
    out.copy_(values.reshape({n}));
    return out;
  }
  const auto* in = static_cast<const uint8_t*>(values.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  const bool aligned = is_aligned(in, 16);
  const unsigned int grid = blocks_for((n + 31) / 32);
  const cudaStream_t stream = current_stream();
  if (bits == 1) {
    pack_bits_kernel<1><<<grid, kThreads, 0, stream>>>(in, aligned, n, op);
  } else if (bits == 2) {
    pack_bits_kernel<2><<<grid, kThreads, 0, stream>>>(in, aligned, n, op);
  } else {
    pack_bits_kernel<4><<<grid, kThreads, 0, stream>>>(in, aligned, n, op);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("pack_bits", &qtrain::cuda::pack_bits); }
