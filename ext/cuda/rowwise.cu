// The row codec's CUDA kernels that several ops launch (declared in rowwise.cuh):
// quantize_rows (quantize_rows, quantize_rows_into, the unfused projection), its
// inverse (dequantize_rows, dequantize_rows_into, the unfused back-projection), the
// Rademacher sign table and the unfused signed sums of the fused projections, and the
// check of a message's row index. See rowwise.cuh for how they split the work.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace rowwise {
namespace {

// ---------------------------------------------------------------- kernels

struct QuantArgs {
  int64_t rows, width, tile_rows;
  int team, bits;
  bool vec_rows, vec_base;  // rows / the base 16-byte aligned
  float top;
  rng::Keys keys;
  uint64_t offset;
  uint8_t* packed;
  uint16_t* zero;
  uint16_t* range;
};

template <bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const float* __restrict__ x, const QuantArgs a) {
  __shared__ float zero_s[kMaxTileRows], inv_s[kMaxTileRows];
  const int64_t tiles = (a.rows + a.tile_rows - 1) / a.tile_rows;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = tile * a.tile_rows;
    const int nr = static_cast<int>(min(a.tile_rows, a.rows - r0));
    const float* t = x + r0 * a.width;
    tile_stats<true>(t, nr, a.width, a.team, a.vec_rows, a.top, a.zero + r0, a.range + r0, zero_s,
                     inv_s);
    __syncthreads();
    const uint64_t first = static_cast<uint64_t>(r0 * a.width);
    pack_tile<kStochastic, true>(t, a.vec_base, nr * a.width, a.width, first, zero_s, inv_s, a.top,
                                 a.bits, a.keys, a.offset, a.packed + (first >> 3) * a.bits);
    __syncthreads();  // zero_s / inv_s are rewritten by the next tile
  }
}

__global__ void __launch_bounds__(kThreads)
    dequantize_rows_kernel(const uint8_t* __restrict__ packed, bool aligned,
                           const uint16_t* __restrict__ zero, const uint16_t* __restrict__ range,
                           int64_t n, int64_t width, int bits, bool out_aligned,
                           float* __restrict__ out) {
  const float levels = static_cast<float>((1 << bits) - 1);
  const int64_t groups = (n + 7) >> 3;
  const bool narrow = n <= static_cast<int64_t>(UINT32_MAX);
  for (int64_t g = blockIdx.x * int64_t{kThreads} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * kThreads) {
    const int64_t e0 = g << 3;
    const int nv = static_cast<int>(min(int64_t{8}, n - e0));
    const uint64_t word = read_group(packed, g, nv, bits, aligned);
    int64_t row = narrow ? static_cast<int64_t>(static_cast<uint32_t>(e0) /
                                                static_cast<uint32_t>(width))
                         : e0 / width;
    int64_t col = e0 - row * width;
    float z = bf16_to_float(__ldg(zero + row));
    float step = __fdiv_rn(bf16_to_float(__ldg(range + row)), levels);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < nv) {
        if (col == width) {
          ++row;
          col = 0;
          z = bf16_to_float(__ldg(zero + row));
          step = __fdiv_rn(bf16_to_float(__ldg(range + row)), levels);
        }
        v[j] = dequant(word, j, bits, step, z);
        ++col;
      }
    }
    if (nv == 8 && out_aligned) {  // out 16-byte aligned and e0 % 8 == 0: float4 stores
      reinterpret_cast<float4*>(out + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(out + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // constant indices keep v in registers
        if (j < nv) out[e0 + j] = v[j];
      }
    }
  }
}

// Sign bits of the [d, k] Rademacher matrix for signed_sums: word (w, c) holds, in
// bit b, the sign of input 32 * w + b for output c. Projection (x R): inputs are the
// d rows of R, outputs its k columns; back-projection (y R^T, transposed): inputs the
// k columns, outputs the d rows. Entry (i, j) of R is counter offset + i * k + j.
__global__ void __launch_bounds__(kThreads)
    sign_words_kernel(uint32_t* __restrict__ out, int64_t n_in, int64_t n_out, int64_t k,
                      bool transposed, rng::Keys keys, uint64_t offset) {
  const int64_t words = (n_in + 31) / 32 * n_out;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < words;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t w = idx / n_out, c = idx - w * n_out;
    uint32_t bits = 0;
    for (int b = 0; b < 32 && 32 * w + b < n_in; ++b) {
      const int64_t i = 32 * w + b;
      const uint64_t cnt = offset + static_cast<uint64_t>(transposed ? c * k + i : i * k + c);
      const uint32_t h = rng::bits_lo(keys.k1, rng::block_key(keys, static_cast<uint32_t>(cnt >> 32)),
                                      static_cast<uint32_t>(cnt));
      bits |= (h >> 31) << b;
    }
    out[idx] = bits;
  }
}

// Unfused fallback for k > kMaxFusedK: out [rows, n_out] = mag * signed sums of
// in [rows, n_in] in input order, one thread per output, all in global memory.
__global__ void __launch_bounds__(kThreads)
    signed_sums_global_kernel(const float* __restrict__ in, int64_t rows, int64_t n_in,
                              int64_t n_out, const uint32_t* __restrict__ signs, float mag,
                              float* __restrict__ out) {
  const int64_t total = rows * n_out;
  for (int64_t o = blockIdx.x * int64_t{kThreads} + threadIdx.x; o < total;
       o += int64_t{gridDim.x} * kThreads) {
    const int64_t r = o / n_out, c = o - r * n_out;
    const float* row = in + r * n_in;
    float acc = 0.0f;
    uint32_t w = 0;
    for (int64_t i = 0; i < n_in; ++i) {
      if ((i & 31) == 0) w = __ldg(signs + (i >> 5) * n_out + c);
      const uint32_t m = (w << (31 - (i & 31))) & 0x80000000u;
      acc = __fadd_rn(acc, __uint_as_float(__float_as_uint(__ldg(row + i)) ^ m));
    }
    out[o] = __fmul_rn(acc, mag);
  }
}

