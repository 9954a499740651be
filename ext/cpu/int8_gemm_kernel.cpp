// int8_gemm on the CPU (front: ops/int8_gemm.cpp): INT8 GEMM with the dequantization
// (and bias) fused into the store. Also the product of quantized_gemm's CPU kernel
// (cpu/quantized_gemm_kernel.cpp), which calls qtrain::cpu::int8_gemm (cpu/gemm.h).
//
//   "nn": C[M,N] = A[M,K] @ B[K,N]   "nt": A[M,K] @ B[N,K]^T   "tn": A[K,M]^T @ B[K,N]
//   C = fl32(float(acc) * f[m, n]) (+ bias[n])        acc = sum_k a*b, exact
//   f[m, n] = fl32(fl32(scale * row_scale[m]) * col_scale[n])   (an absent vector is 1:
//             f = scale without either, bit for bit the per-tensor product)
//
// The reference is qtrain/ops/gemm.py. Integer accumulation is exact, so the
// result is bit-identical to it for any blocking, thread count and ISA; the
// float part is one conversion (round to nearest), one multiply and one add,
// in that order (-ffp-contract=off, no FMA). The factor f is computed per element
// as the reference does: fl32(scale * row_scale[m]) once per tile row (a scalar
// multiply), times col_scale[n..] as a float32 vector multiply.
//
// Kernel families (picked from isa::variant()):
//
// * avx512vnni: vpdpbusd multiplies u8 x s8. A's bytes are flipped to a+128
//   (xor 0x80) and 128 * colsum(B) is subtracted per column in the epilogue;
//   int32 arithmetic wraps, so the result is exact whenever the true sum fits
//   int32 (|acc| <= K * 2^14, guaranteed for K <= 65536; larger K is summed in
//   chunks into int64). Correct for every int8 value, -128 included.
//   Tile: 6 rows x 64 columns (24 zmm accumulators).
// * avx512f and avx2: both operands sign-extended to int16 pairs, vpmaddwd
//   (exact: |a0*b0 + a1*b1| <= 2^15) and vpaddd. Tiles 6 x 64 (zmm) and 6 x 16
//   (ymm). No vpmaddubsw: it saturates.
// * default: the same int16-pair layout in portable C++.
//
// The micro-tiles are written with intrinsics per family rather than one portable
// body per ISA (QT_DEFINE_VARIANT): compilers do not turn portable code into
// vpdpbusd / vpmaddwd register tiles. Packing and drivers are shared C++.
//
// B is packed once per call into column panels ([k-group][column][k in group]),
// zero-padded in K and N, so A's padding bytes never matter. A is read in place
// (avx512vnni, "nn"/"nt") or packed per 6-row block. Threads own contiguous
// row blocks. "tn" with a long inner dimension (dW = X^T dY: K = number of
// nodes, M and N = hidden sizes) instead splits K across threads: each thread
// packs K-chunks of both operands and accumulates an int64 partial C; the
// partials are summed at the end (integers: order-free, deterministic).
// A large output buffer gets a transparent-huge-page hint before it is written
// (advise_huge_pages, cpu/mem.h): writing fresh 4 KiB pages otherwise costs as much as the
// arithmetic.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/block_gemm.h"
#include "cpu/gemm.h"
#include "cpu/int4.h"
#include "cpu/isa.h"
#include "cpu/mem.h"

#if QT_X86_DISPATCH
#include <immintrin.h>
#endif

namespace qtrain {
namespace {

constexpr int kMR = 6;                 // rows per micro-tile, every family
constexpr int64_t kChunkK = 65536;     // inner length whose int32 partial sums cannot overflow
constexpr int64_t kSplitChunk = 1024;  // K-chunk of the split-K ("tn") path

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Everything a micro-tile needs. Units of a/b/strides depend on the family.
struct TileArgs {
  const void* a;       // A rows of this tile at k-step 0
  int64_t ars;         // A: distance between rows (elements of the family's A unit)
  int64_t aks;         // A: distance between k-steps
  int64_t steps;       // k-steps (4 k each for VNNI, 2 for the int16 families)
  const int8_t* tail;  // VNNI only: one more k-step from a [rows][4] byte buffer, or null
  const void* b;       // packed B panel at k-step 0
  // store epilogue: float32 c (int8_gemm), or exact int32 c32 (int8_gemm_int32) when set
  float* c;
  int32_t* c32;
  int64_t ldc;
  int ncols;            // valid columns of the tile
  const float* bias;    // at the tile's first column, or null
  const int32_t* corr;  // VNNI: 128 * colsum(B) (mod 2^32) at the tile's first column
  float scale;
  const float* rs;  // row_scale at the tile's first row, or null (1)
  const float* cs;  // col_scale at the tile's first column, or null (1)
  bool stream;  // full float32 rows go to memory with non-temporal stores (c 64-byte aligned)
  // int64 accumulate epilogue
  int64_t* c64;
  int64_t ldc64;
};

using TileFn = void (*)(const TileArgs&);

// ---------------------------------------------------------------- packing (plain C++)

// out[g][x][j] = src[(4g + j) * s_k + (x0 + x) * s_x] for k = 4g + j < K and x < nx, else 0;
// g < ceil(K / 4), x < W. The 4 bytes of one column are one vpdpbusd lane.
void pack_bytes(const int8_t* src, int64_t s_k, int64_t s_x, int64_t K, int64_t x0, int64_t nx,
                int64_t W, int8_t* out) {
  const int64_t groups = round_up(K, 4) / 4;
  for (int64_t g = 0; g < groups; ++g) {
    int8_t* o = out + g * W * 4;
    const int64_t kb = 4 * g;
    int64_t x = 0;
#if defined(__SSE2__)
    if (s_x == 1 && kb + 4 <= K) {
      const int8_t* r0 = src + kb * s_k + x0;
      for (; x + 16 <= nx; x += 16) {
        const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + x));
        const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + s_k + x));
        const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + 2 * s_k + x));
        const __m128i v3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + 3 * s_k + x));
        const __m128i lo01 = _mm_unpacklo_epi8(v0, v1), hi01 = _mm_unpackhi_epi8(v0, v1);
        const __m128i lo23 = _mm_unpacklo_epi8(v2, v3), hi23 = _mm_unpackhi_epi8(v2, v3);
        __m128i* d = reinterpret_cast<__m128i*>(o + 4 * x);
        _mm_storeu_si128(d + 0, _mm_unpacklo_epi16(lo01, lo23));
        _mm_storeu_si128(d + 1, _mm_unpackhi_epi16(lo01, lo23));
        _mm_storeu_si128(d + 2, _mm_unpacklo_epi16(hi01, hi23));
        _mm_storeu_si128(d + 3, _mm_unpackhi_epi16(hi01, hi23));
      }
    }
