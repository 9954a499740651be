// Activation compression (exact) and message quantization (adaqp) on CUDA: the
// ops of compress_cpu.cpp on CUDA tensors, bit for bit equal to the references
// qtrain/quant/rowwise.py and qtrain/quant/projection.py (and so to the CPU
// kernels). The float32 steps are those of compress_cpu.cpp's header comment,
// written with __fsub_rn / __fmul_rn / __fadd_rn / __fdiv_rn so no FMA
// contraction or approximate division can change a result whatever the flags.
//
// Bit stream: element i of the flattened [rows, width] tensor sits at bit
// i*bits, little-endian, so rows share bytes when width*bits % 8 != 0. Every
// kernel writes whole groups of 8 elements (= `bits` bytes, byte aligned) and a
// group belongs to exactly one thread, so no byte has two writers:
//
// * quantize_rows: a block takes a tile of rows whose first element is a
//   multiple of 8 (tiles are multiples of 8 / gcd(width, 8) rows). Pass 1 finds
//   each row's min / max (teams of 1-32 lanes per row, or the whole block for
//   wide rows) as integer min / max over order-preserving keys of the float
//   bits (exact, order-free, finds NaN), and keeps (zero, inv) per row in shared
//   memory. Pass 2 gives each thread groups of 8 consecutive elements of the
//   tile (two float4 loads, which hit L1/L2 after pass 1), which it quantizes
//   with its rows' parameters and packs to `bits` bytes with one store.
// * dequantize_rows: a thread per group of 8 elements (one load of `bits`
//   bytes, two float4 stores).
// * project_quantize_rows: the tile's projected rows are computed in shared
//   memory (never in global memory), then quantized and packed as above. The
//   projection is the reference's signed sum in input order: a thread owns one
//   output column of 4 rows and adds the inputs one by one, each with its sign
//   flipped (an exact XOR) where the Rademacher entry is negative. The signs
//   come from a bit table (32 inputs per word) built once per call from the
//   counter hash; x is staged in shared memory in chunks of input columns.
// * dequantize_unproject_rows: the tile's packed rows are dequantized into
//   shared memory, then projected back by the same signed sums to global memory.
// * pack_bits / unpack_bits: 32 values per thread (two 16-byte loads or
//   stores on the byte side). masked_scale: 8 values per mask byte.
//
// Non-finite rows follow the CPU kernel: a NaN row gets zero = range = NaN and
// level 0; a row with +-Inf gets level 0 and dequantizes to NaN.
// The CPU wheel of torch (cuda_check.py on machines without a GPU) ships c10/cuda
// without its generated config header, whose only macro matters on Windows.
#if !__has_include(<c10/cuda/impl/cuda_cmake_macros.h>) && !defined(C10_CUDA_NO_CMAKE_CONFIGURE_FILE)
#define C10_CUDA_NO_CMAKE_CONFIGURE_FILE
#endif

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>

#include "qtrain_rng.h"

