// quantize_symmetric_cols on CUDA (front: ops/quantize_symmetric_cols.cpp; reference
// qtrain/quant/granular.py quantize_cols_symmetric; CPU twin
// cpu/quantize_symmetric_cols_kernel.cpp), and cuda::quantize_cols (common/quantize_cols.h),
// which quantize_symmetric_cols4's CUDA kernel (quantize_symmetric_cols4_kernel.cu) calls.
//
// Three launches on x [rows, cols] in its own layout, blocks of 32 columns x 8 rows (a
// warp reads 32 consecutive values of a row):
//   1. cols_absmax_kernel: each block reduces a strip of rows of its 32 columns (bit
//      patterns, abs_bits: exact, order-free, NaN / Inf above every finite value) and adds
//      them with one atomicMax per column into a zeroed uint32 [cols] buffer;
//   2. cols_params_kernel: one thread per column derives pre / inv / scale from the absmax
//      with quantize_symmetric's device rule (common.cuh quant_params, __fdiv_rn), and sets
//      a device flag for a column with NaN / Inf (its pre / inv left at 1 / 0);
//   3. cols_quantize_kernel: quantize_one of every element with its column's pre / inv, at
//      counter offset + r * cols + j.
// block > 0 (one scale per block of rows of each column): one launch, col_blocks_kernel, a
// CUDA block per (32 columns, block of rows) reducing its rows, deriving the 32 columns'
// parameters and quantizing the same rows.
// Each element is a pure function of (x, its column's absmax, its flat index), so the
// result is bit-identical to the reference for any launch shape. The host reads the flag
// once after the launches and refuses x (ValueError) as the CPU op does. PACKED
// (quantize_symmetric_cols4): the same kernels store two values a byte, each even column's
// lane writing the byte with its odd neighbour's value (a warp shuffle).
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/quantize_cols.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kColsPerBlock = 32;  // blockDim.x: one warp across 32 consecutive columns
constexpr int kRowsPerBlock = 8;   // blockDim.y
constexpr int64_t kStripRows = 256;  // rows one block of the absmax pass reduces
constexpr int64_t kMaxGridY = 65535;

// Pass 1: colmax[j] = max over the block's strips of rows of |x[r, j]| as bit patterns.
__global__ void __launch_bounds__(kColsPerBlock * kRowsPerBlock)
    cols_absmax_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                       uint32_t* __restrict__ colmax) {
  __shared__ uint32_t part[kRowsPerBlock][kColsPerBlock];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColsPerBlock + threadIdx.x;
  const int64_t strips = (rows + kStripRows - 1) / kStripRows;
  uint32_t m = 0;
  if (j < cols) {
    for (int64_t s = blockIdx.y; s < strips; s += gridDim.y) {
      const int64_t r1 = min(rows, (s + 1) * kStripRows);
      for (int64_t r = s * kStripRows + threadIdx.y; r < r1; r += kRowsPerBlock) {
        m = max(m, abs_bits(__ldg(x + r * cols + j)));
      }
    }
  }
  part[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
#pragma unroll
    for (int y = 1; y < kRowsPerBlock; ++y) m = max(m, part[y][threadIdx.x]);
    if (m != 0u) atomicMax(colmax + j, m);
  }
}

// Pass 2: per column pre / inv (params[j], params[cols + j]) and scale; NaN / Inf -> *bad.
__global__ void cols_params_kernel(const uint32_t* __restrict__ colmax, int64_t cols, int qmax,
                                   float* __restrict__ params, float* __restrict__ scale,
                                   uint32_t* __restrict__ bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += stride) {
    const uint32_t m = colmax[j];
    QuantParams p{1.0f, 0.0f, static_cast<float>(qmax)};
    if (m >= 0x7f800000u) {  // NaN / Inf
      atomicOr(bad, 1u);
      scale[j] = 0.0f;
    } else {
      const float absmax = __uint_as_float(m);
      p = quant_params(absmax, qmax);
      scale[j] = __fdiv_rn(absmax, static_cast<float>(qmax));
    }
    params[j] = p.pre;
    params[cols + j] = p.inv;
  }
}

// Stores quantize_one of x[r, j] (counter offset + r * cols + j) into q: int8 in x's layout,
// or PACKED two values a byte (uint8 [rows, ceil(cols / 2)], the high nibble of an odd
// width's last byte 0), the even column's lane writing its odd neighbour's value too. Every
// lane of the warp calls it for the same r (the shuffle), `valid` (j < cols) or not.
template <bool STOCH, bool PACKED>
__device__ __forceinline__ void store_quantized(const float* __restrict__ x, void* __restrict__ q,
                                                int64_t r, int64_t j, int64_t cols, bool valid,
                                                const QuantParams& p, const rng::Keys& keys,
                                                uint64_t offset) {
  const int64_t i = r * cols + j;
  int32_t v = 0;
  if (valid) {
    const float u = STOCH ? uniform_at(keys, offset + static_cast<uint64_t>(i)) : 0.0f;
    v = quantize_one<STOCH>(__ldg(x + i), p, u);
  }
  if constexpr (PACKED) {
    const int32_t odd = __shfl_down_sync(0xffffffffu, v, 1);  // column j + 1's (0 past cols)
    if (valid && (j & 1) == 0) {
      static_cast<uint8_t*>(q)[r * ((cols + 1) / 2) + j / 2] =
          static_cast<uint8_t>((v & 0xF) | ((odd & 0xF) << 4));
    }
  } else if (valid) {
    static_cast<int8_t*>(q)[i] = static_cast<int8_t>(v);
  }
}

