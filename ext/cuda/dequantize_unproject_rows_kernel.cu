// dequantize_unproject_rows on CUDA (front: ops/dequantize_unproject_rows.cpp; shared
// device code: rowwise.cuh). One tile of rows at a time per block: the tile's packed
// rows are dequantized into shared memory, then projected back to d columns by the
// reference's signed sums in input order, straight to global memory; the dequantized
// [rows, k] tensor never exists. k > kMaxFusedK: dequantize_rows into global memory,
// then the signed sums.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

struct UnprojectArgs {
  int64_t rows, d, k;
  int tile_rows, pitch, bits;
  bool aligned;  // packed base 8-byte aligned
  float mag;
  const uint32_t* signs;
  const uint8_t* packed;
  const uint16_t* zero;
  const uint16_t* range;
  float* out;
};

// dequantize_rows then y R^T, one tile of rows at a time, y in shared memory only.
// Shared memory: y [tile_rows][pitch], zero_s, step_s.
__global__ void __launch_bounds__(kThreads) dequantize_unproject_kernel(const UnprojectArgs a) {
  extern __shared__ float4 smem4[];
  float* y_s = reinterpret_cast<float*>(smem4);
  const int TR = a.tile_rows, pitch = a.pitch;
  float* zero_s = y_s + TR * pitch;
  float* step_s = zero_s + TR;
  const float levels = static_cast<float>((1 << a.bits) - 1);
  const int64_t tiles = (a.rows + TR - 1) / TR;
  const int64_t items = int64_t{TR / 4} * a.d;
  const int k = static_cast<int>(a.k);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = tile * TR;
    const int nr = static_cast<int>(min(int64_t{TR}, a.rows - r0));
    for (int r = threadIdx.x; r < TR; r += kThreads) {
      zero_s[r] = r < nr ? bf16_to_float(__ldg(a.zero + r0 + r)) : 0.0f;
      step_s[r] = r < nr ? __fdiv_rn(bf16_to_float(__ldg(a.range + r0 + r)), levels) : 0.0f;
    }
    for (int idx = nr * pitch + threadIdx.x; idx < TR * pitch; idx += kThreads) y_s[idx] = 0.0f;
    __syncthreads();
    // the tile's values: groups of 8 of the stream from element r0 * k (a multiple of 8)
    const int E = nr * k;
    const uint64_t first = static_cast<uint64_t>(r0 * a.k);
    const uint8_t* in = a.packed + (first >> 3) * a.bits;
    for (int g = threadIdx.x; g < (E + 7) / 8; g += kThreads) {
      const int e0 = 8 * g, nv = min(8, E - e0);
      const uint64_t word = read_group(in, g, nv, a.bits, a.aligned);
      int row = e0 / k, col = e0 - row * k;
      for (int j = 0; j < nv; ++j) {
        if (col == k) {
          ++row;
          col = 0;
        }
        y_s[row * pitch + col] = dequant(word, j, a.bits, step_s[row], zero_s[row]);
        ++col;
      }
    }
    __syncthreads();
    for (int64_t item = threadIdx.x; item < items; item += kThreads) {
      const int rg = static_cast<int>(item / a.d);
      const int64_t j = item - rg * a.d;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      signed_sums(y_s, pitch, rg, k, 0, a.signs, a.d, j, acc);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if (4 * rg + t < nr) a.out[(r0 + 4 * rg + t) * a.d + j] = __fmul_rn(acc[t], a.mag);
      }
    }
    __syncthreads();  // y_s is rewritten by the next tile
  }
}

at::Tensor dequantize_unproject_rows(const at::Tensor& packed_in, const at::Tensor& zero_in,
                                     const at::Tensor& range_in, int64_t bits, int64_t k,
                                     int64_t d, int64_t seed, int64_t projection_offset) {
  const int64_t rows = zero_in.numel();
  const c10::cuda::CUDAGuard guard(packed_in.device());
  at::Tensor out = at::empty({rows, d}, packed_in.options().dtype(at::kFloat));
  if (rows * d == 0) return out;
  const at::Tensor packed = packed_in.contiguous();
  const at::Tensor zero = zero_in.contiguous();
  const at::Tensor range = range_in.contiguous();
  const cudaStream_t stream = current_stream();
  const at::Tensor signs = sign_words(packed.options(), k, d, k, true,
                                      rng::keys_from_seed(static_cast<uint64_t>(seed)),
                                      static_cast<uint64_t>(projection_offset), stream);
  const auto* sp = static_cast<const uint32_t*>(signs.const_data_ptr());
  const float mag = rademacher_mag(k);
  const auto* pp = static_cast<const uint8_t*>(packed.const_data_ptr());
  const auto* zp = static_cast<const uint16_t*>(zero.const_data_ptr());
  const auto* rp = static_cast<const uint16_t*>(range.const_data_ptr());
  if (k > kMaxFusedK) {  // rare shapes: dequantize into global memory, then project back
    at::Tensor y = at::empty({rows, k}, packed.options().dtype(at::kFloat));
    launch_dequantize_rows(pp, zp, rp, rows, k, bits, y.mutable_data_ptr<float>(), stream);
    launch_signed_sums(y.const_data_ptr<float>(), rows, k, d, sp, mag,
                       out.mutable_data_ptr<float>(), stream);
    return out;
  }
  UnprojectArgs a;
  a.rows = rows;
  a.d = d;
  a.k = k;
  a.pitch = static_cast<int>((k + 3) / 4 * 4);
  // about 256 items per tile, and y within the shared-memory budget (k <= 1024: >= 8 rows)
  const int64_t fit = (kSmemFloats / (a.pitch + 2)) / 8 * 8;
  a.tile_rows = static_cast<int>(std::min<int64_t>(fused_tile_rows(d), fit));
  a.bits = static_cast<int>(bits);
  a.packed = pp;
  a.aligned = is_aligned(a.packed, 8);
  a.zero = zp;
  a.range = rp;
  a.mag = mag;
  a.signs = sp;
  a.out = out.mutable_data_ptr<float>();
  const int64_t tr = a.tile_rows;
  const size_t smem = static_cast<size_t>(tr * a.pitch + 2 * tr) * sizeof(float);
  const int64_t tiles = (rows + tr - 1) / tr;
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(tiles, int64_t{1} << 30));
  dequantize_unproject_kernel<<<grid, kThreads, smem, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("dequantize_unproject_rows", &qtrain::cuda::dequantize_unproject_rows);
}