namespace qtrain {
namespace cuda {
namespace compress {

// The ops (declared for pybind11 in bind_compress_cuda.cpp) are at the end of this file.

namespace {

constexpr int kThreads = 256;           // every kernel's block size
constexpr int kWarps = kThreads / 32;
constexpr int64_t kTileElems = 4096;    // quantize_rows: elements per tile (about)
constexpr int64_t kMaxTileRows = 1024;  // quantize_rows: rows per tile at most (a multiple of 8)
constexpr int64_t kWideWidth = 1024;    // wider rows: the whole block reduces one row
constexpr int64_t kMaxFusedK = 1024;    // fused projection kernels up to this k
constexpr int64_t kSmemFloats = 12000;  // fused kernels' shared memory budget (< 48 KiB)

// ---------------------------------------------------------------- device helpers

// A signed integer with the order of the float whose bits are b (-0 < +0; NaNs
// below -inf or above +inf by their sign). Its own inverse.
__device__ __forceinline__ int32_t order_key(int32_t s) { return s ^ ((s >> 31) & 0x7fffffff); }
constexpr int32_t kKeyNegInf = static_cast<int32_t>(0x807fffffu);  // order_key(-inf)
constexpr int32_t kKeyPosInf = 0x7f800000;                         // order_key(+inf)
constexpr uint32_t kQuietNaN = 0x7fc00000u;

__device__ __forceinline__ float bf16_to_float(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// zero = bf16_floor(min), range = bf16_ceil(fl32(max - zero)) from a row's min / max
// keys, written as bfloat16 bits; returns (zero, inv = fl32(top / range) or 0).
__device__ __forceinline__ float2 finish_row(int32_t lo, int32_t hi, float top, uint16_t* zero_out,
                                             uint16_t* range_out) {
  uint32_t zb, rb;
  if (lo < kKeyNegInf || hi > kKeyPosInf) {
    zb = rb = kQuietNaN;  // a NaN in the row: torch's amin / amax give NaN
  } else {
    const uint32_t min_bits = static_cast<uint32_t>(order_key(lo));
    const uint32_t max_bits = static_cast<uint32_t>(order_key(hi));
    // truncate toward zero; below zero that is upward, so step the magnitude up
    zb = min_bits & 0xffff0000u;
    if (zb != min_bits && (min_bits >> 31) != 0) zb += 0x10000u;
    const float diff = __fsub_rn(__uint_as_float(max_bits), __uint_as_float(zb));
    const uint32_t db = __float_as_uint(diff);
    rb = db & 0xffff0000u;
    if (rb != db) rb += 0x10000u;
    // inf - inf (a row of +inf only): the GPU's NaN is 0x7fffffff, whose rounding
    // up above would wrap to -0; keep a NaN as the CPU does
    if (diff != diff) rb = kQuietNaN;
  }
  *zero_out = static_cast<uint16_t>(zb >> 16);
  *range_out = static_cast<uint16_t>(rb >> 16);
  const float range = __uint_as_float(rb);
  return make_float2(__uint_as_float(zb), range > 0.0f ? __fdiv_rn(top, range) : 0.0f);
}

// clamp(v, 0, top) with NaN -> 0 (torch turns a NaN level into uint8 0)
__device__ __forceinline__ float clamp_levels(float v, float top) {
  v = v > 0.0f ? v : 0.0f;
  return v < top ? v : top;
}

// The level of x: nearest = rint (ties to even), stochastic = floor(v + u). Both
// clamp first: the bounds are integers, so that equals the reference's clamp after.
template <bool kStochastic>
__device__ __forceinline__ uint32_t level(float x, float zero, float inv, float top, float u) {
  const float v = __fmul_rn(__fsub_rn(x, zero), inv);
  if (kStochastic) {
    return static_cast<uint32_t>(static_cast<int32_t>(clamp_levels(__fadd_rn(v, u), top)));
  }
  return static_cast<uint32_t>(__float2int_rn(clamp_levels(v, top)));
}

template <bool kGlobal>
__device__ __forceinline__ float load_f(const float* p) {
  if (kGlobal) return __ldg(p);
  return *p;
}
template <bool kGlobal>
__device__ __forceinline__ float4 load_f4(const float* p) {
  if (kGlobal) return __ldg(reinterpret_cast<const float4*>(p));
  return *reinterpret_cast<const float4*>(p);
}

// Row parameters of the first `nrows` rows of a tile (row r at tile + r * width):
// zero / range (bfloat16 bits) to zero_out / range_out, (zero, inv) to zero_s / inv_s.
// Rows up to kWideWidth wide: a team of `team` lanes (a power of two <= 32) per row;
// wider rows: the whole block per row. vec: rows are 16-byte aligned (float4 loads).
template <bool kGlobal>
__device__ void tile_stats(const float* tile, int nrows, int64_t width, int team, bool vec,
                           float top, uint16_t* zero_out, uint16_t* range_out, float* zero_s,
                           float* inv_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (width > kWideWidth) {
    __shared__ int32_t red_lo[kWarps], red_hi[kWarps];
    for (int r = 0; r < nrows; ++r) {
      const float* row = tile + r * width;
      int32_t lo = INT32_MAX, hi = INT32_MIN;
      if (vec) {
        for (int64_t c = threadIdx.x; c < width / 4; c += kThreads) {
          const float4 v = load_f4<kGlobal>(row + 4 * c);
          const int32_t a = order_key(__float_as_int(v.x)), b = order_key(__float_as_int(v.y));
          const int32_t e = order_key(__float_as_int(v.z)), f = order_key(__float_as_int(v.w));
          lo = min(lo, min(min(a, b), min(e, f)));
          hi = max(hi, max(max(a, b), max(e, f)));
        }
      } else {
        for (int64_t c = threadIdx.x; c < width; c += kThreads) {
          const int32_t a = order_key(__float_as_int(load_f<kGlobal>(row + c)));
          lo = min(lo, a);
          hi = max(hi, a);
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, off));
      }
      if (lane == 0) {
        red_lo[warp] = lo;
        red_hi[warp] = hi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < kWarps; ++w) {
          lo = min(lo, red_lo[w]);
          hi = max(hi, red_hi[w]);
        }
        const float2 p = finish_row(lo, hi, top, zero_out + r, range_out + r);
        zero_s[r] = p.x;
        inv_s[r] = p.y;
      }
      __syncthreads();  // red_* are reused by the next row
    }
    return;
  }
  const int per_warp = 32 / team;  // rows a warp takes at once
  const int t = lane / team, tl = lane % team;
  // the loop bound depends on the warp only: every lane reaches the shuffles
  for (int base = warp * per_warp; base < nrows; base += kWarps * per_warp) {
    const int r = base + t;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    if (r < nrows) {
      const float* row = tile + r * width;
      if (vec) {
        for (int64_t c = tl; c < width / 4; c += team) {
          const float4 v = load_f4<kGlobal>(row + 4 * c);
          const int32_t a = order_key(__float_as_int(v.x)), b = order_key(__float_as_int(v.y));
          const int32_t e = order_key(__float_as_int(v.z)), f = order_key(__float_as_int(v.w));
          lo = min(lo, min(min(a, b), min(e, f)));
          hi = max(hi, max(max(a, b), max(e, f)));
        }
      } else {
        for (int64_t c = tl; c < width; c += team) {
          const int32_t a = order_key(__float_as_int(load_f<kGlobal>(row + c)));
          lo = min(lo, a);
          hi = max(hi, a);
        }
      }
    }
    for (int off = team / 2; off > 0; off >>= 1) {  // xor offsets < team stay inside the team
      lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
      hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, off));
    }
    if (r < nrows && tl == 0) {
      const float2 p = finish_row(lo, hi, top, zero_out + r, range_out + r);
      zero_s[r] = p.x;
      inv_s[r] = p.y;
    }
  }
}

// Quantize and pack the E elements of a tile (contiguous floats; tile[0] is element
// `first` of the stream, first % 8 == 0) with the row parameters zero_s / inv_s;
// out points at the tile's first packed byte. A thread takes 8 elements at a time,
// so it owns whole output bytes. vec: tile is 16-byte aligned.
template <bool kStochastic, bool kGlobal>
__device__ void pack_tile(const float* tile, bool vec, int64_t E, int64_t width, uint64_t first,
                          const float* zero_s, const float* inv_s, float top, int bits,
                          rng::Keys keys, uint64_t offset, uint8_t* out) {
  const int64_t groups = (E + 7) >> 3;
  const bool narrow = E <= static_cast<int64_t>(UINT32_MAX);  // 32-bit division suffices
  for (int64_t g = threadIdx.x; g < groups; g += kThreads) {
    const int64_t e0 = g << 3;
    const int nv = static_cast<int>(min(int64_t{8}, E - e0));
    float v[8];
    if (vec && nv == 8) {
      const float4 a = load_f4<kGlobal>(tile + e0), b = load_f4<kGlobal>(tile + e0 + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = j < nv ? load_f<kGlobal>(tile + e0 + j) : 0.0f;
    }
    int64_t row = narrow ? static_cast<int64_t>(static_cast<uint32_t>(e0) /
                                                static_cast<uint32_t>(width))
                         : e0 / width;
    int64_t col = e0 - row * width;
    float zero = zero_s[row], inv = inv_s[row];
    // counters offset + first + e0 + j: the high word changes at most once in a group
    const uint64_t c0 = offset + first + static_cast<uint64_t>(e0);
    const uint32_t lo0 = static_cast<uint32_t>(c0);
    uint32_t kh0 = 0, kh1 = 0;
    if (kStochastic) {
      kh0 = rng::block_key(keys, static_cast<uint32_t>(c0 >> 32));
      kh1 = lo0 > 0xfffffff8u ? rng::block_key(keys, static_cast<uint32_t>(c0 >> 32) + 1u) : kh0;
    }
    uint64_t word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < nv) {
        if (col == width) {
          ++row;
          col = 0;
          zero = zero_s[row];
          inv = inv_s[row];
        }
        float u = 0.0f;
        if (kStochastic) {
          const uint32_t lo = lo0 + static_cast<uint32_t>(j);
          u = rng::to_unit(rng::bits_lo(keys.k1, lo < lo0 ? kh1 : kh0, lo));
        }
        word |= static_cast<uint64_t>(level<kStochastic>(v[j], zero, inv, top, u)) << (j * bits);
        ++col;
      }
    }
    uint8_t* dst = out + g * bits;  // g * bits: aligned for a `bits`-byte store
    if (nv == 8) {
      switch (bits) {
        case 1: *dst = static_cast<uint8_t>(word); break;
        case 2: *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(word); break;
        case 4: *reinterpret_cast<uint32_t*>(dst) = static_cast<uint32_t>(word); break;
        default:
          *reinterpret_cast<uint2*>(dst) =
              make_uint2(static_cast<uint32_t>(word), static_cast<uint32_t>(word >> 32));
      }
    } else {  // the stream's last, partial group: only its bytes exist
      for (int b = 0; b < (nv * bits + 7) / 8; ++b) dst[b] = static_cast<uint8_t>(word >> (8 * b));
    }
  }
}

