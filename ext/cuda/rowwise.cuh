// What the CUDA kernels of the row codecs share (quantize_rows, dequantize_rows, their
// *_into message forms, the fused projections, pack / unpack, masked_scale,
// fill_rademacher): the device-side codec, the launches several ops make (defined in
// rowwise.cu) and launch sizing. Results equal the references qtrain/quant/rowwise.py
// and qtrain/quant/projection.py (and so the CPU kernels) bit for bit. The float32
// steps are those of cpu/rowwise.h's header comment, written with __fsub_rn /
// __fmul_rn / __fadd_rn / __fdiv_rn so no FMA contraction or approximate division can
// change a result whatever the flags.
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
// * quantize_rows_into / dequantize_rows_into: the row kernels above composed with
//   ATen's gather / scatter and copies into the message segment's layout.
//
// Non-finite rows follow the CPU kernel: a NaN row gets zero = range = NaN and
// level 0; a row with +-Inf gets level 0 and dequantizes to NaN. Argument checks are
// not here: each op's front (ext/ops/) makes them for every device.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/rng.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace rowwise {

constexpr int kThreads = 256;           // every kernel's block size
constexpr int kWarps = kThreads / 32;
constexpr int64_t kTileElems = 4096;    // quantize_rows: elements per tile (about)
constexpr int64_t kMaxTileRows = 1024;  // quantize_rows: rows per tile at most (a multiple of 8)
constexpr int64_t kWideWidth = 1024;    // wider rows: the whole block reduces one row
constexpr int64_t kMaxFusedK = 1024;    // fused projection kernels up to this k
constexpr int64_t kSmemFloats = 12000;  // fused kernels' shared memory budget (< 48 KiB)

// ---------------------------------------------------------------- host helpers

// Blocks for a grid-stride loop over `items` thread-sized pieces of work.
inline unsigned int blocks_for(int64_t items) {
  const int64_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(b, int64_t{1} << 20)));
}

// Rows per byte-aligned block: 8 / gcd(width, 8).
inline int64_t row_align(int64_t width) {
  int64_t g = 8;
  for (int64_t w = width % 8; w != 0;) {
    const int64_t r = g % w;
    g = w;
    w = r;
  }
  return 8 / g;
}

// Lanes per row for tile_stats: the power of two >= width, at most 32.
inline int team_for(int64_t width) {
  int t = 1;
  while (t < 32 && t < width) t *= 2;
  return t;
}

struct Quantized {
  at::Tensor packed, zero, range;
};

// (packed, zero, range) of rows x width values, allocated (empty ones zero-filled).
inline Quantized allocate_quantized(const at::TensorOptions& opts, int64_t rows, int64_t width,
                                    int64_t bits) {
  const auto bf16 = opts.dtype(at::kBFloat16);
  if (rows == 0 || width == 0) {
    return {at::zeros({0}, opts.dtype(at::kByte)), at::zeros({rows}, bf16), at::zeros({rows}, bf16)};
  }
  return {at::empty({(rows * width * bits + 7) / 8}, opts.dtype(at::kByte)),
          at::empty({rows}, bf16), at::empty({rows}, bf16)};
}

inline uint16_t* bf16_ptr(at::Tensor& t) { return static_cast<uint16_t*>(t.mutable_data_ptr()); }

// fl32(1 / sqrt(k)): both double operations are correctly rounded, as in Python
inline float rademacher_mag(int64_t k) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(k)));
}

inline uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Rows per tile of the fused kernels: about 256 (4-row, 1-column) items, a multiple of 8.
inline int fused_tile_rows(int64_t n_out) {
  const int64_t tr = (1024 / n_out) / 8 * 8;
  return static_cast<int>(std::min<int64_t>(64, std::max<int64_t>(8, tr)));
}

// ---------------------------------------------------------------- launches (rowwise.cu)

// quantize_rows of a contiguous float32 CUDA tensor x [rows, width] (rows * width > 0)
// into q, allocated by allocate_quantized.
void launch_quantize_rows(const float* x, int64_t rows, int64_t width, int64_t bits,
                          bool stochastic, const rng::Keys& keys, int64_t offset, Quantized& q,
                          cudaStream_t stream);

// dequantize_rows of rows x width values (rows * width > 0) into out [rows, width]
// (contiguous, any 4-byte aligned address). zero and range: bfloat16 bits, 2-byte aligned.
void launch_dequantize_rows(const uint8_t* packed, const uint16_t* zero, const uint16_t* range,
                            int64_t rows, int64_t width, int64_t bits, float* out,
                            cudaStream_t stream);

// The bit table of signed_sums for the [d, k] Rademacher matrix at `offset` (see
// sign_words_kernel): inputs n_in, outputs n_out; transposed: the back-projection.
at::Tensor sign_words(const at::TensorOptions& opts, int64_t n_in, int64_t n_out, int64_t k,
                      bool transposed, const rng::Keys& keys, uint64_t offset,
                      cudaStream_t stream);

// out [rows, n_out] = mag * the signed sums of in [rows, n_in] in input order, in global
// memory: the fused kernels' fallback for k > kMaxFusedK.
void launch_signed_sums(const float* in, int64_t rows, int64_t n_in, int64_t n_out,
                        const uint32_t* signs, float mag, float* out, cudaStream_t stream);

// The contiguous int64 row index of a message (on the current device, its type checked
// by the op's front): every entry in [0, limit) (IndexError naming one that is not)
// and, with `unique`, no row twice (ValueError naming one). A kernel sets the flags; the
// host waits for them once (what only the data can tell).
at::Tensor checked_row_index(const char* fn, const at::Tensor& index, int64_t limit, bool unique,
                             cudaStream_t stream);

// ---------------------------------------------------------------- device helpers

#if defined(__CUDACC__)

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

// Bits 1, 2, 4: 8 values (one per byte of a uint64, masked to B bits) to 8 * B bits by
// three doubling steps, and back (as cpu/rowwise_variants.cpp's Packing).
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


#endif  // __CUDACC__

}  // namespace rowwise
}  // namespace cuda
}  // namespace qtrain
