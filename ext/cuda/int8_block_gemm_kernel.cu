// int8_block_gemm on CUDA (front: ops/int8_block_gemm.cpp; reference qtrain/ops/gemm.py
// reference_block_gemm, CPU twin cpu/int8_gemm_kernel.cpp gemm_tn_blocks).
//
// "tn" with one scale per block of `block` k for each column of qa [K, M] and qb [K, N]:
// C[m, n] = sum over blocks b, in order, of fl32(float(acc_b) * fl32(sa[b, m] * sb[b, n])).
// A CUDA block owns a 64 x 64 tile of C and one group of k blocks (common/block_gemm.h;
// blockIdx.z), 256 threads of 4 x 4 outputs each; it walks its group's k blocks in order,
// staging 16 k at a time of both operands' 64 columns in shared memory, sums each k block
// exactly in int32 and adds its term in float32 (--fmad=false: no contraction) into the
// group's sum, which it writes to its slice of a [groups, M, N] workspace (C itself when
// there is one group); a second kernel adds the groups' sums in group order. The same
// additions in the same order as the reference and the CPU kernel: bit for bit the
// reference's for any launch. The groups are what spreads the work over the GPU: a weight
// gradient's [256, 256] output is 16 tiles, which one CUDA block each walking all 169,343 k
// of synthetic-arxiv left on 16 of an H200's 132 multiprocessors (20 ms a call, measured
// 2026-12-01). Plain int32 multiply-adds: the
// tensor-core path of int8_gemm (cuda/gemm.cuh) has no per-k-block epilogue yet. An operand
// stored packed (uint8, two 4-bit values a byte) is read a nibble at a time as it is staged.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/block_gemm.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kTile = 64;    // C tile: kTile x kTile
constexpr int kStage = 16;   // k staged in shared memory at a time
constexpr int kPer = 4;      // outputs per thread along each dimension
constexpr int kThreads = (kTile / kPer) * (kTile / kPer);  // 256

// Value (k, col) of a "tn" operand of `width` columns: int8, or packed (value col of row k
// in byte k * ceil(width / 2) + col / 2, the low nibble for an even col).
template <bool PACKED>
__device__ __forceinline__ int32_t operand_at(const void* __restrict__ q, int64_t k,
                                              int64_t col, int64_t width) {
  if constexpr (PACKED) {
    const uint32_t byte = __ldg(static_cast<const uint8_t*>(q) + k * ((width + 1) / 2) + col / 2);
    return static_cast<int32_t>(byte << (28 - 4 * (col & 1))) >> 28;
  } else {
    return __ldg(static_cast<const int8_t*>(q) + k * width + col);
  }
}

template <bool A_PACKED, bool B_PACKED>
__global__ void __launch_bounds__(kThreads)
    block_gemm_kernel(const void* __restrict__ a, const void* __restrict__ b,
                      const float* __restrict__ sa, const float* __restrict__ sb, int64_t K,
                      int64_t M, int64_t N, int64_t block, int64_t groups,
                      float* __restrict__ sums) {
  __shared__ int32_t as[kStage][kTile];
  __shared__ int32_t bs[kStage][kTile];
  const int tx = threadIdx.x % (kTile / kPer), ty = threadIdx.x / (kTile / kPer);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t group = blockIdx.z;
  const int64_t blocks = (K + block - 1) / block;
  // the group's blocks [blocks * g / G, blocks * (g + 1) / G), as common/block_gemm.h cuts them
  const int64_t first = blocks * group / groups, last = blocks * (group + 1) / groups;
  float part[kPer][kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
#pragma unroll
    for (int j = 0; j < kPer; ++j) part[i][j] = 0.0f;
  for (int64_t blk = first; blk < last; ++blk) {
    const int64_t k0 = blk * block, k1 = min(K, k0 + block);
    int32_t acc[kPer][kPer] = {};
    for (int64_t ks = k0; ks < k1; ks += kStage) {
      for (int i = threadIdx.x; i < kStage * kTile; i += kThreads) {
        const int kk = i / kTile, col = i % kTile;
        const int64_t k = ks + kk;
        const bool in_k = k < k1;
        as[kk][col] = in_k && m0 + col < M ? operand_at<A_PACKED>(a, k, m0 + col, M) : 0;
        bs[kk][col] = in_k && n0 + col < N ? operand_at<B_PACKED>(b, k, n0 + col, N) : 0;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kStage; ++kk) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int32_t av = as[kk][ty * kPer + i];
#pragma unroll
          for (int j = 0; j < kPer; ++j) acc[i][j] += av * bs[kk][tx * kPer + j];
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t m = m0 + ty * kPer + i;
      const float fa = m < M ? __ldg(sa + blk * M + m) : 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int64_t n = n0 + tx * kPer + j;
        const float fb = n < N ? __ldg(sb + blk * N + n) : 0.0f;
        part[i][j] = __fadd_rn(part[i][j],
                               __fmul_rn(static_cast<float>(acc[i][j]), __fmul_rn(fa, fb)));
      }
    }
  }
  float* out = sums + group * M * N;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t m = m0 + ty * kPer + i;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + tx * kPer + j;
      if (m < M && n < N) out[m * N + n] = part[i][j];
    }
  }
}