// Pass 3: q[r, j] = quantize_one(x[r, j]) with column j's pre / inv.
template <bool STOCH, bool PACKED>
__global__ void __launch_bounds__(kColsPerBlock * kRowsPerBlock)
    cols_quantize_kernel(const float* __restrict__ x, void* __restrict__ q, int64_t rows,
                         int64_t cols, const float* __restrict__ params, int qmax,
                         rng::Keys keys, uint64_t offset) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColsPerBlock + threadIdx.x;
  const bool valid = j < cols;  // the others still join each row's shuffle
  QuantParams p;
  p.pre = valid ? __ldg(params + j) : 1.0f;
  p.inv = valid ? __ldg(params + cols + j) : 0.0f;
  p.qmax = static_cast<float>(qmax);
  const int64_t step = static_cast<int64_t>(gridDim.y) * kRowsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock + threadIdx.y; r < rows;
       r += step) {
    store_quantized<STOCH, PACKED>(x, q, r, j, cols, valid, p, keys, offset);
  }
}

// block > 0: CUDA block (x, y) quantizes columns [32 x, 32 x + 32) of the row blocks
// y, y + gridDim.y, ...: absmax of each column over the block's rows, its pre / inv / scale
// (scale[b, j]), then quantize_one of the same rows. NaN / Inf -> *bad.
template <bool STOCH, bool PACKED>
__global__ void __launch_bounds__(kColsPerBlock * kRowsPerBlock)
    col_blocks_kernel(const float* __restrict__ x, void* __restrict__ q, int64_t rows,
                      int64_t cols, int64_t block, int qmax, float* __restrict__ scale,
                      uint32_t* __restrict__ bad, rng::Keys keys, uint64_t offset) {
  __shared__ uint32_t part[kRowsPerBlock][kColsPerBlock];
  __shared__ float pre[kColsPerBlock], inv[kColsPerBlock];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColsPerBlock + threadIdx.x;
  const int64_t blocks = (rows + block - 1) / block;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    const int64_t r0 = b * block, r1 = min(rows, r0 + block);
    uint32_t m = 0;
    if (j < cols) {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsPerBlock) {
        m = max(m, abs_bits(__ldg(x + r * cols + j)));
      }
    }
    part[threadIdx.y][threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.y == 0) {
#pragma unroll
      for (int y = 1; y < kRowsPerBlock; ++y) m = max(m, part[y][threadIdx.x]);
      QuantParams p{1.0f, 0.0f, static_cast<float>(qmax)};
      if (j < cols) {
        if (m >= 0x7f800000u) {  // NaN / Inf
          atomicOr(bad, 1u);
          scale[b * cols + j] = 0.0f;
        } else {
          const float absmax = __uint_as_float(m);
          p = quant_params(absmax, qmax);
          scale[b * cols + j] = __fdiv_rn(absmax, static_cast<float>(qmax));
        }
      }
      pre[threadIdx.x] = p.pre;
      inv[threadIdx.x] = p.inv;
    }
    __syncthreads();
    QuantParams p;
    p.pre = pre[threadIdx.x];
    p.inv = inv[threadIdx.x];
    p.qmax = static_cast<float>(qmax);
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsPerBlock) {  // every lane: the shuffle
      store_quantized<STOCH, PACKED>(x, q, r, j, cols, j < cols, p, keys, offset);
    }
    __syncthreads();  // part / pre / inv are reused by the next row block
  }
}