// Flags of checked_row_index: the first position whose entry is outside [0, limit) (n
// if none), and the smallest row named twice (limit if none; only with `seen`).
struct IndexFlags {
  unsigned long long bad_pos;
  unsigned long long twice;
};

__global__ void init_index_flags_kernel(IndexFlags* flags, int64_t n, int64_t limit) {
  flags->bad_pos = static_cast<unsigned long long>(n);
  flags->twice = static_cast<unsigned long long>(limit);
}

// seen: `limit` zeroed ints, or null when rows may repeat (a gather).
__global__ void __launch_bounds__(kThreads)
    check_index_kernel(const int64_t* __restrict__ index, int64_t n, int64_t limit,
                       int* __restrict__ seen, IndexFlags* __restrict__ flags) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t v = index[i];
    if (v < 0 || v >= limit) {
      atomicMin(&flags->bad_pos, static_cast<unsigned long long>(i));
    } else if (seen != nullptr && atomicExch(seen + v, 1) != 0) {
      atomicMin(&flags->twice, static_cast<unsigned long long>(v));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- launches

void launch_quantize_rows(const float* x, int64_t rows, int64_t width, int64_t bits,
                          bool stochastic, const rng::Keys& keys, int64_t offset, Quantized& q,
                          cudaStream_t stream) {
  const int64_t align = row_align(width);
  QuantArgs a;
  a.rows = rows;
  a.width = width;
  a.tile_rows = width > kWideWidth
                    ? align
                    : std::min(kMaxTileRows,
                               ((kTileElems + width - 1) / width + align - 1) / align * align);
  a.team = team_for(width);
  a.bits = static_cast<int>(bits);
  a.vec_base = is_aligned(x, 16);
  a.vec_rows = a.vec_base && width % 4 == 0;
  a.top = static_cast<float>((1 << bits) - 1);
  a.keys = keys;
  a.offset = static_cast<uint64_t>(offset);
  a.packed = static_cast<uint8_t*>(q.packed.mutable_data_ptr());
  a.zero = bf16_ptr(q.zero);
  a.range = bf16_ptr(q.range);
  const int64_t tiles = (rows + a.tile_rows - 1) / a.tile_rows;
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(tiles, int64_t{1} << 30));
  if (stochastic) {
    quantize_rows_kernel<true><<<grid, kThreads, 0, stream>>>(x, a);
  } else {
    quantize_rows_kernel<false><<<grid, kThreads, 0, stream>>>(x, a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_dequantize_rows(const uint8_t* packed, const uint16_t* zero, const uint16_t* range,
                            int64_t rows, int64_t width, int64_t bits, float* out,
                            cudaStream_t stream) {
  const int64_t n = rows * width;
  dequantize_rows_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(
      packed, is_aligned(packed, 8), zero, range, n, width, static_cast<int>(bits),
      is_aligned(out, 16), out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor sign_words(const at::TensorOptions& opts, int64_t n_in, int64_t n_out, int64_t k,
                      bool transposed, const rng::Keys& keys, uint64_t offset,
                      cudaStream_t stream) {
  const int64_t words = (n_in + 31) / 32 * n_out;
  at::Tensor t = at::empty({std::max<int64_t>(words, 1)}, opts.dtype(at::kInt));
  if (words > 0) {
    sign_words_kernel<<<blocks_for(words), kThreads, 0, stream>>>(
        static_cast<uint32_t*>(t.mutable_data_ptr()), n_in, n_out, k, transposed, keys, offset);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return t;
}

void launch_signed_sums(const float* in, int64_t rows, int64_t n_in, int64_t n_out,
                        const uint32_t* signs, float mag, float* out, cudaStream_t stream) {
  signed_sums_global_kernel<<<blocks_for(rows * n_out), kThreads, 0, stream>>>(in, rows, n_in,
                                                                               n_out, signs, mag,
                                                                               out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor checked_row_index(const char* fn, const at::Tensor& index_in, int64_t limit, bool unique,
                             cudaStream_t stream) {
  at::Tensor index = index_in.contiguous();
  const int64_t n = index.numel();
  if (n == 0) return index;
  const int64_t* ip = index.const_data_ptr<int64_t>();
  at::Tensor flags_t = at::empty({2}, index.options());  // one IndexFlags
  auto* flags = reinterpret_cast<IndexFlags*>(flags_t.mutable_data_ptr<int64_t>());
  at::Tensor seen;
  if (unique) seen = at::zeros({std::max<int64_t>(limit, 1)}, index.options().dtype(at::kInt));
  init_index_flags_kernel<<<1, 1, 0, stream>>>(flags, n, limit);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  check_index_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      ip, n, limit, unique ? seen.mutable_data_ptr<int>() : nullptr, flags);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const IndexFlags f = read_back(flags, stream);
  if (f.bad_pos < static_cast<unsigned long long>(n)) {
    const auto i = static_cast<int64_t>(f.bad_pos);
    const int64_t v = read_back(ip + i, stream);
    TORCH_CHECK_INDEX(false, fn, ": index[", i, "] = ", v, " is outside [0, ", limit, ")");
  }
  TORCH_CHECK_VALUE(f.twice >= static_cast<unsigned long long>(limit), fn, ": index names row ",
                    static_cast<int64_t>(f.twice), " twice; each row may be written once");
  return index;
}

}  // namespace rowwise
}  // namespace cuda
}  // namespace qtrain