#endif
    for (; x < nx; ++x) {
      for (int j = 0; j < 4; ++j) {
        o[4 * x + j] = kb + j < K ? src[(kb + j) * s_k + (x0 + x) * s_x] : int8_t{0};
      }
    }
    if (W > nx) std::memset(o + 4 * nx, 0, static_cast<size_t>(4 * (W - nx)));
  }
}

// out[g][x][j] = int16(src[(2g + j) * s_k + (x0 + x) * s_x]), zero-padded, g < ceil(K / 4) * 2.
void pack_pairs16(const int8_t* src, int64_t s_k, int64_t s_x, int64_t K, int64_t x0, int64_t nx,
                  int64_t W, int16_t* out) {
  const int64_t groups = round_up(K, 4) / 2;
  for (int64_t g = 0; g < groups; ++g) {
    int16_t* o = out + g * W * 2;
    const int64_t kb = 2 * g;
    for (int64_t x = 0; x < nx; ++x) {
      for (int j = 0; j < 2; ++j) {
        o[2 * x + j] = kb + j < K ? src[(kb + j) * s_k + (x0 + x) * s_x] : int8_t{0};
      }
    }
    for (int64_t x = nx; x < W; ++x) o[2 * x] = o[2 * x + 1] = 0;
  }
}

// ---------------------------------------------------------------- avx512vnni

#if QT_X86_DISPATCH
constexpr int kVnniNR = 64;  // 4 zmm of 16 int32 lanes

QT_ALWAYS_INLINE QT_TARGET_AVX512 __mmask16 lanes_mask(int valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xffff)
                     : static_cast<__mmask16>((1u << std::max(valid, 0)) - 1u);
}

// Epilogue of the zmm tiles (VNNI and avx512f): with ACC64, widen the int32 sums
// and add them into the int64 accumulator (split-K); else store
// fl32(float(acc - corr) * f) (+ bias), where CORR subtracts VNNI's u8-offset
// column correction and f = fl32(fl32(scale * rs[r]) * cs[c]) (scale without vectors).
// Masked stores only on a partial last panel (they are slower).
template <int R, int NV, bool ACC64, bool CORR>
QT_ALWAYS_INLINE QT_TARGET_AVX512 void store_tile_zmm(__m512i (&acc)[R][NV], const TileArgs& t) {
  if constexpr (ACC64) {
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < NV; ++v) {
        int64_t* p = t.c64 + r * t.ldc64 + 16 * v;
        const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[r][v]));
        const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[r][v], 1));
        _mm512_storeu_si512(p, _mm512_add_epi64(_mm512_loadu_si512(p), lo));
        _mm512_storeu_si512(p + 8, _mm512_add_epi64(_mm512_loadu_si512(p + 8), hi));
      }
    }
  } else {
    __m512i corr[NV];
    __m512 bias[NV];
    __m512 cs[NV];
    __mmask16 mask[NV];
    const bool full = t.ncols == 16 * NV;
    for (int v = 0; v < NV; ++v) {
      mask[v] = lanes_mask(t.ncols - 16 * v);
      if constexpr (CORR) corr[v] = _mm512_loadu_si512(t.corr + 16 * v);
      bias[v] = t.bias != nullptr ? _mm512_maskz_loadu_ps(mask[v], t.bias + 16 * v)
                                  : _mm512_setzero_ps();
      cs[v] = t.cs != nullptr ? _mm512_maskz_loadu_ps(mask[v], t.cs + 16 * v)
                              : _mm512_setzero_ps();
    }
    for (int r = 0; r < R; ++r) {
      const __m512 vs = _mm512_set1_ps(t.rs != nullptr ? t.scale * t.rs[r] : t.scale);
      for (int v = 0; v < NV; ++v) {
        __m512i sum = acc[r][v];
        if constexpr (CORR) sum = _mm512_sub_epi32(sum, corr[v]);
        if (t.c32 != nullptr) {
          _mm512_mask_storeu_epi32(t.c32 + r * t.ldc + 16 * v, mask[v], sum);
          continue;
        }
        const __m512 fv = t.cs != nullptr ? _mm512_mul_ps(vs, cs[v]) : vs;
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), fv);
        if (t.bias != nullptr) f = _mm512_add_ps(f, bias[v]);
        if (full && t.stream) {
          _mm512_stream_ps(t.c + r * t.ldc + 16 * v, f);
        } else if (full) {
          _mm512_storeu_ps(t.c + r * t.ldc + 16 * v, f);
        } else {
          _mm512_mask_storeu_ps(t.c + r * t.ldc + 16 * v, mask[v], f);
        }
      }
    }
  }
}

template <int R, int NV, bool ACC64>
QT_TARGET_AVX512VNNI void tile_vnni(const TileArgs& t) {
  __m512i acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
  const int8_t* b = static_cast<const int8_t*>(t.b);
  // segment 0: A in place (or packed); segment 1: the zero-padded last group of k, if any
  for (int seg = 0; seg < 2; ++seg) {
    const int8_t* a = seg == 0 ? static_cast<const int8_t*>(t.a) : t.tail;
    const int64_t ars = seg == 0 ? t.ars : 4;
    const int64_t aks = seg == 0 ? t.aks : 0;
    const int64_t steps = seg == 0 ? t.steps : (t.tail != nullptr ? 1 : 0);
    for (int64_t s = 0; s < steps; ++s) {
      __m512i bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + 64 * v);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t w;
        std::memcpy(&w, a + r * ars, 4);
        const __m512i av = _mm512_xor_si512(_mm512_set1_epi32(w), flip);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, bv[v]);
      }
      a += aks;
      b += kVnniNR * 4;
    }
  }
  store_tile_zmm<R, NV, ACC64, true>(acc, t);
}

// colsum[c] += sum over the panel's k of B[k][c], via vpdpbusd with an all-ones u8 operand.
QT_TARGET_AVX512VNNI void colsum_vnni(const int8_t* panel, int64_t steps, int64_t* colsum) {
  const __m512i ones = _mm512_set1_epi8(1);
  int64_t done = 0;
  while (done < steps) {
    const int64_t n = std::min<int64_t>(steps - done, kChunkK / 4);  // int32 cannot overflow
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    const int8_t* b = panel + done * kVnniNR * 4;
    for (int64_t s = 0; s < n; ++s, b += kVnniNR * 4) {
      for (int v = 0; v < 4; ++v) {
        acc[v] = _mm512_dpbusd_epi32(acc[v], ones, _mm512_loadu_si512(b + 64 * v));
      }
    }
    alignas(64) int32_t tmp[kVnniNR];
    for (int v = 0; v < 4; ++v) _mm512_store_si512(tmp + 16 * v, acc[v]);
    for (int c = 0; c < kVnniNR; ++c) colsum[c] += tmp[c];
    done += n;
  }
}

