// The row kernels of quantize_symmetric_rows (int8 rows, quantize_symmetric_rows_kernel.cu)
// and quantize_symmetric_rows4 (rows of 4-bit values packed two per byte,
// quantize_symmetric_rows4_kernel.cu) on CUDA; reference qtrain/quant/granular.py
// quantize_rows_symmetric, CPU twin cpu/quantize_rows_body.h.
//
// A group of threads per row (a warp for rows of up to kWarpCols values, a whole block for
// wider ones; grid-stride over the rows) reduces the row's absmax as a bit pattern
// (abs_bits: exact, order-free, NaN / Inf above every finite value), derives pre / inv /
// scale from it with quantize_symmetric's device rule (common.cuh quant_params,
// __fdiv_rn), and quantizes the row with quantize_one at counters offset + r * cols + j;
// packed, each thread quantizes the two values of a byte and writes the byte. Each value
// is a pure function of (x, its row's absmax, its flat index), so the result is
// bit-identical to the reference for any launch shape, and the packed rows are pack_int4
// of the int8 ones. A row with NaN / Inf sets a device flag and is left unquantized; the
// host reads the flag once after the launch and refuses x (ValueError) as the CPU op does.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <cstdint>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace quantize_rows {

constexpr int kThreads = 256;
constexpr int64_t kWarpCols = 1024;  // widest row a single warp takes (32 values a lane)

// Value j of the row at xr (counters from c0; hi0 / kh0 the block of c0) quantized.
template <bool STOCH>
__device__ __forceinline__ int quantize_at(const float* __restrict__ xr, int64_t j,
                                           const QuantParams& p, const rng::Keys& keys,
                                           uint64_t c0, uint32_t hi0, uint32_t kh0) {
  float u = 0.0f;
  if constexpr (STOCH) {
    const uint64_t c = c0 + static_cast<uint64_t>(j);
    const uint32_t hi = static_cast<uint32_t>(c >> 32);
    const uint32_t kh = hi == hi0 ? kh0 : rng::block_key(keys, hi);
    u = rng::to_unit(rng::bits_lo(keys.k1, kh, static_cast<uint32_t>(c)));
  }
  return quantize_one<STOCH>(__ldg(xr + j), p, u);
}

// Row r quantized with absmax bits m (finite) into its out row: int8 values lane, lane +
// stride, ...; or (PACKED) bytes lane, lane + stride, ... of two 4-bit values each (the
// low nibble value 2b; past an odd width 0). Its scale written by lane 0.
template <bool STOCH, bool PACKED>
__device__ __forceinline__ void quantize_row(const float* __restrict__ xr, void* __restrict__ out,
                                             int64_t cols, uint32_t m, int qmax,
                                             const rng::Keys& keys, uint64_t c0, int lane,
                                             int stride, float* __restrict__ scale_r) {
  const float absmax = __uint_as_float(m);
  const QuantParams p = quant_params(absmax, qmax);
  if (lane == 0) *scale_r = __fdiv_rn(absmax, static_cast<float>(qmax));
  const uint32_t hi0 = static_cast<uint32_t>(c0 >> 32);
  const uint32_t kh0 = STOCH ? rng::block_key(keys, hi0) : 0u;
  if constexpr (PACKED) {
    uint8_t* pr = static_cast<uint8_t*>(out);
    for (int64_t b = lane; b < (cols + 1) / 2; b += stride) {
      const int lo = quantize_at<STOCH>(xr, 2 * b, p, keys, c0, hi0, kh0);
      const int hi = 2 * b + 1 < cols ? quantize_at<STOCH>(xr, 2 * b + 1, p, keys, c0, hi0, kh0)
                                      : 0;
      pr[b] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    }
  } else {
    int8_t* qr = static_cast<int8_t*>(out);
    for (int64_t j = lane; j < cols; j += stride) {
      qr[j] = static_cast<int8_t>(quantize_at<STOCH>(xr, j, p, keys, c0, hi0, kh0));
    }
  }
}

// Row r of out: int8 rows of cols bytes, or (PACKED) rows of (cols + 1) / 2 bytes.
template <bool PACKED>
__device__ __forceinline__ void* row_out(void* out, int64_t r, int64_t cols) {
  return static_cast<uint8_t*>(out) + r * (PACKED ? (cols + 1) / 2 : cols);
}

// One warp per row.
template <bool STOCH, bool PACKED>
__global__ void __launch_bounds__(kThreads)
    rows_warp_kernel(const float* __restrict__ x, void* __restrict__ q,
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
    quantize_row<STOCH, PACKED>(xr, row_out<PACKED>(q, r, cols), cols, m, qmax, keys,
                                offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols),
                                lane, 32, scale + r);
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
template <bool STOCH, bool PACKED>
__global__ void __launch_bounds__(kThreads)
    rows_block_kernel(const float* __restrict__ x, void* __restrict__ q,
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
    quantize_row<STOCH, PACKED>(xr, row_out<PACKED>(q, r, cols), cols, m, qmax, keys,
                                offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols),
                                tid, threads, scale + r);
  }
}

// Quantizes x [rows, cols] (contiguous, float32, rows * cols > 0) into out (int8 rows, or
// PACKED rows of (cols + 1) / 2 bytes) and scale [rows]; refuses NaN / Inf as op fn.
template <bool PACKED>
void launch(const char* fn, const at::Tensor& x, void* out, float* scale, int64_t bits,
            bool stochastic, int64_t seed, int64_t offset) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  at::Tensor bad = at::zeros({1}, x.options().dtype(at::kInt));
  uint32_t* badp = reinterpret_cast<uint32_t*>(bad.mutable_data_ptr<int32_t>());
  const float* xp = x.const_data_ptr<float>();
  const int qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  cudaStream_t stream = current_stream();
  if (cols <= kWarpCols) {
    const unsigned grid = grid_for(rows, kThreads / 32);
    if (stochastic) {
      rows_warp_kernel<true, PACKED>
          <<<grid, kThreads, 0, stream>>>(xp, out, scale, rows, cols, qmax, keys, off, badp);
    } else {
      rows_warp_kernel<false, PACKED>
          <<<grid, kThreads, 0, stream>>>(xp, out, scale, rows, cols, qmax, keys, off, badp);
    }
  } else {
    const unsigned grid = grid_for(rows, 1);
    if (stochastic) {
      rows_block_kernel<true, PACKED>
          <<<grid, kThreads, 0, stream>>>(xp, out, scale, rows, cols, qmax, keys, off, badp);
    } else {
      rows_block_kernel<false, PACKED>
          <<<grid, kThreads, 0, stream>>>(xp, out, scale, rows, cols, qmax, keys, off, badp);
    }
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const uint32_t flag = read_back(badp, stream);
  TORCH_CHECK_VALUE(flag == 0u, fn,
                    ": x contains NaN or Inf; quantization needs finite values");
}

}  // namespace quantize_rows
}  // namespace cuda
}  // namespace qtrain
