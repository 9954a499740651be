// hadamard_rotate on CUDA (front: ops/hadamard_rotate.cpp; reference
// qtrain/quant/granular.py hadamard_rotate, CPU twin cpu/hadamard_rotate_kernel.cpp).
//
// out [rows, P] read as one flat run of rows * P values, cut into chunks of kChunk = 1024
// values: B divides 1024 and P, so every block of B values lies inside one chunk (the
// last chunk may be shorter, still whole blocks). A thread block of kThreads threads takes
// a chunk at a time (grid-stride), each thread kPer values, at positions p = tid + k *
// kThreads of the chunk:
//
//   load:   out value f = chunk * kChunk + p is x[f / P, f % P], or 0 past cols
//   h < 32: the butterfly's partner p ^ h is in the same warp: __shfl_xor_sync, the lower
//           lane of a pair keeps u + v, the upper u - v (u the lower position's value)
//   h >= 32 (B > 32 only): through shared memory, a barrier before and after each stage
//   store:  times fl32(1 / sqrt(B)) (B > 1), coalesced
//
// The float32 operations and their order are the CPU kernel's (__fadd_rn / __fsub_rn /
// __fmul_rn: no contraction), so the two agree bit for bit. Flat indices and the divisions
// are 32-bit when rows * P < 2^32 (most calls), 64-bit otherwise.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;  // the largest block; every block lies inside one chunk
constexpr int kPer = kChunk / kThreads;

template <typename Index>
__global__ void __launch_bounds__(kThreads)
    rotate_kernel(const float* __restrict__ x, float* __restrict__ out, Index total, Index cols,
                  Index padded, int block, float scale) {
  __shared__ float tile[kChunk];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int shuffle_end = block < 32 ? block : 32;  // stages h < shuffle_end by shuffles
  const Index chunks = (total + kChunk - 1) / kChunk;
  for (Index chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {  // same for the block
    const Index base = chunk * static_cast<Index>(kChunk);
    float v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const Index f = base + static_cast<Index>(tid + k * kThreads);
      v[k] = 0.0f;
      if (f < total) {
        const Index r = f / padded;
        const Index c = f - r * padded;
        if (c < cols) v[k] = __ldg(x + r * cols + c);
      }
    }
    for (int h = 1; h < shuffle_end; h <<= 1) {
      const bool upper = (lane & h) != 0;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const float w = __shfl_xor_sync(0xffffffffu, v[k], h);
        v[k] = upper ? __fsub_rn(w, v[k]) : __fadd_rn(v[k], w);
      }
    }
    if (block > 32) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) tile[tid + k * kThreads] = v[k];
      for (int h = 32; h < block; h <<= 1) {
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int p = tid + k * kThreads;
          const float u = tile[p & ~h];
          const float w = tile[p | h];
          v[k] = (p & h) != 0 ? __fsub_rn(u, w) : __fadd_rn(u, w);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kPer; ++k) tile[tid + k * kThreads] = v[k];
      }
      __syncthreads();  // the tile is rewritten by the next chunk
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const Index f = base + static_cast<Index>(tid + k * kThreads);
      if (f < total) out[f] = block > 1 ? __fmul_rn(v[k], scale) : v[k];
    }
  }
}

at::Tensor hadamard_rotate(const at::Tensor& x_in, int64_t block) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t padded = (cols + block - 1) / block * block;
  at::Tensor out = at::empty({rows, padded}, x.options());
  const int64_t total = rows * padded;
  if (total == 0) return out;

  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  const int b = static_cast<int>(block);
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  const unsigned grid = grid_for(chunks, 1, 8);
  cudaStream_t stream = current_stream();
  // 32-bit indices while the flat index, its chunk rounding and x's last index fit
  if (total <= (int64_t{1} << 32) - 2 * kChunk) {
    rotate_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(
        xp, op, static_cast<uint32_t>(total), static_cast<uint32_t>(cols),
        static_cast<uint32_t>(padded), b, scale);
  } else {
    rotate_kernel<uint64_t><<<grid, kThreads, 0, stream>>>(
        xp, op, static_cast<uint64_t>(total), static_cast<uint64_t>(cols),
        static_cast<uint64_t>(padded), b, scale);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("hadamard_rotate", &qtrain::cuda::hadamard_rotate); }