// ---------------------------------------------------------------- avx512f (int16 pairs)

// The AVX2 tile widened to zmm: 6 rows x 64 columns of vpmaddwd (AVX-512BW) without VNNI.
template <int R, int NV, bool ACC64>
QT_TARGET_AVX512 void tile_avx512(const TileArgs& t) {
  __m512i acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
  const int32_t* a = static_cast<const int32_t*>(t.a);
  const int16_t* b = static_cast<const int16_t*>(t.b);
  for (int64_t s = 0; s < t.steps; ++s) {
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + 32 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(a[r * t.ars]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = _mm512_add_epi32(acc[r][v], _mm512_madd_epi16(av, bv[v]));
      }
    }
    a += t.aks;
    b += kVnniNR * 2;
  }
  store_tile_zmm<R, NV, ACC64, false>(acc, t);
}

// ---------------------------------------------------------------- avx2 (int16 pairs)

constexpr int kPairNR = 16;  // columns of an int16-pair panel (avx2: 2 ymm; default: 16 ints)

template <int R, int NV, bool ACC64>
QT_TARGET_AVX2 void tile_avx2(const TileArgs& t) {
  __m256i acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_si256();
  const int32_t* a = static_cast<const int32_t*>(t.a);
  const int16_t* b = static_cast<const int16_t*>(t.b);
  for (int64_t s = 0; s < t.steps; ++s) {
    __m256i bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 * v));
    }
    for (int r = 0; r < R; ++r) {
      const __m256i av = _mm256_set1_epi32(a[r * t.ars]);
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(av, bv[v]));
      }
    }
    a += t.aks;
    b += kPairNR * 2;
  }
  if constexpr (ACC64) {
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < NV; ++v) {
        int64_t* p = t.c64 + r * t.ldc64 + 8 * v;
        const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(acc[r][v]));
        const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(acc[r][v], 1));
        __m256i* q = reinterpret_cast<__m256i*>(p);
        _mm256_storeu_si256(q, _mm256_add_epi64(_mm256_loadu_si256(q), lo));
        _mm256_storeu_si256(q + 1, _mm256_add_epi64(_mm256_loadu_si256(q + 1), hi));
      }
    }
  } else {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i mask[NV];
    __m256 bias[NV];
    __m256 cs[NV];
    for (int v = 0; v < NV; ++v) {
      mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(t.ncols - 8 * v), iota);
      bias[v] = t.bias != nullptr ? _mm256_maskload_ps(t.bias + 8 * v, mask[v])
                                  : _mm256_setzero_ps();
      cs[v] = t.cs != nullptr ? _mm256_maskload_ps(t.cs + 8 * v, mask[v]) : _mm256_setzero_ps();
    }
    for (int r = 0; r < R; ++r) {
      // f = fl32(fl32(scale * rs[r]) * cs[c]), as the zmm epilogue
      const __m256 vs = _mm256_set1_ps(t.rs != nullptr ? t.scale * t.rs[r] : t.scale);
      for (int v = 0; v < NV; ++v) {
        if (t.c32 != nullptr) {
          _mm256_maskstore_epi32(t.c32 + r * t.ldc + 8 * v, mask[v], acc[r][v]);
          continue;
        }
        const __m256 fv = t.cs != nullptr ? _mm256_mul_ps(vs, cs[v]) : vs;
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][v]), fv);
        if (t.bias != nullptr) f = _mm256_add_ps(f, bias[v]);
        _mm256_maskstore_ps(t.c + r * t.ldc + 8 * v, mask[v], f);
      }
    }
  }
}
#endif  // QT_X86_DISPATCH

// ---------------------------------------------------------------- default (portable)

template <int R, int NV, bool ACC64>
void tile_default(const TileArgs& t) {
  static_assert(NV == 1, "the portable tile is one 16-column vector wide");
  int32_t acc[R][16] = {};
  const int16_t* a = static_cast<const int16_t*>(t.a);
  const int16_t* b = static_cast<const int16_t*>(t.b);
  for (int64_t s = 0; s < t.steps; ++s) {
    for (int r = 0; r < R; ++r) {
      const int32_t a0 = a[2 * r * t.ars], a1 = a[2 * r * t.ars + 1];
      for (int c = 0; c < 16; ++c) acc[r][c] += a0 * b[2 * c] + a1 * b[2 * c + 1];
    }
    a += 2 * t.aks;
    b += 32;
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (ACC64) {
      for (int c = 0; c < 16; ++c) t.c64[r * t.ldc64 + c] += acc[r][c];
    } else if (t.c32 != nullptr) {
      for (int c = 0; c < t.ncols; ++c) t.c32[r * t.ldc + c] = acc[r][c];
    } else {
      const float rs = t.rs != nullptr ? t.scale * t.rs[r] : t.scale;
      for (int c = 0; c < t.ncols; ++c) {
        const float fc = t.cs != nullptr ? rs * t.cs[c] : rs;
        float f = static_cast<float>(acc[r][c]) * fc;
        if (t.bias != nullptr) f = f + t.bias[c];
        t.c[r * t.ldc + c] = f;
      }
    }
  }
}

// ---------------------------------------------------------------- families

// kBytes: B packed as bytes [k/4][NR][4] (VNNI, with the +128 correction), else as int16
// pairs [k/2][NR][2]. kDirectA: A rows are read in place in "nn"/"nt".
#if QT_X86_DISPATCH
struct Vnni {
  static constexpr int kNR = kVnniNR, kLanes = 16, kNV = 4, kKStep = 4;
  static constexpr bool kBytes = true, kDirectA = true;
  template <int R, int NV, bool ACC64>
  static void tile(const TileArgs& t) {
    tile_vnni<R, NV, ACC64>(t);
  }
};
struct Avx512 {
  static constexpr int kNR = kVnniNR, kLanes = 16, kNV = 4, kKStep = 2;
  static constexpr bool kBytes = false, kDirectA = false;
  template <int R, int NV, bool ACC64>
  static void tile(const TileArgs& t) {
    tile_avx512<R, NV, ACC64>(t);
  }
};
struct Avx2 {
  static constexpr int kNR = kPairNR, kLanes = 8, kNV = 2, kKStep = 2;
  static constexpr bool kBytes = false, kDirectA = false;
  template <int R, int NV, bool ACC64>
  static void tile(const TileArgs& t) {
    tile_avx2<R, NV, ACC64>(t);
  }
};
#endif
struct Portable {
  static constexpr int kNR = 16, kLanes = 16, kNV = 1, kKStep = 2;
  static constexpr bool kBytes = false, kDirectA = false;
  template <int R, int NV, bool ACC64>
  static void tile(const TileArgs& t) {
    tile_default<R, NV, ACC64>(t);
  }
};