template <bool PACKED>
std::tuple<at::Tensor, at::Tensor> quantize_col_blocks(const at::Tensor& x, int64_t bits,
                                                       bool stochastic, int64_t seed,
                                                       int64_t offset, int64_t block) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t blocks = (rows + block - 1) / block;
  at::Tensor q = col_quantizer::output<PACKED>(x);
  at::Tensor scale = at::zeros({blocks, cols}, x.options());
  if (rows * cols == 0) return {q, scale};
  const int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  TORCH_CHECK_VALUE(col_blocks <= int64_t{0x7fffffff}, col_quantizer::op_name<PACKED>(),
                    ": cols = ", cols, " is too large for the CUDA kernel");
  at::Tensor flag = at::zeros({1}, x.options().dtype(at::kInt));
  uint32_t* badp = reinterpret_cast<uint32_t*>(flag.mutable_data_ptr<int32_t>());
  const int qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  cudaStream_t stream = current_stream();
  const dim3 threads(kColsPerBlock, kRowsPerBlock);
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(std::min(blocks, kMaxGridY)));
  const float* xp = x.const_data_ptr<float>();
  void* qp = q.mutable_data_ptr();
  float* sp = scale.mutable_data_ptr<float>();
  if (stochastic) {
    col_blocks_kernel<true, PACKED><<<grid, threads, 0, stream>>>(xp, qp, rows, cols, block,
                                                                   qmax, sp, badp, keys, off);
  } else {
    col_blocks_kernel<false, PACKED><<<grid, threads, 0, stream>>>(xp, qp, rows, cols, block,
                                                                    qmax, sp, badp, keys, off);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  TORCH_CHECK_VALUE(read_back(badp, stream) == 0u, col_quantizer::op_name<PACKED>(),
                    ": x contains NaN or Inf; quantization needs finite values");
  return {q, scale};
}

template <bool PACKED>
std::tuple<at::Tensor, at::Tensor> quantize_symmetric_cols(const at::Tensor& x_in, int64_t bits,
                                                           bool stochastic, int64_t seed,
                                                           int64_t offset, int64_t block) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  if (block > 0) return quantize_col_blocks<PACKED>(x, bits, stochastic, seed, offset, block);
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  at::Tensor q = col_quantizer::output<PACKED>(x);
  if (rows * cols == 0) return {q, at::zeros({1, cols}, x.options())};  // no rows: range 0

  at::Tensor scale = at::empty({1, cols}, x.options());
  // [cols] column absmax bits, then the NaN / Inf flag: one zeroed buffer
  at::Tensor work = at::zeros({cols + 1}, x.options().dtype(at::kInt));
  uint32_t* colmax = reinterpret_cast<uint32_t*>(work.mutable_data_ptr<int32_t>());
  uint32_t* badp = colmax + cols;
  at::Tensor params = at::empty({2, cols}, x.options());
  const float* xp = x.const_data_ptr<float>();
  void* qp = q.mutable_data_ptr();
  float* sp = scale.mutable_data_ptr<float>();
  float* pp = params.mutable_data_ptr<float>();
  const int qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  cudaStream_t stream = current_stream();

  const int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  TORCH_CHECK_VALUE(col_blocks <= int64_t{0x7fffffff}, col_quantizer::op_name<PACKED>(),
                    ": cols = ", cols, " is too large for the CUDA kernel");
  const dim3 threads(kColsPerBlock, kRowsPerBlock);
  // enough blocks to fill every SM several times over; grid-stride over the rest
  const int64_t want = static_cast<int64_t>(sm_count()) * 16;
  const int64_t per_col = std::max<int64_t>(1, want / col_blocks);
  const int64_t strips = (rows + kStripRows - 1) / kStripRows;
  const dim3 grid_max(static_cast<unsigned>(col_blocks),
                      static_cast<unsigned>(std::min({strips, per_col, kMaxGridY})));
  cols_absmax_kernel<<<grid_max, threads, 0, stream>>>(xp, rows, cols, colmax);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  cols_params_kernel<<<grid_for(cols, 256), 256, 0, stream>>>(colmax, cols, qmax, pp, sp, badp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t row_groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid_q(static_cast<unsigned>(col_blocks),
                    static_cast<unsigned>(std::min({row_groups, per_col, kMaxGridY})));
  if (stochastic) {
    cols_quantize_kernel<true, PACKED>
        <<<grid_q, threads, 0, stream>>>(xp, qp, rows, cols, pp, qmax, keys, off);
  } else {
    cols_quantize_kernel<false, PACKED>
        <<<grid_q, threads, 0, stream>>>(xp, qp, rows, cols, pp, qmax, keys, off);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const uint32_t flag = read_back(badp, stream);
  TORCH_CHECK_VALUE(flag == 0u, col_quantizer::op_name<PACKED>(),
                    ": x contains NaN or Inf; quantization needs finite values");
  return {q, scale};
}

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_cols_int8(const at::Tensor& x,
                                                                int64_t bits, bool stochastic,
                                                                int64_t seed, int64_t offset,
                                                                int64_t block) {
  return quantize_symmetric_cols<false>(x, bits, stochastic, seed, offset, block);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_cols(const at::Tensor& x, int64_t bits,
                                                 bool stochastic, int64_t seed, int64_t offset,
                                                 int64_t block, bool packed) {
  return packed ? quantize_symmetric_cols<true>(x, bits, stochastic, seed, offset, block)
                : quantize_symmetric_cols<false>(x, bits, stochastic, seed, offset, block);
}

}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_symmetric_cols", &qtrain::cuda::quantize_symmetric_cols_int8);
}
