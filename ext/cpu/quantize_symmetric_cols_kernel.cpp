// quantize_symmetric_cols on the CPU (front: ops/quantize_symmetric_cols.cpp; reference
// qtrain/quant/granular.py quantize_cols_symmetric), and cpu::quantize_cols
// (common/quantize_cols.h), which quantize_symmetric_cols4's CPU kernel
// (quantize_symmetric_cols4_kernel.cpp) calls.
//
// Column j of x [rows, cols] is quantize_symmetric's rule (cpu/quantize_symmetric_kernel.cpp)
// applied to that column alone, with the counters offset + i * cols + j; q stays in x's
// layout:
//
//   absmax_j = max_i |x[i, j]|   (an integer max over the bit patterns: exact, order-free,
//                                 and it flags NaN / Inf, which compare above every finite
//                                 value)
//   qmax = 2^(bits-1) - 1, pre_j, inv_j = 1, fl32(qmax / absmax_j)   (2^64 pre-scaling where
//                                 that overflows, inv = 0 for absmax_j == 0)
//   nearest:    q = clamp(rint(fl32(fl32(x * pre_j) * inv_j)), -qmax, qmax)   (ties to even)
//   stochastic: q = clamp(floor(fl32(fl32(fl32(x * pre_j) * inv_j) + u)), -qmax, qmax)
//   scale_j = fl32(absmax_j / qmax)
//
// Two passes over x in its own layout, the rows split into contiguous chunks, one per
// thread of a team sized for the element count:
//   1. each thread reduces its rows into its own [cols] partial absmax (bit patterns, a
//      vector max along the row); the partials are combined after the parallel region,
//      where a NaN / Inf refuses x, and each column's pre / inv / scale is derived with
//      cpu::scale_params (cpu/quantize_bodies.h), as quantize_symmetric does;
//   2. each thread quantizes its rows elementwise with the per-column pre / inv, loaded as
//      vectors alongside the row.
// block > 0 (one scale per block of rows of each column): quantize_col_blocks below.
// Every element depends only on its value, its column's absmax and its counter, so the
// result is the same for any thread count and ISA variant. The loop bodies are
// cpu/quantize_bodies.h's *_cols ones; one call per chunk of rows runs them inside the ISA
// variant, so the inner loops vectorize there. quantize_symmetric_cols4 (PACKED) runs the
// same bodies kPackRows rows at a time into a per-thread buffer and packs those rows two
// values a byte while they are in cache (cpu/int4.h): the int8 values are never written out.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/quantize_cols.h"
#include "common/rng.h"
#include "cpu/int4.h"
#include "cpu/isa.h"
#include "cpu/mem.h"
#include "cpu/quantize_bodies.h"
#include "cpu/ranges.h"
#include "cpu/threads.h"

namespace qtrain {
namespace {

// ---------------------------------------------------------------- kernel bodies

// Pass 1: m[j] = max(m[j], max over rows [r0, r1) of |x[r, j]| as bit patterns).
QT_ALWAYS_INLINE void absmax_body(const float* __restrict x, uint32_t* __restrict m, int64_t r0,
                                  int64_t r1, int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) cpu::absmax_bits_cols_body(x + r * cols, m, cols);
}

// Pass 2: rows [r0, r1) of x [.., cols] into q (row r at q + (r - r0) * cols) with each
// column's pre / inv.
template <bool STOCH>
QT_ALWAYS_INLINE void quantize_body(const float* __restrict x, int8_t* __restrict q,
                                    const float* __restrict pre, const float* __restrict inv,
                                    int64_t r0, int64_t r1, int64_t cols, int32_t qmax,
                                    rng::Keys keys, uint64_t offset) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols;
    int8_t* qr = q + (r - r0) * cols;
    if constexpr (!STOCH) {
      cpu::nearest_cols_body(xr, qr, cols, pre, inv, qmax);
    } else {
      // counters offset + r * cols + j, split where their high word changes
      uint64_t c = offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols);
      for (int64_t j = 0; j < cols;) {
        const auto lo = static_cast<uint32_t>(c);
        const auto hi = static_cast<uint32_t>(c >> 32);
        const int64_t len =
            std::min<int64_t>(cols - j, static_cast<int64_t>((uint64_t{1} << 32) - lo));
        cpu::stochastic_cols_body(xr + j, qr + j, len, pre + j, inv + j, qmax, lo, keys.k1,
                                  rng::block_key(keys, hi));
        j += len;
        c += static_cast<uint64_t>(len);
      }
    }
  }
}

// ---------------------------------------------------------------- ISA variants

using AbsmaxFn = void (*)(const float*, uint32_t*, int64_t, int64_t, int64_t);
using QuantizeFn = void (*)(const float*, int8_t*, const float*, const float*, int64_t, int64_t,
                            int64_t, int32_t, rng::Keys, uint64_t);