template <class F, bool ACC64, int R, int NV = 1>
TileFn pick_nv(int nv) {
  if constexpr (NV > F::kNV) {
    return nullptr;
  } else {
    return nv == NV ? &F::template tile<R, NV, ACC64> : pick_nv<F, ACC64, R, NV + 1>(nv);
  }
}

template <class F, bool ACC64, int R = 1>
TileFn pick(int rows, int nv) {
  if constexpr (R > kMR) {
    return nullptr;
  } else {
    return rows == R ? pick_nv<F, ACC64, R>(nv) : pick<F, ACC64, R + 1>(rows, nv);
  }
}

// ---------------------------------------------------------------- drivers

struct Problem {
  const int8_t* a;
  const int8_t* b;
  // a "tn" operand stored packed: 4-bit values two a byte, row k at ceil(width / 2) * k
  // bytes (int8_block_gemm; its K-slices are unpacked in cache before they are packed)
  bool a_packed, b_packed;
  int64_t M, N, K;
  char layout;  // 'n' = "nn", 't' = "nt", 'T' = "tn"
  float scale;
  const float* bias;       // [N] or null
  const float* row_scale;  // [M] or null (1)
  const float* col_scale;  // [N] or null (1)
  float* out;              // [M, N], or null when out32 is set
  int32_t* out32;     // [M, N] exact int32 sums (int8_gemm_int32), or null
};

// A's element (m, k) is at a[m * a_sm + k * a_sk]; B's (k, n) at b[k * b_sk + n * b_sn].
void strides(const Problem& p, int64_t& a_sm, int64_t& a_sk, int64_t& b_sk, int64_t& b_sn) {
  a_sm = p.layout == 'T' ? 1 : p.K;
  a_sk = p.layout == 'T' ? p.M : 1;
  b_sk = p.layout == 't' ? 1 : p.N;
  b_sn = p.layout == 't' ? p.K : 1;
}

// A float32 output much larger than the caches is written with non-temporal stores: a
// normal store first reads each line it fills, doubling the memory traffic of a product
// whose time is mostly that of writing its output (169,343 x 128 at K = 128), and the
// next operator would find the lines evicted anyway. Needs every row 64-byte aligned.
bool streams_output(const Problem& p) {
  constexpr int64_t kStreamBytes = int64_t{32} << 20;
  return p.out != nullptr && p.M * p.N * 4 >= kStreamBytes && p.N % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.out) % 64 == 0;
}

// out = fl32(float(acc - corr[n]) * f) (+ bias[n]) for an int64 block, f =
// fl32(fl32(scale * rs[r]) * cs[c]) (an absent rs / cs is 1), or into out32 the sum itself,
// saturated to int32. rs / cs point at the block's first row / column.
void finalize(const int64_t* acc, int64_t ld, int64_t rows, int64_t cols, const int64_t* corr,
              float scale, const float* rs, const float* cs, const float* bias, float* out,
              int32_t* out32, int64_t ldo) {
  if (out32 != nullptr) {
    constexpr int64_t lo = std::numeric_limits<int32_t>::min();
    constexpr int64_t hi = std::numeric_limits<int32_t>::max();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t v = acc[r * ld + c] - (corr != nullptr ? corr[c] : 0);
        out32[r * ldo + c] = static_cast<int32_t>(std::min(hi, std::max(lo, v)));
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float fr = rs != nullptr ? scale * rs[r] : scale;
    for (int64_t c = 0; c < cols; ++c) {
      const float fc = cs != nullptr ? fr * cs[c] : fr;
      float f = static_cast<float>(acc[r * ld + c] - (corr != nullptr ? corr[c] : 0)) * fc;
      if (bias != nullptr) f = f + bias[c];
      out[r * ldo + c] = f;
    }
  }
}

// Threads for `work_items` independent pieces; one thread below ~1M multiply-adds.
int team_size(int64_t work_items, double macs) {
  const int64_t have = std::max(1, at::get_num_threads());
  if (macs < 1048576.0) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min(have, work_items)));
}

// Per-thread buffers of the drivers.
struct Scratch {
  std::vector<int8_t> a8, b8;     // packed A / B (VNNI bytes)
  std::vector<int8_t> a_rows, b_rows;  // a packed operand's K-slice unpacked to int8 rows
  std::vector<int16_t> a16, b16;  // packed A / B (int16 pairs)
  std::vector<int64_t> c64, cs;   // int64 accumulators, column sums
};