// c[i] = the groups' sums of element i added in group order: sums[0][i] + sums[1][i] + ...
__global__ void __launch_bounds__(kThreads)
    add_groups_kernel(const float* __restrict__ sums, int64_t groups, int64_t size,
                      float* __restrict__ c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < size;
       i += stride) {
    float total = sums[i];
    for (int64_t g = 1; g < groups; ++g) total = __fadd_rn(total, sums[g * size + i]);
    c[i] = total;
  }
}

at::Tensor int8_block_gemm(const at::Tensor& qa_in, const at::Tensor& qb_in,
                           const at::Tensor& scale_a_in, const at::Tensor& scale_b_in,
                           int64_t block) {
  const c10::cuda::CUDAGuard guard(qa_in.device());
  // the widths are the scales' (an operand may be stored packed)
  const int64_t K = qa_in.size(0), M = scale_a_in.size(1), N = scale_b_in.size(1);
  const at::TensorOptions opts = qa_in.options().dtype(at::kFloat);
  if (M == 0 || N == 0 || K == 0) return at::zeros({M, N}, opts);
  const int64_t tiles_m = (M + kTile - 1) / kTile, tiles_n = (N + kTile - 1) / kTile;
  TORCH_CHECK_VALUE(tiles_m <= 65535 && tiles_n <= int64_t{0x7fffffff},
                    "qtrain::int8_block_gemm: the output [", M, ", ", N,
                    "] is too large for the CUDA kernel");
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  const at::Tensor sa = scale_a_in.contiguous();
  const at::Tensor sb = scale_b_in.contiguous();
  at::Tensor out = at::empty({M, N}, opts);
  // at most 16 groups (grid.z), and [groups, M, N] float32 at most 64 MiB (block_gemm.h)
  const int64_t groups = block_gemm_groups((K + block - 1) / block, M, N);
  at::Tensor sums = groups == 1 ? out : at::empty({groups, M, N}, opts);
  const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m),
                  static_cast<unsigned>(groups));
  const bool a_packed = qa.scalar_type() == at::kByte, b_packed = qb.scalar_type() == at::kByte;
  auto kernel = a_packed
                    ? (b_packed ? block_gemm_kernel<true, true> : block_gemm_kernel<true, false>)
                    : (b_packed ? block_gemm_kernel<false, true> : block_gemm_kernel<false, false>);
  const cudaStream_t stream = current_stream();
  kernel<<<grid, kThreads, 0, stream>>>(qa.const_data_ptr(), qb.const_data_ptr(),
                                        sa.const_data_ptr<float>(), sb.const_data_ptr<float>(), K,
                                        M, N, block, groups, sums.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (groups > 1) {
    add_groups_kernel<<<grid_for(M * N, kThreads), kThreads, 0, stream>>>(
        sums.const_data_ptr<float>(), groups, M * N, out.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("int8_block_gemm", &qtrain::cuda::int8_block_gemm);
}