struct Kernels {
  AbsmaxFn absmax;
  QuantizeFn nearest;
  QuantizeFn stochastic;
};

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                         \
  ATTR void absmax_cols_##NAME(const float* x, uint32_t* m, int64_t r0, int64_t r1,           \
                               int64_t cols) {                                                \
    absmax_body(x, m, r0, r1, cols);                                                          \
  }                                                                                           \
  ATTR void nearest_cols_##NAME(const float* x, int8_t* q, const float* pre, const float* inv, \
                                int64_t r0, int64_t r1, int64_t cols, int32_t qmax,           \
                                rng::Keys keys, uint64_t offset) {                            \
    quantize_body<false>(x, q, pre, inv, r0, r1, cols, qmax, keys, offset);                   \
  }                                                                                           \
  ATTR void stochastic_cols_##NAME(const float* x, int8_t* q, const float* pre,               \
                                   const float* inv, int64_t r0, int64_t r1, int64_t cols,    \
                                   int32_t qmax, rng::Keys keys, uint64_t offset) {           \
    quantize_body<true>(x, q, pre, inv, r0, r1, cols, qmax, keys, offset);                    \
  }                                                                                           \
  const Kernels kernels_##NAME = {absmax_cols_##NAME, nearest_cols_##NAME,                    \
                                  stochastic_cols_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- op

constexpr int64_t kPackRows = 16;  // rows quantized into the buffer before they are packed

// Rows [r0, r1) of x quantized by `body`: into q (int8 [rows, cols]), or PACKED into out
// (uint8 [rows, ceil(cols / 2)]) through `buf` (kPackRows * cols int8, the thread's own).
template <bool PACKED>
void quantize_rows(QuantizeFn body, const float* x, void* out, int8_t* buf, const float* pre,
                   const float* inv, int64_t r0, int64_t r1, int64_t cols, int32_t qmax,
                   rng::Keys keys, uint64_t offset) {
  if constexpr (!PACKED) {
    (void)buf;
    body(x, static_cast<int8_t*>(out) + r0 * cols, pre, inv, r0, r1, cols, qmax, keys, offset);
  } else {
    const int64_t bytes = (cols + 1) / 2;
    for (int64_t r = r0; r < r1; r += kPackRows) {
      const int64_t end = std::min(r1, r + kPackRows);
      body(x, buf, pre, inv, r, end, cols, qmax, keys, offset);
      for (int64_t i = r; i < end; ++i) {  // |q| <= qmax <= 7: every value fits a nibble
        int4::pack_row(buf + (i - r) * cols, cols, static_cast<uint8_t*>(out) + i * bytes);
      }
    }
  }
}

// The per-thread buffers of the PACKED rows (none otherwise).
template <bool PACKED>
std::vector<int8_t> pack_buffers(int nt, int64_t cols) {
  return std::vector<int8_t>(PACKED ? static_cast<size_t>(nt * kPackRows * cols) : 0);
}

// Per-column pre / inv / scale of one absmax vector (bit patterns): quantize_symmetric's rule,
// inv = 0 for a column of zeros.
void column_params(const uint32_t* m, int64_t cols, int32_t qmax, float* scale, float* pre,
                   float* inv) {
  const float qf = static_cast<float>(qmax);
  for (int64_t j = 0; j < cols; ++j) {
    float absmax;
    std::memcpy(&absmax, m + j, sizeof absmax);
    scale[j] = absmax / qf;
    if (m[j] == 0u) {
      pre[j] = 1.0f;
      inv[j] = 0.0f;
    } else {
      const cpu::ScaleParams sc = cpu::scale_params(absmax, qmax);
      pre[j] = sc.pre;
      inv[j] = sc.inv;
    }
  }
}

// block > 0: the blocks of rows split across threads, each block reduced and quantized in
// turn while its rows are in cache (every element still depends only on its value, its
// block's absmax and its counter: any thread count, any ISA, the same result).
template <bool PACKED>
std::tuple<at::Tensor, at::Tensor> quantize_col_blocks(const at::Tensor& x, int64_t bits,
                                                       bool stochastic, int64_t seed,
                                                       int64_t offset, int64_t block) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t n = rows * cols;
  const int64_t blocks = (rows + block - 1) / block;
  at::Tensor q = col_quantizer::output<PACKED>(x);
  at::Tensor scale = at::zeros({blocks, cols}, x.options());
  if (n == 0) return {q, scale};
  const float* xp = x.const_data_ptr<float>();
  void* qp = q.mutable_data_ptr();
  float* sp = scale.mutable_data_ptr<float>();
  const Kernels& k = kernels();
  const int nt = static_cast<int>(std::min<int64_t>(plan_threads(n, ranges::kGrain), blocks));
  const auto ucols = static_cast<size_t>(cols);
  const int32_t qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  const QuantizeFn body = stochastic ? k.stochastic : k.nearest;
  // per-thread buffers, allocated here: nothing may throw inside the parallel region
  std::vector<uint32_t> absmax(static_cast<size_t>(nt) * ucols);
  std::vector<float> pre(static_cast<size_t>(nt) * ucols), inv(static_cast<size_t>(nt) * ucols);
  std::vector<char> bad(static_cast<size_t>(nt), 0);
  std::vector<int8_t> buffers = pack_buffers<PACKED>(nt, cols);
  advise_huge_pages(qp, static_cast<size_t>(q.nbytes()));
  for_team_ranges(nt, blocks, [&](int t, int64_t b0, int64_t b1) {
    int8_t* buf = PACKED ? buffers.data() + static_cast<size_t>(t * kPackRows) * ucols : nullptr;
    uint32_t* m = absmax.data() + static_cast<size_t>(t) * ucols;
    float* pr = pre.data() + static_cast<size_t>(t) * ucols;
    float* iv = inv.data() + static_cast<size_t>(t) * ucols;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
      std::fill(m, m + cols, 0u);
      k.absmax(xp, m, r0, r1, cols);
      if (*std::max_element(m, m + cols) >= 0x7f800000u) {
        bad[static_cast<size_t>(t)] = 1;  // NaN / Inf: refused after the region
        return;
      }
      column_params(m, cols, qmax, sp + b * cols, pr, iv);
      quantize_rows<PACKED>(body, xp, qp, buf, pr, iv, r0, r1, cols, qmax, keys, off);
    }
  });
  TORCH_CHECK_VALUE(std::find(bad.begin(), bad.end(), 1) == bad.end(),
                    col_quantizer::op_name<PACKED>(),
                    ": x contains NaN or Inf; quantization needs finite values");
  return {q, scale};
}