template <typename Fn>
void run_team(int nt, const Fn& body) {
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    body(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  body(0, 1);
}

// B packed once into panels of F::kNR columns; threads own contiguous 6-row blocks.
template <class F>
void gemm_rows(const Problem& p) {
  int64_t a_sm, a_sk, b_sk, b_sn;
  strides(p, a_sm, a_sk, b_sk, b_sn);
  const int64_t Kp = round_up(p.K, 4);
  const int64_t panels = (p.N + F::kNR - 1) / F::kNR;
  const int64_t Np = panels * F::kNR;
  const int64_t panel_elems = Kp * F::kNR;  // bytes (VNNI) or int16s
  const int64_t steps_total = Kp / F::kKStep;
  const int64_t chunk_steps = kChunkK / F::kKStep;
  const bool big_k = p.K > kChunkK;

  std::vector<int8_t> b8;
  std::vector<int16_t> b16;
  std::vector<int64_t> colsum(static_cast<size_t>(Np), 0);
  std::vector<int32_t> corr32(static_cast<size_t>(Np), 0);
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t n0 = q * F::kNR, nc = std::min<int64_t>(F::kNR, p.N - n0);
    if constexpr (F::kBytes) {
      if (b8.empty()) b8.resize(static_cast<size_t>(panels * panel_elems));
      int8_t* dst = b8.data() + q * panel_elems;
      pack_bytes(p.b, b_sk, b_sn, p.K, n0, nc, F::kNR, dst);
#if QT_X86_DISPATCH
      colsum_vnni(dst, Kp / 4, colsum.data() + n0);
#endif
    } else {
      if (b16.empty()) b16.resize(static_cast<size_t>(panels * panel_elems));
      pack_pairs16(p.b, b_sk, b_sn, p.K, n0, nc, F::kNR, b16.data() + q * panel_elems);
    }
  }
  std::vector<int64_t> corr64(static_cast<size_t>(Np), 0);
  if constexpr (F::kBytes) {
    for (int64_t n = 0; n < Np; ++n) {
      corr64[n] = 128 * colsum[n];
      corr32[n] = static_cast<int32_t>(static_cast<uint32_t>(corr64[n]));  // mod 2^32
    }
  }

  const int64_t blocks = (p.M + kMR - 1) / kMR;
  const int nt = team_size(blocks, static_cast<double>(p.M) * static_cast<double>(p.N) *
                                          static_cast<double>(std::max<int64_t>(p.K, 1)));
  const bool direct_a = F::kDirectA && p.layout != 'T';
  const bool stream = streams_output(p);
  // per-thread scratch, allocated here: nothing may throw inside the parallel region
  std::vector<Scratch> scratch(static_cast<size_t>(nt));
  for (Scratch& sc : scratch) {
    if (!direct_a) {
      if constexpr (F::kBytes) {
        sc.a8.resize(static_cast<size_t>(Kp * kMR));
      } else {
        sc.a16.resize(static_cast<size_t>(Kp * kMR));
      }
    }
    if (big_k) sc.c64.resize(static_cast<size_t>(kMR * F::kNR));
  }
  run_team(nt, [&](int t, int T) {
    const int64_t b0 = blocks * t / T, b1 = blocks * (t + 1) / T;
    std::vector<int8_t>& abuf8 = scratch[static_cast<size_t>(t)].a8;
    std::vector<int16_t>& abuf16 = scratch[static_cast<size_t>(t)].a16;
    std::vector<int64_t>& tile64 = scratch[static_cast<size_t>(t)].c64;
    alignas(64) int8_t tail[kMR * 4];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t m0 = blk * kMR;
      const int rows = static_cast<int>(std::min<int64_t>(kMR, p.M - m0));
      TileArgs base{};
      base.scale = p.scale;
      base.rs = p.row_scale != nullptr ? p.row_scale + m0 : nullptr;
      base.stream = stream;
      base.tail = nullptr;
      int64_t a_step;  // A elements advanced per k-step (for chunking)
      if (direct_a) {
        // A rows in place; a final partial group of k comes from `tail`
        base.a = p.a + m0 * a_sm;
        base.ars = a_sm;
        base.aks = 4;
        a_step = 4;
        if (p.K % 4 != 0) {
          std::memset(tail, 0, sizeof tail);
          for (int r = 0; r < rows; ++r) {
            for (int64_t k = p.K / 4 * 4; k < p.K; ++k) {
              tail[r * 4 + (k % 4)] = p.a[(m0 + r) * a_sm + k];
            }
          }
        }
      } else {
        if constexpr (F::kBytes) {
          pack_bytes(p.a, a_sk, a_sm, p.K, m0, rows, kMR, abuf8.data());
          base.a = abuf8.data();
          base.ars = 4;
          base.aks = 4 * kMR;
          a_step = 4 * kMR;
        } else {
          pack_pairs16(p.a, a_sk, a_sm, p.K, m0, rows, kMR, abuf16.data());
          base.a = abuf16.data();
          base.ars = 1;
          base.aks = kMR;
          a_step = 2 * kMR;  // int16 elements per step
        }
      }
      const int64_t direct_steps = direct_a ? p.K / 4 : steps_total;
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t n0 = q * F::kNR;
        const int nc = static_cast<int>(std::min<int64_t>(F::kNR, p.N - n0));
        const int nv = (nc + F::kLanes - 1) / F::kLanes;
        const void* bpanel = F::kBytes ? static_cast<const void*>(b8.data() + q * panel_elems)
                                       : static_cast<const void*>(b16.data() + q * panel_elems);
        TileArgs ta = base;
        if (!big_k) {
          ta.steps = direct_steps;
          ta.tail = direct_a && p.K % 4 != 0 ? tail : nullptr;
          ta.b = bpanel;
          ta.c = p.out != nullptr ? p.out + m0 * p.N + n0 : nullptr;
          ta.c32 = p.out32 != nullptr ? p.out32 + m0 * p.N + n0 : nullptr;
          ta.ldc = p.N;
          ta.ncols = nc;
          ta.bias = p.bias != nullptr ? p.bias + n0 : nullptr;
          ta.cs = p.col_scale != nullptr ? p.col_scale + n0 : nullptr;
          ta.corr = corr32.data() + n0;
          pick<F, false>(rows, nv)(ta);
          continue;
        }
        // K > kChunkK: int32 partial sums per chunk, accumulated in int64
        std::fill(tile64.begin(), tile64.end(), 0);
        const TileFn fn = pick<F, true>(rows, nv);
        for (int64_t s0 = 0; s0 < direct_steps; s0 += chunk_steps) {
          const int64_t n = std::min(chunk_steps, direct_steps - s0);
          ta.steps = n;
          ta.tail = direct_a && p.K % 4 != 0 && s0 + n == direct_steps ? tail : nullptr;
          if (F::kBytes) {
            ta.a = static_cast<const int8_t*>(base.a) + s0 * a_step;
            ta.b = static_cast<const int8_t*>(bpanel) + s0 * F::kNR * 4;
          } else {
            ta.a = static_cast<const int16_t*>(base.a) + s0 * a_step;
            ta.b = static_cast<const int16_t*>(bpanel) + s0 * F::kNR * 2;
          }
          ta.c64 = tile64.data();
          ta.ldc64 = F::kNR;
          fn(ta);
        }
        finalize(tile64.data(), F::kNR, rows, nc, F::kBytes ? corr64.data() + n0 : nullptr,
                 p.scale, base.rs, p.col_scale != nullptr ? p.col_scale + n0 : nullptr,
                 p.bias != nullptr ? p.bias + n0 : nullptr,
                 p.out != nullptr ? p.out + m0 * p.N + n0 : nullptr,
                 p.out32 != nullptr ? p.out32 + m0 * p.N + n0 : nullptr, p.N);
      }
    }
#if QT_X86_DISPATCH
    if (stream) _mm_sfence();  // order this thread's non-temporal stores before it returns
#endif
  });
}

