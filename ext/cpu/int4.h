// 4-bit values packed two per byte on the CPU (pack_int4, quantize_symmetric_rows4,
// unpack_int4, int8_block_gemm's packed operands): value j of a row in byte j / 2, the low
// nibble for an even j, 4-bit two's complement; an odd row's last byte has a high nibble of
// 0 when packed here, and unpacking never reads it (qtrain/quant/packed.py pack_int4).
#pragma once

#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace qtrain {
namespace int4 {

// Packs one row of d values into (d + 1) / 2 bytes; whether every value was in [-8, 7].
inline bool pack_row(const int8_t* q, int64_t d, uint8_t* out) {
  uint8_t bad = 0;
  const int64_t pairs = d / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    const uint8_t lo = static_cast<uint8_t>(q[2 * i]), hi = static_cast<uint8_t>(q[2 * i + 1]);
    bad |= static_cast<uint8_t>(lo + 8) | static_cast<uint8_t>(hi + 8);  // > 15: out of range
    out[i] = static_cast<uint8_t>((lo & 0xF) | (hi << 4));
  }
  if (d % 2 != 0) {
    const uint8_t lo = static_cast<uint8_t>(q[d - 1]);
    bad |= static_cast<uint8_t>(lo + 8);
    out[pairs] = lo & 0xF;
  }
  return (bad & 0xF0) == 0;
}

// The 4-bit two's-complement values of byte b: (low, high).
inline int8_t low_nibble(uint8_t b) {
  return static_cast<int8_t>(static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4);
}
inline int8_t high_nibble(uint8_t b) { return static_cast<int8_t>(static_cast<int8_t>(b) >> 4); }

// Unpacks one row of d values from (d + 1) / 2 bytes into int8, 32 values at a time where
// SSE2 is there (each nibble sign-extended as (v ^ 8) - 8).
inline void unpack_row(const uint8_t* p, int64_t d, int8_t* out) {
  const int64_t pairs = d / 2;
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (; i + 16 <= pairs; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const __m128i lo = _mm_sub_epi8(_mm_xor_si128(_mm_and_si128(v, low4), eight), eight);
    const __m128i hi =
        _mm_sub_epi8(_mm_xor_si128(_mm_and_si128(_mm_srli_epi16(v, 4), low4), eight), eight);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
  }
#endif
  for (; i < pairs; ++i) {
    out[2 * i] = low_nibble(p[i]);
    out[2 * i + 1] = high_nibble(p[i]);
  }
  if (d % 2 != 0) out[d - 1] = low_nibble(p[pairs]);
}

}  // namespace int4
}  // namespace qtrain
