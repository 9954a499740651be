// project_quantize_rows on CUDA (front: ops/project_quantize_rows.cpp; shared device
// code: rowwise.cuh). One tile of rows at a time per block: x is staged in shared
// memory in chunks of input columns, each thread adds one output column of 4 rows (the
// reference's signed sums in input order, signs from a bit table built once per call),
// and the projected tile, which never leaves shared memory, is quantized and packed as
// quantize_rows does. k > kMaxFusedK: projected into global memory, then quantize_rows.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

struct ProjectArgs {
  int64_t rows, d, k;
  int tile_rows, chunk;  // rows per tile (a multiple of 8), input columns per x stage
  int team, bits;
  bool vec_x;  // x rows 16-byte aligned (d % 4 == 0 and an aligned base)
  float top, mag;
  rng::Keys keys;
  uint64_t offset;
  const uint32_t* signs;
  uint8_t* packed;
  uint16_t* zero;
  uint16_t* range;
};

// quantize_rows of x R, one tile of rows at a time, x R in shared memory only.
// Shared memory: x stage [tile_rows][chunk + 4], y [tile_rows][k], zero_s, inv_s.
template <bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    project_quantize_kernel(const float* __restrict__ x, const ProjectArgs a) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int TR = a.tile_rows, pitch = a.chunk + 4;
  const int k = static_cast<int>(a.k);
  float* x_s = smem;
  float* y_s = x_s + TR * pitch;
  float* zero_s = y_s + TR * k;
  float* inv_s = zero_s + TR;
  const int64_t tiles = (a.rows + TR - 1) / TR;
  const int items = TR / 4 * k;  // (4 rows, 1 column) per item
  const int chunks = static_cast<int>((a.d + a.chunk - 1) / a.chunk);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = tile * TR;
    const int nr = static_cast<int>(min(int64_t{TR}, a.rows - r0));
    for (int base = 0; base < items; base += kThreads) {
      const int item = base + threadIdx.x;
      const bool active = item < items;
      const int rg = active ? item / k : 0, c = active ? item - rg * k : 0;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // +0, as the reference's zeros
      for (int ch = 0; ch < chunks; ++ch) {
        const int64_t c0 = int64_t{ch} * a.chunk;
        const int len = static_cast<int>(min(int64_t{a.chunk}, a.d - c0));
        if (chunks > 1 || base == 0) {  // one stage serves every item batch
          __syncthreads();
          if (a.vec_x) {
            const int len4 = len / 4;
            for (int idx = threadIdx.x; idx < TR * len4; idx += kThreads) {
              const int r = idx / len4, i = idx - r * len4;
              const float4 v = r < nr ? __ldg(reinterpret_cast<const float4*>(
                                            x + (r0 + r) * a.d + c0 + 4 * i))
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
              *reinterpret_cast<float4*>(x_s + r * pitch + 4 * i) = v;
            }
          } else {
            for (int idx = threadIdx.x; idx < TR * len; idx += kThreads) {
              const int r = idx / len, i = idx - r * len;
              x_s[r * pitch + i] = r < nr ? __ldg(x + (r0 + r) * a.d + c0 + i) : 0.0f;
            }
          }
          __syncthreads();
        }
        if (active) signed_sums(x_s, pitch, rg, len, c0, a.signs, a.k, c, acc);
      }
      if (active) {
#pragma unroll
        for (int t = 0; t < 4; ++t) y_s[(4 * rg + t) * k + c] = __fmul_rn(acc[t], a.mag);
      }
    }
    __syncthreads();
    tile_stats<false>(y_s, nr, a.k, a.team, k % 4 == 0, a.top, a.zero + r0, a.range + r0, zero_s,
                      inv_s);
    __syncthreads();
    const uint64_t first = static_cast<uint64_t>(r0 * a.k);
    pack_tile<kStochastic, false>(y_s, true, int64_t{nr} * k, a.k, first, zero_s, inv_s, a.top,
                                  a.bits, a.keys, a.offset, a.packed + (first >> 3) * a.bits);
    __syncthreads();  // shared memory is rewritten by the next tile
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_quantize_rows(
    const at::Tensor& x_in, int64_t k, int64_t bits, bool stochastic, int64_t seed,
    int64_t offset, int64_t projection_offset) {
  const int64_t rows = x_in.size(0), d = x_in.size(1);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Quantized q = allocate_quantized(x_in.options(), rows, k, bits);
  if (rows == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const cudaStream_t stream = current_stream();
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const at::Tensor signs = sign_words(x.options(), d, k, k, false, keys,
                                      static_cast<uint64_t>(projection_offset), stream);
  const auto* sp = static_cast<const uint32_t*>(signs.const_data_ptr());
  const float mag = rademacher_mag(k);
  if (k > kMaxFusedK) {  // rare shapes: project into global memory, then quantize
    at::Tensor y = at::empty({rows, k}, x.options());
    launch_signed_sums(x.const_data_ptr<float>(), rows, d, k, sp, mag,
                       y.mutable_data_ptr<float>(), stream);
    launch_quantize_rows(y.const_data_ptr<float>(), rows, k, bits, stochastic, keys, offset, q,
                         stream);
    return {q.packed, q.zero, q.range};
  }
  ProjectArgs a;
  a.rows = rows;
  a.d = d;
  a.k = k;
  a.tile_rows = fused_tile_rows(k);
  const int64_t tr = a.tile_rows;
  // input columns per stage: what the budget leaves after y, a multiple of 32
  const int64_t room = ((kSmemFloats - tr * k - 2 * tr) / tr - 4) / 32 * 32;
  a.chunk = static_cast<int>(std::max<int64_t>(32, std::min(room, (d + 31) / 32 * 32)));
  a.team = team_for(k);
  a.bits = static_cast<int>(bits);
  a.vec_x = d % 4 == 0 && is_aligned(x.const_data_ptr(), 16);
  a.top = static_cast<float>((1 << bits) - 1);
  a.mag = mag;
  a.keys = keys;
  a.offset = static_cast<uint64_t>(offset);
  a.signs = sp;
  a.packed = static_cast<uint8_t*>(q.packed.mutable_data_ptr());
  a.zero = bf16_ptr(q.zero);
  a.range = bf16_ptr(q.range);
  const size_t smem = static_cast<size_t>(tr * (a.chunk + 4) + tr * k + 2 * tr) * sizeof(float);
  const int64_t tiles = (rows + tr - 1) / tr;
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(tiles, int64_t{1} << 30));
  if (stochastic) {
    project_quantize_kernel<true><<<grid, kThreads, smem, stream>>>(x.const_data_ptr<float>(), a);
  } else {
    project_quantize_kernel<false><<<grid, kThreads, smem, stream>>>(x.const_data_ptr<float>(), a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {q.packed, q.zero, q.range};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("project_quantize_rows", &qtrain::cuda::project_quantize_rows);
}