// One K-slice [k0, k0 + kc) of a "tn" product, the step the split-K path repeats per chunk
// and the block path per block: A's rows of the slice packed once, then each panel of
// F::kNR columns of B packed and `on_panel(ta, n0, nc, panel, kcp)` called (panel: the
// packed bytes for the VNNI correction, or null for the int16 families; it sets the tile's
// store and correction), then the tiles run over the rows, `at_rows(ta, m0, n0)` pointing
// them at their output. `sc` holds packing room for kc rows (reserve_packing).
// Room in sc for A's and B's packed panels of a K-slice of up to k rows (and for the slice
// of an operand stored packed, unpacked).
template <class F>
void reserve_packing(const Problem& p, Scratch& sc, int64_t k, int64_t Mr, int64_t Np) {
  if (p.a_packed) sc.a_rows.resize(static_cast<size_t>(k * p.M));
  if (p.b_packed) sc.b_rows.resize(static_cast<size_t>(k * p.N));
  if constexpr (F::kBytes) {
    sc.a8.resize(static_cast<size_t>(k * Mr));
    sc.b8.resize(static_cast<size_t>(k * Np));
  } else {
    sc.a16.resize(static_cast<size_t>(k * Mr));
    sc.b16.resize(static_cast<size_t>(k * Np));
  }
}

// Rows [k0, k0 + kc) of a packed "tn" operand of `width` columns as int8 rows of stride
// `width` in `rows` (a K-slice at a time, so they are still in cache when packed).
const int8_t* unpacked_slice(const int8_t* packed, int64_t width, int64_t k0, int64_t kc,
                             std::vector<int8_t>& rows) {
  const int64_t bytes = (width + 1) / 2;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(packed) + k0 * bytes;
  for (int64_t k = 0; k < kc; ++k) {
    int4::unpack_row(src + k * bytes, width, rows.data() + k * width);
  }
  return rows.data();
}

template <class F, bool ACC64, class OnPanel, class AtRows>
void tiles_of_k_slice(const Problem& p, int64_t k0, int64_t kc, int64_t Mr, int64_t panels,
                      Scratch& sc, const OnPanel& on_panel, const AtRows& at_rows) {
  int64_t a_sm, a_sk, b_sk, b_sn;
  strides(p, a_sm, a_sk, b_sk, b_sn);
  const int64_t kcp = round_up(kc, 4);
  // a packed operand is "tn" (a_sk = M, b_sk = N): its slice unpacked has the same strides
  const int8_t* asrc = p.a_packed ? unpacked_slice(p.a, p.M, k0, kc, sc.a_rows) : p.a + k0 * a_sk;
  const int8_t* bsrc = p.b_packed ? unpacked_slice(p.b, p.N, k0, kc, sc.b_rows) : p.b + k0 * b_sk;
  if constexpr (F::kBytes) {
    pack_bytes(asrc, a_sk, a_sm, kc, 0, p.M, Mr, sc.a8.data());
  } else {
    pack_pairs16(asrc, a_sk, a_sm, kc, 0, p.M, Mr, sc.a16.data());
  }
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t n0 = q * F::kNR;
    const int nc = static_cast<int>(std::min<int64_t>(F::kNR, p.N - n0));
    const int nv = (nc + F::kLanes - 1) / F::kLanes;
    TileArgs ta{};
    ta.steps = kcp / F::kKStep;
    if constexpr (F::kBytes) {
      int8_t* bp = sc.b8.data() + q * kcp * F::kNR;
      pack_bytes(bsrc, b_sk, b_sn, kc, n0, nc, F::kNR, bp);
      on_panel(ta, n0, nc, bp, kcp);
      ta.b = bp;
      ta.ars = 4;
      ta.aks = 4 * Mr;
    } else {
      int16_t* bp = sc.b16.data() + q * kcp * F::kNR;
      pack_pairs16(bsrc, b_sk, b_sn, kc, n0, nc, F::kNR, bp);
      on_panel(ta, n0, nc, static_cast<const int8_t*>(nullptr), kcp);
      ta.b = bp;
      ta.ars = 1;
      ta.aks = Mr;
    }
    for (int64_t m0 = 0; m0 < p.M; m0 += kMR) {
      const int rows = static_cast<int>(std::min<int64_t>(kMR, p.M - m0));
      if constexpr (F::kBytes) {
        ta.a = sc.a8.data() + 4 * m0;
      } else {
        ta.a = sc.a16.data() + 2 * m0;
      }
      at_rows(ta, m0, n0);
      pick<F, ACC64>(rows, nv)(ta);
    }
  }
}

// "tn" with a long inner dimension: K split across threads, int64 partial C per thread.
template <class F>
void gemm_split_k(const Problem& p, int64_t Mr, int64_t Np) {
  const int64_t panels = Np / F::kNR;
  const int64_t chunks = (p.K + kSplitChunk - 1) / kSplitChunk;
  const int nt = team_size(chunks, static_cast<double>(p.M) * static_cast<double>(p.N) *
                                          static_cast<double>(p.K));
  // per-thread scratch, allocated (and zeroed) here: nothing may throw inside the parallel
  // region, and a thread OpenMP does not start leaves a zero partial
  std::vector<Scratch> scratch(static_cast<size_t>(nt));
  for (Scratch& sc : scratch) {
    sc.c64.assign(static_cast<size_t>(Mr * Np), 0);
    sc.cs.assign(static_cast<size_t>(Np), 0);
    reserve_packing<F>(p, sc, kSplitChunk, Mr, Np);
  }
  run_team(nt, [&](int t, int T) {
    Scratch& sc = scratch[static_cast<size_t>(t)];
    const int64_t c0 = chunks * t / T, c1 = chunks * (t + 1) / T;
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t k0 = ch * kSplitChunk;
      tiles_of_k_slice<F, true>(
          p, k0, std::min(kSplitChunk, p.K - k0), Mr, panels, sc,
          [&](TileArgs& ta, int64_t n0, int, const int8_t* packed, int64_t kcp) {
            ta.ldc64 = Np;
#if QT_X86_DISPATCH
            if (packed != nullptr) colsum_vnni(packed, kcp / 4, sc.cs.data() + n0);
#else
            (void)n0, (void)packed, (void)kcp;
#endif
          },
          [&](TileArgs& ta, int64_t m0, int64_t n0) { ta.c64 = sc.c64.data() + m0 * Np + n0; });
    }
  });
  // sum the partials (integers: any order gives the same result)
  std::vector<int64_t>& acc = scratch[0].c64;
  std::vector<int64_t> corr(static_cast<size_t>(Np), 0);
  for (int t = 0; t < nt; ++t) {
    const Scratch& sc = scratch[static_cast<size_t>(t)];
    if (t > 0) {
      for (size_t i = 0; i < acc.size(); ++i) acc[i] += sc.c64[i];
    }
    if (F::kBytes) {
      for (int64_t n = 0; n < Np; ++n) corr[n] += 128 * sc.cs[n];
    }
  }
  finalize(acc.data(), Np, p.M, p.N, corr.data(), p.scale, p.row_scale, p.col_scale, p.bias,
           p.out, p.out32, p.N);
}

