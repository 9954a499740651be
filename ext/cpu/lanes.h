// Helpers shared by the sparse CPU kernels (qspmm_kernel.cpp, qsddmm_kernel.cpp).
//
// The vector types are GCC/Clang generic vectors: one source, which each ISA
// wrapper (QT_TARGET_AVX512 / QT_TARGET_AVX2 / none) lowers to its own
// registers (one zmm, two ymm or four xmm per 16 lanes). They only do exact
// integer adds and the same IEEE float32 multiplies/adds as the scalar code,
// so every variant gives the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/isa.h"

#if QT_X86_DISPATCH
#include <immintrin.h>
#endif

// On an ISA wrapper: inline every call below it (see Lanes).
#define QT_FLATTEN __attribute__((flatten))

namespace qtrain {
namespace sparse {

// Lanes<ISA>: W int32 / float32 lanes per vector register of that ISA (4 for
// SSE2, 8 for AVX2, 16 for AVX-512) as GCC generic vectors, and load(p): W
// int8 lanes at p (unaligned) sign-extended to int32 (load_int4(p): W 4-bit values
// packed two per byte, qspmm4's rows). The bodies are templates
// on the ISA and written once against these; load is the one per-ISA piece
// (GCC 12 lowers a direct int8 -> int32 __builtin_convertvector to scalar
// code, so the x86 variants use the sign-extending load vpmovsxbd). The x86
// loads carry their target attribute, so they cannot be always_inline into the
// attribute-less bodies; the ISA wrappers are QT_FLATTEN instead, which
// inlines the whole call tree into each wrapper, so no vector crosses a call.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef int32_t v4i32 __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));

template <int ISA>
struct Lanes {
  static constexpr int W = 4;
  typedef int32_t vi __attribute__((vector_size(16)));
  typedef float vf __attribute__((vector_size(16)));
  static QT_ALWAYS_INLINE vi load(const int8_t* p) {
    typedef int8_t v4i8 __attribute__((vector_size(4)));
    typedef int16_t v4i16 __attribute__((vector_size(8)));
    v4i8 x;
    std::memcpy(&x, p, sizeof x);
    return __builtin_convertvector(__builtin_convertvector(x, v4i16), vi);
  }
  // 4 int8 lanes at p widened to int32 (narrow rows: GAT's per-head scalars).
  static QT_ALWAYS_INLINE v4i32 load4(const int8_t* p) { return load(p); }
  // W 4-bit two's-complement values packed two per byte at p (W / 2 bytes: value 2i in
  // byte i's low nibble, 2i + 1 in its high nibble), sign-extended to int32 in value order.
  static QT_ALWAYS_INLINE vi load_int4(const uint8_t* p) {
    const uint32_t b0 = p[0], b1 = p[1];
    const vi x = {static_cast<int32_t>(b0 << 28), static_cast<int32_t>(b0 << 24),
                  static_cast<int32_t>(b1 << 28), static_cast<int32_t>(b1 << 24)};
    return x >> 28;
  }
};
#if QT_X86_DISPATCH
template <>
struct Lanes<isa::kAvx2> {
  static constexpr int W = 8;
  typedef int32_t vi __attribute__((vector_size(32)));
  typedef float vf __attribute__((vector_size(32)));
  QT_TARGET_AVX2 static inline vi load(const int8_t* p) {
    return reinterpret_cast<vi>(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  QT_TARGET_AVX2 static inline v4i32 load4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return reinterpret_cast<v4i32>(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(v)));
  }
  // 4 bytes -> 8 values: the bytes interleaved with themselves shifted left by 4 (the low
  // nibble on top; a 16-bit shift, whose carry lands in the low nibble that the final
  // shift drops), sign-extended, then an arithmetic shift right by 4.
  QT_TARGET_AVX2 static inline vi load_int4(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    const __m128i x = _mm_cvtsi32_si128(v);
    const __m128i pairs = _mm_unpacklo_epi8(_mm_slli_epi16(x, 4), x);
    return reinterpret_cast<vi>(_mm256_srai_epi32(_mm256_cvtepi8_epi32(pairs), 4));
  }
};
template <>
struct Lanes<isa::kAvx512> {
  static constexpr int W = 16;
  typedef int32_t vi __attribute__((vector_size(64)));
  typedef float vf __attribute__((vector_size(64)));
  QT_TARGET_AVX512 static inline vi load(const int8_t* p) {
    return reinterpret_cast<vi>(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  QT_TARGET_AVX512 static inline v4i32 load4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return reinterpret_cast<v4i32>(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(v)));
  }
  // 8 bytes -> 16 values, as Lanes<kAvx2>::load_int4.
  QT_TARGET_AVX512 static inline vi load_int4(const uint8_t* p) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i pairs = _mm_unpacklo_epi8(_mm_slli_epi16(x, 4), x);
    return reinterpret_cast<vi>(_mm512_srai_epi32(_mm512_cvtepi8_epi32(pairs), 4));
  }
};
#endif

// How a row of values is read by the sparse bodies (spmm_body.h, sddmm_body.h): T its
// bytes, bytes(f) the byte of value f (f even for packed rows), load<ISA>(p) W values from
// p, value(p, t) value t alone.

// int8 rows (qspmm, qsddmm): value f at byte f.
struct Int8Rows {
  using T = int8_t;
  static constexpr bool kNibblePairs = false;  // see Int4Rows
  static constexpr int64_t bytes(int64_t values) { return values; }
  template <int ISA>
  static QT_ALWAYS_INLINE typename Lanes<ISA>::vi load(const T* p) {
    return Lanes<ISA>::load(p);
  }
  static QT_ALWAYS_INLINE int32_t value(const T* p, int64_t t) { return p[t]; }
};

// 4-bit values packed two per byte (qspmm4, qsddmm4): value f in byte f / 2, the low nibble
// for an even f, as 4-bit two's complement. Tiles start at even values (multiples of W).
struct Int4Rows {
  using T = uint8_t;
  // the SpMM reads whole rows W bytes at a time, even and odd values apart (spmm_body.h)
  static constexpr bool kNibblePairs = true;
  static constexpr int64_t bytes(int64_t values) { return values / 2; }
  template <int ISA>
  static QT_ALWAYS_INLINE typename Lanes<ISA>::vi load(const T* p) {
    return Lanes<ISA>::load_int4(p);
  }
  static QT_ALWAYS_INLINE int32_t value(const T* p, int64_t t) {
    const uint32_t b = p[t >> 1];
    return static_cast<int32_t>(b << (28 - 4 * (t & 1))) >> 28;
  }
};
#pragma GCC diagnostic pop

}  // namespace sparse
}  // namespace qtrain
