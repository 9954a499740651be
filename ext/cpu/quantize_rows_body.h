// The row loop of quantize_symmetric_rows (int8 rows, quantize_symmetric_rows_kernel.cpp)
// and quantize_symmetric_rows4 (rows of 4-bit values packed two per byte,
// quantize_symmetric_rows4_kernel.cpp): each row's absmax, then its values by
// quantize_symmetric's own bodies (cpu/quantize_bodies.h), so both ops give the same values
// and the packed one is pack_int4 of the other bit for bit. The packed form quantizes a row
// into a buffer of the caller's (in cache) and packs it from there, so the int8 row never
// reaches memory. See quantize_symmetric_rows_kernel.cpp for the rule.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/rng.h"
#include "cpu/int4.h"
#include "cpu/isa.h"
#include "cpu/quantize_bodies.h"
#include "cpu/ranges.h"
#include "cpu/threads.h"

namespace qtrain {
namespace cpu {

// Rows [r0, r1) of x [.., cols] into out and scale: int8 rows of cols bytes, or (PACKED)
// rows of (cols + 1) / 2 bytes, each quantized into buf (cols bytes) first. Returns the
// largest row absmax as a bit pattern: >= 0x7f800000 means a NaN / Inf, and such a row is
// left unquantized (the caller refuses x after the parallel region).
template <bool STOCH, bool PACKED>
QT_ALWAYS_INLINE uint32_t quantize_rows_body(const float* __restrict x, void* __restrict out,
                                             float* __restrict scale, int64_t r0, int64_t r1,
                                             int64_t cols, int32_t qmax, rng::Keys keys,
                                             uint64_t offset, int8_t* __restrict buf) {
  const float qf = static_cast<float>(qmax);
  const int64_t row_bytes = PACKED ? (cols + 1) / 2 : cols;
  uint32_t worst = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols;
    int8_t* dst = static_cast<int8_t*>(out) + r * row_bytes;
    int8_t* qr = PACKED ? buf : dst;
    const uint32_t mbits = absmax_bits_body(xr, cols);
    worst = mbits > worst ? mbits : worst;
    if (mbits >= 0x7f800000u) continue;  // NaN / Inf: refused by the caller
    float absmax;
    std::memcpy(&absmax, &mbits, sizeof absmax);
    scale[r] = absmax / qf;
    if (mbits == 0u) {  // inv = 0: every value rounds to 0 (the row is finite)
      std::memset(dst, 0, static_cast<size_t>(row_bytes));
      continue;
    }
    const ScaleParams p = scale_params(absmax, qmax);
    if constexpr (!STOCH) {
      nearest_body(xr, qr, cols, p.pre, p.inv, qmax);
    } else {
      // counters offset + r * cols + j, split where their high word changes
      uint64_t c = offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols);
      for (int64_t j = 0; j < cols;) {
        const auto lo = static_cast<uint32_t>(c);
        const auto hi = static_cast<uint32_t>(c >> 32);
        const int64_t len =
            std::min<int64_t>(cols - j, static_cast<int64_t>((uint64_t{1} << 32) - lo));
        stochastic_body(xr + j, qr + j, len, p.pre, p.inv, qmax, lo, keys.k1,
                        rng::block_key(keys, hi));
        j += len;
        c += static_cast<uint64_t>(len);
      }
    }
    if constexpr (PACKED) int4::pack_row(qr, cols, reinterpret_cast<uint8_t*>(dst));
  }
  return worst;
}

// quantize_rows_body of one rounding, packing or not, inside an ISA variant.
using RowsFn = uint32_t (*)(const float*, void*, float*, int64_t, int64_t, int64_t, int32_t,
                            rng::Keys, uint64_t, int8_t*);

struct RowKernels {
  RowsFn nearest;
  RowsFn stochastic;
};

// Defines the two roundings' row loops inside ISA variant NAME (its target attribute ATTR),
// writing int8 or PACKED rows, and their table row_kernels_NAME (QT_SELECT_VARIANT).
#define QT_DEFINE_ROWS_VARIANT(NAME, ATTR, PACKED)                                            \
  ATTR uint32_t nearest_rows_##NAME(const float* x, void* out, float* scale, int64_t r0,      \
                                    int64_t r1, int64_t cols, int32_t qmax, rng::Keys keys,   \
                                    uint64_t offset, int8_t* buf) {                           \
    return cpu::quantize_rows_body<false, PACKED>(x, out, scale, r0, r1, cols, qmax, keys,   \
                                                  offset, buf);                              \
  }                                                                                           \
  ATTR uint32_t stochastic_rows_##NAME(const float* x, void* out, float* scale, int64_t r0,   \
                                       int64_t r1, int64_t cols, int32_t qmax,                \
                                       rng::Keys keys, uint64_t offset, int8_t* buf) {        \
    return cpu::quantize_rows_body<true, PACKED>(x, out, scale, r0, r1, cols, qmax, keys,    \
                                                 offset, buf);                               \
  }                                                                                           \
  const cpu::RowKernels row_kernels_##NAME = {nearest_rows_##NAME, stochastic_rows_##NAME};

// Runs `body` over the rows of x [rows, cols] (contiguous float32, rows * cols > 0) into out
// and scale, one contiguous chunk of rows per thread of a team sized for the element count
// (with a row buffer each where `buffered`: the packed form); refuses NaN / Inf as op fn.
inline void run_rows(const char* fn, RowsFn body, const float* x, void* out, float* scale,
                     int64_t rows, int64_t cols, int64_t bits, int64_t seed, int64_t offset,
                     bool buffered) {
  const int32_t qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  const int nt = static_cast<int>(std::min<int64_t>(plan_threads(rows * cols, ranges::kGrain), rows));
  std::vector<uint32_t> worst(static_cast<size_t>(nt), 0u);
  for_team_ranges(nt, rows, [&](int t, int64_t r0, int64_t r1) {
    std::vector<int8_t> buf(buffered ? static_cast<size_t>(cols) : 0);
    worst[static_cast<size_t>(t)] = body(x, out, scale, r0, r1, cols, qmax, keys, off, buf.data());
  });
  const uint32_t m = *std::max_element(worst.begin(), worst.end());
  TORCH_CHECK_VALUE(m < 0x7f800000u, fn,
                    ": x contains NaN or Inf; quantization needs finite values");
}

}  // namespace cpu
}  // namespace qtrain