// ---------------------------------------------------------------- block scales (int8_block_gemm)

// cf[m * ld + n] = fl32(cf + fl32(float(c32[m * ld + n]) * fl32(sa[m] * sb[n]))) for m < M,
// n < N: one block's term of int8_block_gemm, in the ISA variant so the row loop vectorizes.
QT_ALWAYS_INLINE void block_term_body(const int32_t* __restrict c32, float* __restrict cf,
                                      const float* __restrict sa, const float* __restrict sb,
                                      int64_t M, int64_t N, int64_t ld) {
  for (int64_t m = 0; m < M; ++m) {
    const float fa = sa[m];
    const int32_t* cr = c32 + m * ld;
    float* fr = cf + m * ld;
    for (int64_t n = 0; n < N; ++n) fr[n] = fr[n] + static_cast<float>(cr[n]) * (fa * sb[n]);
  }
}

using BlockTermFn = void (*)(const int32_t*, float*, const float*, const float*, int64_t,
                             int64_t, int64_t);
void block_term_default(const int32_t* c32, float* cf, const float* sa, const float* sb,
                        int64_t M, int64_t N, int64_t ld) {
  block_term_body(c32, cf, sa, sb, M, N, ld);
}
#if QT_X86_DISPATCH
QT_TARGET_AVX2 void block_term_avx2(const int32_t* c32, float* cf, const float* sa,
                                    const float* sb, int64_t M, int64_t N, int64_t ld) {
  block_term_body(c32, cf, sa, sb, M, N, ld);
}
QT_TARGET_AVX512 void block_term_avx512(const int32_t* c32, float* cf, const float* sa,
                                        const float* sb, int64_t M, int64_t N, int64_t ld) {
  block_term_body(c32, cf, sa, sb, M, N, ld);
}
#endif

// "tn" with one scale per block of `block` k for every column of A and of B:
//   C = sum over groups g, in order, of (sum over the group's blocks b, in order, of
//       fl32(float(acc_b[m, n]) * fl32(sa[b, m] * sb[b, n])))
// with acc_b the exact int32 sum over the block's k, and the blocks cut into
// block_gemm_groups() contiguous groups (common/block_gemm.h: a function of the shape only).
// Threads take whole groups: each packs a block's rows of A and B (as the split-K path packs
// its chunks), runs the int32-store tiles into its [Mr, Np] buffer and adds the block's term
// into the group's float32 partial; the partials are added in group order at the end. Every
// float32 operation is the reference's, in its order: bit-identical for any thread count and
// ISA.
template <class F>
void gemm_tn_blocks(const Problem& p, int64_t block, const float* sa, const float* sb) {
  const int64_t Mr = round_up(p.M, kMR);
  const int64_t panels = (p.N + F::kNR - 1) / F::kNR;
  const int64_t Np = panels * F::kNR;
  const int64_t blocks = (p.K + block - 1) / block;
  const int64_t groups = block_gemm_groups(blocks, p.M, p.N);
  const int64_t bp4 = round_up(block, 4);
  const int nt = team_size(groups, static_cast<double>(p.M) * static_cast<double>(p.N) *
                                       static_cast<double>(p.K));
#if QT_X86_DISPATCH
  const BlockTermFn term =
      isa::select<BlockTermFn>(block_term_default, block_term_avx2, block_term_avx512);
#else
  const BlockTermFn term = block_term_default;
#endif
  struct BlockScratch {
    Scratch packed;
    std::vector<int32_t> c32, corr;
  };
  // allocated (and zeroed) here: nothing may throw inside the parallel region, and a group
  // no thread reaches would stay zero (OpenMP may start fewer threads than asked)
  std::vector<float> partial(static_cast<size_t>(groups * Mr * Np), 0.0f);
  std::vector<BlockScratch> scratch(static_cast<size_t>(nt));
  for (BlockScratch& sc : scratch) {
    sc.c32.assign(static_cast<size_t>(Mr * Np), 0);
    sc.corr.assign(static_cast<size_t>(Np), 0);
    sc.packed.cs.assign(static_cast<size_t>(F::kNR), 0);
    reserve_packing<F>(p, sc.packed, bp4, Mr, Np);
  }
  run_team(nt, [&](int t, int T) {
    BlockScratch& sc = scratch[static_cast<size_t>(t)];
    for (int64_t g = t; g < groups; g += T) {
      float* cf = partial.data() + g * Mr * Np;
      for (int64_t blk = blocks * g / groups; blk < blocks * (g + 1) / groups; ++blk) {
        const int64_t k0 = blk * block;
        tiles_of_k_slice<F, false>(
            p, k0, std::min(block, p.K - k0), Mr, panels, sc.packed,
            [&](TileArgs& ta, int64_t n0, int nc, const int8_t* packed, int64_t kcp) {
              ta.ldc = Np;
              ta.ncols = nc;
              ta.scale = 1.0f;
              ta.corr = sc.corr.data() + n0;
#if QT_X86_DISPATCH
              if (packed != nullptr) {
                std::fill(sc.packed.cs.begin(), sc.packed.cs.end(), 0);
                colsum_vnni(packed, kcp / 4, sc.packed.cs.data());
                for (int c = 0; c < F::kNR; ++c) {  // mod 2^32, as the tiles' int32 sums wrap
                  sc.corr[n0 + c] =
                      static_cast<int32_t>(static_cast<uint32_t>(128 * sc.packed.cs[c]));
                }
              }
#else
              (void)packed, (void)kcp;
#endif
            },
            [&](TileArgs& ta, int64_t m0, int64_t n0) { ta.c32 = sc.c32.data() + m0 * Np + n0; });
        term(sc.c32.data(), cf, sa + blk * p.M, sb + blk * p.N, p.M, p.N, Np);
      }
    }
  });
  for (int64_t m = 0; m < p.M; ++m) {
    for (int64_t n = 0; n < p.N; ++n) {
      float v = partial[static_cast<size_t>(m * Np + n)];
      for (int64_t g = 1; g < groups; ++g) {
        v = v + partial[static_cast<size_t>((g * Mr + m) * Np + n)];
      }
      p.out[m * p.N + n] = v;
    }
  }
}

// "tn" strategy: QTRAIN_GEMM_TN=split|rows forces one (tests and benchmarks), else auto.
int tn_strategy() {
  const char* env = std::getenv("QTRAIN_GEMM_TN");
  if (env == nullptr) return 0;
  if (std::strcmp(env, "split") == 0) return 1;
  if (std::strcmp(env, "rows") == 0) return 2;
  return 0;
}