// The 8 * bits-bit word of group g (nv values) of a stream; aligned: whole-group loads.
__device__ __forceinline__ uint64_t read_group(const uint8_t* in, int64_t g, int nv, int bits,
                                               bool aligned) {
  const uint8_t* src = in + g * bits;
  if (aligned && nv == 8) {
    switch (bits) {
      case 1: return __ldg(src);
      case 2: return __ldg(reinterpret_cast<const unsigned short*>(src));
      case 4: return __ldg(reinterpret_cast<const unsigned int*>(src));
      default: {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
        return static_cast<uint64_t>(w.x) | (static_cast<uint64_t>(w.y) << 32);
      }
    }
  }
  uint64_t word = 0;
  for (int b = 0; b < (nv * bits + 7) / 8; ++b) word |= static_cast<uint64_t>(__ldg(src + b)) << (8 * b);
  return word;
}

__device__ __forceinline__ float dequant(uint64_t word, int j, int bits, float step, float zero) {
  const uint32_t q = static_cast<uint32_t>(word >> (j * bits)) & ((1u << bits) - 1u);
  return __fadd_rn(__fmul_rn(static_cast<float>(q), step), zero);
}

// acc[t] += the signed inputs [0, n) of rows 4 * rg + t (t < 4) of a shared-memory tile
// (row pitch `pitch` floats, 16-byte aligned rows), in input order. Input i of the tile
// is input i0 + i of the product (i0 % 32 == 0); its sign for output column c is bit
// (i0 + i) % 32 of signs[((i0 + i) / 32) * n_out + c].
__device__ __forceinline__ void signed_sums(const float* in_s, int pitch, int rg, int n, int64_t i0,
                                            const uint32_t* __restrict__ signs, int64_t n_out,
                                            int64_t c, float acc[4]) {
  const float* r0 = in_s + 4 * rg * pitch;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const uint32_t w = __ldg(signs + ((i0 + i) >> 5) * n_out + c);
#pragma unroll
    for (int j = 0; j < 32; j += 4) {
      float4 x[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) x[t] = *reinterpret_cast<const float4*>(r0 + t * pitch + i + j);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const uint32_t m = (w << (31 - (j + jj))) & 0x80000000u;  // exact sign flip
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float xv = jj == 0 ? x[t].x : jj == 1 ? x[t].y : jj == 2 ? x[t].z : x[t].w;
          acc[t] = __fadd_rn(acc[t], __uint_as_float(__float_as_uint(xv) ^ m));
        }
      }
    }
  }
  if (i < n) {
    const uint32_t w = __ldg(signs + ((i0 + i) >> 5) * n_out + c);
    for (; i < n; ++i) {
      const uint32_t m = (w << (31 - (i & 31))) & 0x80000000u;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        acc[t] = __fadd_rn(acc[t], __uint_as_float(__float_as_uint(r0[t * pitch + i]) ^ m));
      }
    }
  }
}

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
                           int64_t n, int64_t width, int bits, float* __restrict__ out) {
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
    if (nv == 8) {  // out is a fresh tensor and e0 % 8 == 0: 32-byte aligned
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

// Bits 1, 2, 4: 8 values (one per byte of a uint64, masked to B bits) to 8 * B bits by
// three doubling steps, and back (as compress_cpu.cpp's Packing).
template <int B>
struct Packing {
  static constexpr uint64_t m8 = 0x0101010101010101ull * ((1ull << B) - 1);
  static constexpr uint64_t m16 = 0x0001000100010001ull * ((1ull << (2 * B)) - 1);
  static constexpr uint64_t m32 = 0x0000000100000001ull * ((1ull << (4 * B)) - 1);
  static constexpr uint64_t m64 = (1ull << (8 * B)) - 1;
  static __device__ __forceinline__ uint64_t squeeze(uint64_t t) {
    t &= m8;
    t = (t | (t >> (8 - B))) & m16;
    t = (t | (t >> (16 - 2 * B))) & m32;
    return (t | (t >> (32 - 4 * B))) & m64;
  }
  static __device__ __forceinline__ uint64_t spread(uint64_t t) {
    t = (t | (t << (32 - 4 * B))) & m32;
    t = (t | (t << (16 - 2 * B))) & m16;
    return (t | (t << (8 - B))) & m8;
  }
};

__device__ __forceinline__ uint64_t u64(uint32_t lo, uint32_t hi) {
  return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
}

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

// out[i] = grad[i] * s where bit i of the mask is set, else +0; 8 values per mask byte.
__global__ void __launch_bounds__(kThreads)
    masked_scale_kernel(const float* __restrict__ grad, bool aligned,
                        const uint8_t* __restrict__ mask, int64_t n, float s,
                        float* __restrict__ out) {
  const int64_t bytes = (n + 7) >> 3;
  for (int64_t b = blockIdx.x * int64_t{kThreads} + threadIdx.x; b < bytes;
       b += int64_t{gridDim.x} * kThreads) {
    const uint32_t m = __ldg(mask + b);
    const int64_t e0 = b << 3;
    if (aligned && e0 + 8 <= n) {
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(grad + e0));
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(grad + e0) + 1);
      float v[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // keep the product's bits or clear them (+0)
        v[j] = __uint_as_float(__float_as_uint(__fmul_rn(v[j], s)) & (0u - ((m >> j) & 1u)));
      }
      reinterpret_cast<float4*>(out + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(out + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      for (int j = 0; j < 8 && e0 + j < n; ++j) {
        out[e0 + j] = ((m >> j) & 1u) ? __fmul_rn(__ldg(grad + e0 + j), s) : 0.0f;
      }
    }
  }
}

// +-mag by the top bit of the counter hash at offset + i.
__global__ void __launch_bounds__(kThreads)
    rademacher_kernel(float* __restrict__ out, int64_t n, uint32_t mag_bits, rng::Keys keys,
                      uint64_t offset) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const uint64_t c = offset + static_cast<uint64_t>(i);
    const uint32_t h = rng::bits_lo(keys.k1, rng::block_key(keys, static_cast<uint32_t>(c >> 32)),
                                    static_cast<uint32_t>(c));
    out[i] = __uint_as_float(mag_bits | (h & 0x80000000u));
  }
}

