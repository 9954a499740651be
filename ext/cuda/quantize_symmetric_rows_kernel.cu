// quantize_symmetric_rows on CUDA (front: ops/quantize_symmetric_rows.cpp; reference
// qtrain/quant/granular.py quantize_rows_symmetric, CPU twin
// cpu/quantize_symmetric_rows_kernel.cpp).
//
// One kernel: a group of threads per row (a warp for rows of up to kWarpCols values, a
// whole block for wider ones; grid-stride over the rows) reduces the row's absmax as a
// bit pattern (abs_bits: exact, order-free, NaN / Inf above every finite value), derives
// pre / inv / scale from it with quantize_symmetric's device rule (common.cuh
// quant_params, __fdiv_rn), and quantizes the row with quantize_one at counters
// offset + r * cols + j. Each element is a pure function of (x, its row's absmax, its
// flat index), so the result is bit-identical to the reference for any launch shape. A
// row with NaN / Inf sets a device flag and is left unquantized; the host reads the flag
// once after the launch and refuses x (ValueError) as the CPU op does.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kWarpCols = 1024;  // widest row a single warp takes (32 values a lane)

// Row r's elements lane, lane + stride, ... quantized with absmax bits m (finite), its
// scale written by lane 0.
template <bool STOCH>
__device__ __forceinline__ void quantize_row(const float* __restrict__ xr, int8_t* __restrict__ qr,
                                             int64_t cols, uint32_t m, int qmax,
                                             const rng::Keys& keys, uint64_t c0, int lane,
                                             int stride, float* __restrict__ scale_r) {
  const float absmax = __uint_as_float(m);
  const QuantParams p = quant_params(absmax, qmax);
  if (lane == 0) *scale_r = __fdiv_rn(absmax, static_cast<float>(qmax));
  const uint32_t hi0 = static_cast<uint32_t>(c0 >> 32);
  const uint32_t kh0 = STOCH ? rng::block_key(keys, hi0) : 0u;
  for (int64_t j = lane; j < cols; j += stride) {
    float u = 0.0f;
    if constexpr (STOCH) {
      const uint64_t c = c0 + static_cast<uint64_t>(j);
      const uint32_t hi = static_cast<uint32_t>(c >> 32);
      const uint32_t kh = hi == hi0 ? kh0 : rng::block_key(keys, hi);
      u = rng::to_unit(rng::bits_lo(keys.k1, kh, static_cast<uint32_t>(c)));
    }
    qr[j] = static_cast<int8_t>(quantize_one<STOCH>(__ldg(xr + j), p, u));
  }
}

// One warp per row.
template <bool STOCH>
__global__ void __launch_bounds__(kThreads)
    rows_warp_kernel(const float* __restrict__ x, int8_t* __restrict__ q,
                     float* __restrict__ scale, int64_t rows, int64_t cols, int qmax,
                     rng::Keys keys, uint64_t offset, uint32_t* __restrict__ bad) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
       r < rows; r += step) {  // r is the same for the whole warp
    const float* xr = x + r * cols;
    uint32_t m = 0;
    for (int64_t j = lane; j < cols; j += 32) m = max(m, abs_bits(__ldg(xr + j)));
    m = __reduce_max_sync(0xffffffffu, m);
    if (m >= 0x7f800000u) {  // NaN / Inf
      if (lane == 0) atomicOr(bad, 1u);
      continue;
    }
    quantize_row<STOCH>(xr, q + r * cols, cols, m, qmax, keys,
                        offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols), lane, 32,
                        scale + r);
  }
}

// Block-wide max of v, returned to every thread. Safe to call again in the next loop
// iteration: a warp rewrites warp_max only after the whole block passed the second
// barrier, by which time warp 0 has read it, and `all` is rewritten only after the first
// barrier of the next call, which every thread reaches after reading it.
__device__ __forceinline__ uint32_t block_max_all(uint32_t v) {
  __shared__ uint32_t warp_max[32];
  __shared__ uint32_t all;
  v = __reduce_max_sync(0xffffffffu, v);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nw = static_cast<int>(blockDim.x >> 5);
    v = lane < nw ? warp_max[lane] : 0u;
    v = __reduce_max_sync(0xffffffffu, v);
    if (lane == 0) all = v;
  }
  __syncthreads();
  return all;
}

// One block per row (blockDim.x a multiple of 32).
template <bool STOCH>
__global__ void __launch_bounds__(kThreads)
    rows_block_kernel(const float* __restrict__ x, int8_t* __restrict__ q,
                      float* __restrict__ scale, int64_t rows, int64_t cols, int qmax,
                      rng::Keys keys, uint64_t offset, uint32_t* __restrict__ bad) {
  const int tid = threadIdx.x;
  const int threads = blockDim.x;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // r is the same for the block
    const float* xr = x + r * cols;
    uint32_t m = 0;
    for (int64_t j = tid; j < cols; j += threads) m = max(m, abs_bits(__ldg(xr + j)));
    m = block_max_all(m);
    if (m >= 0x7f800000u) {  // NaN / Inf
      if (tid == 0) atomicOr(bad, 1u);
      continue;
    }
    quantize_row<STOCH>(xr, q + r * cols, cols, m, qmax, keys,
                        offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols), tid,
                        threads, scale + r);
  }
}

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_rows(const at::Tensor& x_in, int64_t bits,
                                                           bool stochastic, int64_t seed,
                                                           int64_t offset) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (rows * cols == 0) return {q, at::zeros({rows, 1}, x.options())};  // no columns: range 0

  at::Tensor scale = at::empty({rows, 1}, x.options());
  at::Tensor bad = at::zeros({1}, x.options().dtype(at::kInt));
  uint32_t* badp = reinterpret_cast<uint32_t*>(bad.mutable_data_ptr<int32_t>());
  const float* xp = x.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  float* sp = scale.mutable_data_ptr<float>();
  const int qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  cudaStream_t stream = current_stream();
  if (cols <= kWarpCols) {
    const unsigned grid = grid_for(rows, kThreads / 32);
    if (stochastic) {
      rows_warp_kernel<true>
          <<<grid, kThreads, 0, stream>>>(xp, qp, sp, rows, cols, qmax, keys, off, badp);
    } else {
      rows_warp_kernel<false>
          <<<grid, kThreads, 0, stream>>>(xp, qp, sp, rows, cols, qmax, keys, off, badp);
    }
  } else {
    const unsigned grid = grid_for(rows, 1);
    if (stochastic) {
      rows_block_kernel<true>
          <<<grid, kThreads, 0, stream>>>(xp, qp, sp, rows, cols, qmax, keys, off, badp);
    } else {
      rows_block_kernel<false>
          <<<grid, kThreads, 0, stream>>>(xp, qp, sp, rows, cols, qmax, keys, off, badp);
    }
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const uint32_t flag = read_back(badp, stream);
  TORCH_CHECK_VALUE(flag == 0u,
                    "qtrain::quantize_symmetric_rows: x contains NaN or Inf; quantization needs "
                    "finite values");
  return {q, scale};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_symmetric_rows", &qtrain::cuda::quantize_symmetric_rows);
}