template <class F>
void gemm_family(const Problem& p) {
  if (p.layout == 'T') {
    // Split K when the output is small next to the inner dimension (the dW product).
    const int64_t Mr = round_up(p.M, kMR);
    const int64_t Np = round_up(p.N, F::kNR);
    const int64_t threads = std::max(1, at::get_num_threads());
    const bool small_out = Mr * Np * 8 * threads <= (int64_t{64} << 20);
    const int64_t blocks = Mr / kMR;
    const int forced = tn_strategy();
    if (forced == 1 || (forced == 0 && small_out && (p.K >= 4096 || blocks < 2 * threads))) {
      gemm_split_k<F>(p, Mr, Np);
      return;
    }
  }
  gemm_rows<F>(p);
}

// Runs p on the family of the ISA in use.
void run_problem(const Problem& p) {
#if QT_X86_DISPATCH
  switch (isa::variant()) {
    case isa::kAvx512Vnni:
      gemm_family<Vnni>(p);
      return;
    case isa::kAvx512:
      gemm_family<Avx512>(p);
      return;
    case isa::kAvx2:
      gemm_family<Avx2>(p);
      return;
    default:
      break;
  }
#endif
  gemm_family<Portable>(p);
}

// The problem of stored operands qa, qb (contiguous) in `layout`.
Problem problem_of(const at::Tensor& qa, const at::Tensor& qb, c10::string_view layout) {
  Problem p{};
  p.layout = layout == "nn" ? 'n' : layout == "nt" ? 't' : 'T';
  p.M = p.layout == 'T' ? qa.size(1) : qa.size(0);
  p.K = p.layout == 'T' ? qa.size(0) : qa.size(1);
  p.N = p.layout == 't' ? qb.size(0) : qb.size(1);
  p.a = qa.const_data_ptr<int8_t>();
  p.b = qb.const_data_ptr<int8_t>();
  return p;
}

}  // namespace

// ---------------------------------------------------------------- op

namespace cpu {

void int8_gemm_out(const at::Tensor& qa_in, const at::Tensor& qb_in, double scale,
                   c10::string_view layout, const std::optional<at::Tensor>& bias_in,
                   const at::Tensor& out, const std::optional<at::Tensor>& row_scale_in,
                   const std::optional<at::Tensor>& col_scale_in) {
  at::Tensor bias, row_scale, col_scale;
  if (bias_in.has_value() && bias_in->defined()) bias = bias_in->to(at::kFloat).contiguous();
  // float32 [M] / [N] on the CPU, as the front checked
  if (row_scale_in.has_value() && row_scale_in->defined()) row_scale = row_scale_in->contiguous();
  if (col_scale_in.has_value() && col_scale_in->defined()) col_scale = col_scale_in->contiguous();
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  Problem p = problem_of(qa, qb, layout);
  TORCH_INTERNAL_ASSERT(out.scalar_type() == at::kFloat && out.is_contiguous() &&
                        out.dim() == 2 && out.size(0) == p.M && out.size(1) == p.N);
  if (p.M == 0 || p.N == 0) return;
  p.scale = static_cast<float>(scale);
  p.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  p.row_scale = row_scale.defined() ? row_scale.const_data_ptr<float>() : nullptr;
  p.col_scale = col_scale.defined() ? col_scale.const_data_ptr<float>() : nullptr;
  p.out = out.mutable_data_ptr<float>();
  run_problem(p);
}

void int8_gemm_int32_out(const at::Tensor& qa_in, const at::Tensor& qb_in,
                         c10::string_view layout, const at::Tensor& out) {
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  Problem p = problem_of(qa, qb, layout);
  TORCH_INTERNAL_ASSERT(out.scalar_type() == at::kInt && out.is_contiguous() && out.dim() == 2 &&
                        out.size(0) == p.M && out.size(1) == p.N);
  if (p.M == 0 || p.N == 0) return;
  p.scale = 1.0f;
  p.out32 = out.mutable_data_ptr<int32_t>();
  run_problem(p);
}

void int8_block_gemm_out(const at::Tensor& qa_in, const at::Tensor& qb_in,
                         const at::Tensor& scale_a_in, const at::Tensor& scale_b_in,
                         int64_t block, const at::Tensor& out) {
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  const at::Tensor sa = scale_a_in.contiguous();
  const at::Tensor sb = scale_b_in.contiguous();
  Problem p{};  // the widths are the scales' (an operand may be packed, uint8)
  p.layout = 'T';
  p.K = qa.size(0);
  p.M = sa.size(1);
  p.N = sb.size(1);
  p.a = static_cast<const int8_t*>(qa.const_data_ptr());
  p.b = static_cast<const int8_t*>(qb.const_data_ptr());
  p.a_packed = qa.scalar_type() == at::kByte;
  p.b_packed = qb.scalar_type() == at::kByte;
  TORCH_INTERNAL_ASSERT(out.scalar_type() == at::kFloat && out.is_contiguous() &&
                        out.dim() == 2 && out.size(0) == p.M && out.size(1) == p.N);
  if (p.M == 0 || p.N == 0) return;
  if (p.K == 0) {
    out.zero_();
    return;
  }
  p.out = out.mutable_data_ptr<float>();
  const float* a = sa.const_data_ptr<float>();
  const float* b = sb.const_data_ptr<float>();
#if QT_X86_DISPATCH
  switch (isa::variant()) {
    case isa::kAvx512Vnni:
      gemm_tn_blocks<Vnni>(p, block, a, b);
      return;
    case isa::kAvx512:
      gemm_tn_blocks<Avx512>(p, block, a, b);
      return;
    case isa::kAvx2:
      gemm_tn_blocks<Avx2>(p, block, a, b);
      return;
    default:
      break;
  }
#endif
  gemm_tn_blocks<Portable>(p, block, a, b);
}

at::Tensor int8_gemm(const at::Tensor& qa, const at::Tensor& qb, double scale,
                     c10::string_view layout, const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& row_scale,
                     const std::optional<at::Tensor>& col_scale) {
  const char lay = layout == "nn" ? 'n' : layout == "nt" ? 't' : 'T';
  const int64_t M = lay == 'T' ? qa.size(1) : qa.size(0);
  const int64_t N = lay == 't' ? qb.size(0) : qb.size(1);
  at::Tensor out = at::empty({M, N}, qa.options().dtype(at::kFloat));
  advise_huge_pages(out.mutable_data_ptr<float>(), static_cast<size_t>(M * N) * sizeof(float));
  int8_gemm_out(qa, qb, scale, layout, bias, out, row_scale, col_scale);
  return out;
}

}  // namespace cpu
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("int8_gemm", &qtrain::cpu::int8_gemm); }