// ---------------------------------------------------------------- host helpers

// torch's current stream on the current device (what at::cuda::getCurrentCUDAStream
// returns, without ATen/cuda/CUDAContext.h and the cuBLAS / cuSPARSE headers it pulls in)
cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Blocks for a grid-stride loop over `items` thread-sized pieces of work.
unsigned int blocks_for(int64_t items) {
  const int64_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(b, int64_t{1} << 20)));
}

bool aligned_to(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

void check_bits(const char* fn, int64_t bits) {
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 4 || bits == 8, fn,
                    ": bits must be one of 1, 2, 4, 8, got ", bits);
}

void check_counter_range(const char* fn, int64_t n, int64_t offset) {
  TORCH_CHECK_VALUE(offset >= 0, fn, ": offset must be >= 0, got ", offset);
  TORCH_CHECK_VALUE(n <= std::numeric_limits<int64_t>::max() - offset, fn,
                    ": offset + numel must stay below 2^63, got offset ", offset, " and numel ",
                    n);
}

void check_count(const char* fn, int64_t n) {
  TORCH_CHECK_VALUE(n >= 0 && n <= (int64_t{1} << 60), fn,
                    ": element count must be in [0, 2^60], got ", n);
}

int64_t packed_bytes(int64_t n, int64_t bits) { return (n * bits + 7) / 8; }

