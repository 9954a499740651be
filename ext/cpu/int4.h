// Packing 4-bit values two per byte on the CPU (pack_int4, quantize_symmetric_rows4): value
// j of a row in byte j / 2, the low nibble for an even j, 4-bit two's complement; an odd
// row's last byte has a high nibble of 0 (qtrain/quant/packed.py pack_int4).
#pragma once

#include <cstdint>

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

}  // namespace int4
}  // namespace qtrain