template <bool PACKED>
std::tuple<at::Tensor, at::Tensor> quantize_symmetric_cols(const at::Tensor& x_in, int64_t bits,
                                                           bool stochastic, int64_t seed,
                                                           int64_t offset, int64_t block) {
  const at::Tensor x = x_in.contiguous();
  if (block > 0) return quantize_col_blocks<PACKED>(x, bits, stochastic, seed, offset, block);
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t n = rows * cols;
  at::Tensor q = col_quantizer::output<PACKED>(x);
  if (n == 0) return {q, at::zeros({1, cols}, x.options())};  // no rows: range 0
  at::Tensor scale = at::empty({1, cols}, x.options());

  const float* xp = x.const_data_ptr<float>();
  void* qp = q.mutable_data_ptr();
  float* sp = scale.mutable_data_ptr<float>();
  const Kernels& k = kernels();
  const int nt = static_cast<int>(std::min<int64_t>(plan_threads(n, ranges::kGrain), rows));
  const auto ucols = static_cast<size_t>(cols);

  // pass 1: a [cols] partial absmax per thread (allocated here: nothing may throw inside the
  // parallel region, and a thread OpenMP does not start leaves a zero partial)
  std::vector<uint32_t> partial(static_cast<size_t>(nt) * ucols, 0u);
  for_team_ranges(nt, rows, [&](int t, int64_t r0, int64_t r1) {
    k.absmax(xp, partial.data() + static_cast<size_t>(t) * ucols, r0, r1, cols);
  });
  uint32_t* m = partial.data();  // the combined absmax, in thread 0's partial
  for (int t = 1; t < nt; ++t) {
    const uint32_t* p = partial.data() + static_cast<size_t>(t) * ucols;
    for (size_t j = 0; j < ucols; ++j) m[j] = p[j] > m[j] ? p[j] : m[j];
  }
  const uint32_t worst = *std::max_element(m, m + cols);
  TORCH_CHECK_VALUE(worst < 0x7f800000u, col_quantizer::op_name<PACKED>(),
                    ": x contains NaN or Inf; quantization needs finite values");

  // per-column pre / inv / scale: quantize_symmetric's rule (inv = 0 for a column of zeros)
  const int32_t qmax = (1 << (bits - 1)) - 1;
  std::vector<float> pre(ucols), inv(ucols);
  column_params(m, cols, qmax, sp, pre.data(), inv.data());

  // pass 2: quantize in x's layout
  advise_huge_pages(qp, static_cast<size_t>(q.nbytes()));
  std::vector<int8_t> buffers = pack_buffers<PACKED>(nt, cols);
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  const QuantizeFn body = stochastic ? k.stochastic : k.nearest;
  const float* prep = pre.data();
  const float* invp = inv.data();
  for_team_ranges(nt, rows, [&](int t, int64_t r0, int64_t r1) {
    int8_t* buf = PACKED ? buffers.data() + static_cast<size_t>(t * kPackRows) * ucols : nullptr;
    quantize_rows<PACKED>(body, xp, qp, buf, prep, invp, r0, r1, cols, qmax, keys, off);
  });
  return {q, scale};
}

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_cols_int8(const at::Tensor& x,
                                                                int64_t bits, bool stochastic,
                                                                int64_t seed, int64_t offset,
                                                                int64_t block) {
  return quantize_symmetric_cols<false>(x, bits, stochastic, seed, offset, block);
}

}  // namespace

namespace cpu {

std::tuple<at::Tensor, at::Tensor> quantize_cols(const at::Tensor& x, int64_t bits,
                                                 bool stochastic, int64_t seed, int64_t offset,
                                                 int64_t block, bool packed) {
  return packed ? quantize_symmetric_cols<true>(x, bits, stochastic, seed, offset, block)
                : quantize_symmetric_cols<false>(x, bits, stochastic, seed, offset, block);
}

}  // namespace cpu
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_symmetric_cols", &qtrain::quantize_symmetric_cols_int8);
}