void check_cuda(const char* fn, const char* what, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_cuda(), fn, ": ", what, " must be a CUDA tensor, got device ",
                    t.device());
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, fn, ": ", what, " must be a dense (strided) tensor");
}

void check_same_device(const char* fn, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_VALUE(a.device() == b.device(), fn, ": tensors on different devices: ", a.device(),
                    " and ", b.device());
}

void check_rows_input(const char* fn, const at::Tensor& x) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.dim() == 2, fn,
                   ": x must be a 2-d float32 tensor [rows, width], got ", x.scalar_type(), " ",
                   x.sizes());
  check_cuda(fn, "x", x);
}

void check_projection(const char* fn, int64_t d, int64_t k, int64_t offset) {
  TORCH_CHECK_VALUE(d >= 0 && k >= 1, fn, ": need d >= 0 and k >= 1, got d=", d, ", k=", k);
  TORCH_CHECK_VALUE(d <= (int64_t{1} << 40) / k, fn, ": the projection matrix is too large: d=",
                    d, ", k=", k);
  check_counter_range(fn, d * k, offset);
}

// Rows per byte-aligned block: 8 / gcd(width, 8).
int64_t row_align(int64_t width) {
  int64_t g = 8;
  for (int64_t w = width % 8; w != 0;) {
    const int64_t r = g % w;
    g = w;
    w = r;
  }
  return 8 / g;
}

// Lanes per row for tile_stats: the power of two >= width, at most 32.
int team_for(int64_t width) {
  int t = 1;
  while (t < 32 && t < width) t *= 2;
  return t;
}

struct Quantized {
  at::Tensor packed, zero, range;
};

Quantized allocate_quantized(const at::TensorOptions& opts, int64_t rows, int64_t width,
                             int64_t bits) {
  const auto bf16 = opts.dtype(at::kBFloat16);
  if (rows == 0 || width == 0) {
    return {at::zeros({0}, opts.dtype(at::kByte)), at::zeros({rows}, bf16), at::zeros({rows}, bf16)};
  }
  return {at::empty({packed_bytes(rows * width, bits)}, opts.dtype(at::kByte)),
          at::empty({rows}, bf16), at::empty({rows}, bf16)};
}

uint16_t* bf16_ptr(at::Tensor& t) { return static_cast<uint16_t*>(t.mutable_data_ptr()); }

// The bit table of signed_sums for the [d, k] matrix at `offset` (see sign_words_kernel).
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

// fl32(1 / sqrt(k)): both double operations are correctly rounded, as in Python
float rademacher_mag(int64_t k) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(k)));
}

uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// quantize_rows of a contiguous float32 CUDA tensor into q (already allocated).
void launch_quantize(const float* x, int64_t rows, int64_t width, int64_t bits, bool stochastic,
                     const rng::Keys& keys, int64_t offset, Quantized& q, cudaStream_t stream) {
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
  a.vec_base = aligned_to(x, 16);
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

// Validated contiguous (packed, zero, range) of rows x width values; rows = zero.numel().
struct QuantizedInput {
  at::Tensor packed, zero, range;
  int64_t rows;
};

QuantizedInput check_quantized(const char* fn, const at::Tensor& packed, const at::Tensor& zero,
                               const at::Tensor& range, int64_t bits, int64_t width) {
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(zero.scalar_type() == at::kBFloat16 && range.scalar_type() == at::kBFloat16 &&
                       zero.sizes() == range.sizes(),
                   fn, ": zero and range must be bfloat16 tensors of one shape [rows], got ",
                   zero.scalar_type(), " ", zero.sizes(), " and ", range.scalar_type(), " ",
                   range.sizes());
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte && packed.dim() == 1, fn,
                   ": packed must be a 1-d uint8 tensor, got ", packed.scalar_type(), " ",
                   packed.sizes());
  check_cuda(fn, "packed", packed);
  check_cuda(fn, "zero", zero);
  check_cuda(fn, "range", range);
  check_same_device(fn, packed, zero);
  check_same_device(fn, packed, range);
  TORCH_CHECK_VALUE(width >= 0, fn, ": width must be >= 0, got ", width);
  const int64_t rows = zero.numel();
  TORCH_CHECK_VALUE(width == 0 || rows <= (int64_t{1} << 60) / width, fn,
                    ": rows * width too large: ", rows, " x ", width);
  const int64_t n = rows * width;
  TORCH_CHECK_VALUE(packed.numel() >= packed_bytes(n, bits), fn, ": packed has ", packed.numel(),
                    " bytes, ", n, " values of ", bits, " bits need ", packed_bytes(n, bits));
  return {packed.contiguous(), zero.contiguous(), range.contiguous(), rows};
}

void launch_dequantize(const QuantizedInput& q, int64_t bits, int64_t width, float* out,
                       cudaStream_t stream) {
  const int64_t n = q.rows * width;
  const auto* packed = static_cast<const uint8_t*>(q.packed.const_data_ptr());
  dequantize_rows_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(
      packed, aligned_to(packed, 8), static_cast<const uint16_t*>(q.zero.const_data_ptr()),
      static_cast<const uint16_t*>(q.range.const_data_ptr()), n, width, static_cast<int>(bits),
      out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Rows per tile of the fused kernels: about 256 (4-row, 1-column) items, a multiple of 8.
int fused_tile_rows(int64_t n_out) {
  const int64_t tr = (1024 / n_out) / 8 * 8;
  return static_cast<int>(std::min<int64_t>(64, std::max<int64_t>(8, tr)));
}

}  // namespace

// ---------------------------------------------------------------- ops

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in, int64_t bits,
                                                             bool stochastic, uint64_t seed,
                                                             int64_t offset) {
  constexpr const char* fn = "qtrain._ext_cuda.quantize_rows";
  check_bits(fn, bits);
  check_rows_input(fn, x_in);
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  check_count(fn, x_in.numel());
  check_counter_range(fn, x_in.numel(), offset);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Quantized q = allocate_quantized(x_in.options(), rows, width, bits);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  launch_quantize(x.const_data_ptr<float>(), rows, width, bits, stochastic,
                  rng::keys_from_seed(seed), offset, q, current_stream());
  return {q.packed, q.zero, q.range};
}

at::Tensor dequantize_rows(const at::Tensor& packed_in, const at::Tensor& zero_in,
                           const at::Tensor& range_in, int64_t bits, int64_t width) {
  constexpr const char* fn = "qtrain._ext_cuda.dequantize_rows";
  const QuantizedInput q = check_quantized(fn, packed_in, zero_in, range_in, bits, width);
  const c10::cuda::CUDAGuard guard(packed_in.device());
  at::Tensor out = at::empty({q.rows, width}, packed_in.options().dtype(at::kFloat));
  if (q.rows * width == 0) return out;
  launch_dequantize(q, bits, width, out.mutable_data_ptr<float>(), current_stream());
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_quantize_rows(
    const at::Tensor& x_in, int64_t k, int64_t bits, bool stochastic, uint64_t seed,
    int64_t offset, int64_t projection_offset) {
  constexpr const char* fn = "qtrain._ext_cuda.project_quantize_rows";
  check_bits(fn, bits);
  check_rows_input(fn, x_in);
  const int64_t rows = x_in.size(0), d = x_in.size(1);
  check_projection(fn, d, k, projection_offset);
  TORCH_CHECK_VALUE(rows <= (int64_t{1} << 60) / k, fn, ": rows * k too large: ", rows, " x ", k);
  check_counter_range(fn, rows * k, offset);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Quantized q = allocate_quantized(x_in.options(), rows, k, bits);
  if (rows == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const cudaStream_t stream = current_stream();
  const rng::Keys keys = rng::keys_from_seed(seed);
  const at::Tensor signs = sign_words(x.options(), d, k, k, false, keys,
                                      static_cast<uint64_t>(projection_offset), stream);
  const auto* sp = static_cast<const uint32_t*>(signs.const_data_ptr());
  const float mag = rademacher_mag(k);
  if (k > kMaxFusedK) {  // rare shapes: project into global memory, then quantize
    at::Tensor y = at::empty({rows, k}, x.options());
    signed_sums_global_kernel<<<blocks_for(rows * k), kThreads, 0, stream>>>(
        x.const_data_ptr<float>(), rows, d, k, sp, mag, y.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_quantize(y.const_data_ptr<float>(), rows, k, bits, stochastic, keys, offset, q, stream);
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
  a.vec_x = d % 4 == 0 && aligned_to(x.const_data_ptr(), 16);
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

at::Tensor dequantize_unproject_rows(const at::Tensor& packed_in, const at::Tensor& zero_in,
                                     const at::Tensor& range_in, int64_t bits, int64_t k,
                                     int64_t d, uint64_t seed, int64_t projection_offset) {
  constexpr const char* fn = "qtrain._ext_cuda.dequantize_unproject_rows";
  check_projection(fn, d, k, projection_offset);
  const QuantizedInput q = check_quantized(fn, packed_in, zero_in, range_in, bits, k);
  TORCH_CHECK_VALUE(q.rows <= (int64_t{1} << 60) / std::max<int64_t>(d, 1), fn,
                    ": rows * d too large: ", q.rows, " x ", d);
  const c10::cuda::CUDAGuard guard(packed_in.device());
  at::Tensor out = at::empty({q.rows, d}, packed_in.options().dtype(at::kFloat));
  if (q.rows * d == 0) return out;
  const cudaStream_t stream = current_stream();
  const at::Tensor signs = sign_words(packed_in.options(), k, d, k, true,
                                      rng::keys_from_seed(seed),
                                      static_cast<uint64_t>(projection_offset), stream);
  const auto* sp = static_cast<const uint32_t*>(signs.const_data_ptr());
  const float mag = rademacher_mag(k);
  if (k > kMaxFusedK) {  // rare shapes: dequantize into global memory, then project back
    at::Tensor y = at::empty({q.rows, k}, packed_in.options().dtype(at::kFloat));
    launch_dequantize(q, bits, k, y.mutable_data_ptr<float>(), stream);
    signed_sums_global_kernel<<<blocks_for(q.rows * d), kThreads, 0, stream>>>(
        y.const_data_ptr<float>(), q.rows, k, d, sp, mag, out.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  }
  UnprojectArgs a;
  a.rows = q.rows;
  a.d = d;
  a.k = k;
  a.pitch = static_cast<int>((k + 3) / 4 * 4);
  // about 256 items per tile, and y within the shared-memory budget (k <= 1024: >= 8 rows)
  const int64_t fit = (kSmemFloats / (a.pitch + 2)) / 8 * 8;
  a.tile_rows = static_cast<int>(std::min<int64_t>(fused_tile_rows(d), fit));
  a.bits = static_cast<int>(bits);
  a.packed = static_cast<const uint8_t*>(q.packed.const_data_ptr());
  a.aligned = aligned_to(a.packed, 8);
  a.zero = static_cast<const uint16_t*>(q.zero.const_data_ptr());
  a.range = static_cast<const uint16_t*>(q.range.const_data_ptr());
  a.mag = mag;
  a.signs = sp;
  a.out = out.mutable_data_ptr<float>();
  const int64_t tr = a.tile_rows;
  const size_t smem = static_cast<size_t>(tr * a.pitch + 2 * tr) * sizeof(float);
  const int64_t tiles = (q.rows + tr - 1) / tr;
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(tiles, int64_t{1} << 30));
  dequantize_unproject_kernel<<<grid, kThreads, smem, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor pack_bits(const at::Tensor& values_in, int64_t bits) {
  constexpr const char* fn = "qtrain._ext_cuda.pack_bits";
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(values_in.scalar_type() == at::kByte || values_in.scalar_type() == at::kBool,
                   fn, ": values must be uint8 or bool, got ", values_in.scalar_type());
  check_cuda(fn, "values", values_in);
  const int64_t n = values_in.numel();
  check_count(fn, n);
  const c10::cuda::CUDAGuard guard(values_in.device());
  const at::Tensor values = values_in.contiguous();
  at::Tensor out = at::empty({packed_bytes(n, bits)}, values.options().dtype(at::kByte));
  if (n == 0) return out;
  if (bits == 8) {  // the stream is the values themselves
    out.copy_(values.reshape({n}));
    return out;
  }
  const auto* in = static_cast<const uint8_t*>(values.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  const bool aligned = aligned_to(in, 16);
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

at::Tensor unpack_bits(const at::Tensor& packed_in, int64_t bits, int64_t n) {
  constexpr const char* fn = "qtrain._ext_cuda.unpack_bits";
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(packed_in.scalar_type() == at::kByte && packed_in.dim() == 1, fn,
                   ": packed must be a 1-d uint8 tensor, got ", packed_in.scalar_type(), " ",
                   packed_in.sizes());
  check_cuda(fn, "packed", packed_in);
  check_count(fn, n);
  TORCH_CHECK_VALUE(packed_in.numel() >= packed_bytes(n, bits), fn, ": packed has ",
                    packed_in.numel(), " bytes, ", n, " values of ", bits, " bits need ",
                    packed_bytes(n, bits));
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
  const bool aligned = aligned_to(in, 16);
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

at::Tensor masked_scale(const at::Tensor& grad_in, const at::Tensor& packed_in, double scale) {
  constexpr const char* fn = "qtrain._ext_cuda.masked_scale";
  TORCH_CHECK_TYPE(grad_in.scalar_type() == at::kFloat, fn, ": grad must be float32, got ",
                   grad_in.scalar_type());
  TORCH_CHECK_TYPE(packed_in.scalar_type() == at::kByte && packed_in.dim() == 1, fn,
                   ": packed must be a 1-d uint8 tensor, got ", packed_in.scalar_type(), " ",
                   packed_in.sizes());
  check_cuda(fn, "grad", grad_in);
  check_cuda(fn, "packed", packed_in);
  check_same_device(fn, grad_in, packed_in);
  const int64_t n = grad_in.numel();
  TORCH_CHECK_VALUE(packed_in.numel() >= packed_bytes(n, 1), fn, ": packed has ",
                    packed_in.numel(), " bytes, ", n, " mask bits need ", packed_bytes(n, 1));
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor packed = packed_in.contiguous();
  at::Tensor out = at::empty(grad.sizes(), grad.options());
  if (n == 0) return out;
  const auto* g = grad.const_data_ptr<float>();
  masked_scale_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, current_stream()>>>(
      g, aligned_to(g, 16), static_cast<const uint8_t*>(packed.const_data_ptr()), n,
      static_cast<float>(scale), out.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor rademacher(int64_t d, int64_t k, uint64_t seed, int64_t offset) {
  constexpr const char* fn = "qtrain._ext_cuda.rademacher";
  TORCH_CHECK_VALUE(d >= 0 && k >= 1, fn, ": need d >= 0 and k >= 1, got d=", d, ", k=", k);
  TORCH_CHECK_VALUE(d <= std::numeric_limits<int64_t>::max() / k, fn, ": d * k overflows: d=", d,
                    ", k=", k);
  const int64_t n = d * k;
  check_counter_range(fn, n, offset);
  // no tensor argument: the current CUDA device
  at::Tensor out = at::empty({d, k}, at::TensorOptions().dtype(at::kFloat).device(
                                         at::kCUDA, c10::cuda::current_device()));
  if (n == 0) return out;
  rademacher_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      out.mutable_data_ptr<float>(), n, float_bits(rademacher_mag(k)),
      rng::keys_from_seed(seed), static_cast<uint64_t>(offset));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace compress
}  // namespace cuda
}  // namespace qtrain
