// quantize_symmetric_rows on the CPU (front: ops/quantize_symmetric_rows.cpp; reference
// qtrain/quant/granular.py quantize_rows_symmetric).
//
// Row i of x [rows, cols] is quantize_symmetric's rule (cpu/quantize_symmetric_kernel.cpp)
// applied to that row alone, with the counters offset + i * cols + j:
//
//   absmax_i = max_j |x[i, j]|   (an integer max over the bit patterns: exact, and it
//                                 flags NaN / Inf, which compare above every finite value)
//   qmax = 2^(bits-1) - 1, pre, inv = 1, fl32(qmax / absmax_i)   (2^64 pre-scaling where
//                                 that overflows, inv = 0 for absmax_i == 0)
//   nearest:    q = clamp(rint(fl32(fl32(x * pre) * inv)), -qmax, qmax)   (ties to even)
//   stochastic: q = clamp(floor(fl32(fl32(fl32(x * pre) * inv) + u)), -qmax, qmax)
//   scale_i = fl32(absmax_i / qmax)
//
// Each row is read twice while it is in cache (absmax, then quantization), serially, by
// one thread; the rows are split into contiguous chunks, one per thread of a team sized
// for the element count. Every row depends only on its values and its counters, so the
// result is the same for any thread count and ISA variant. The loop bodies are
// quantize_symmetric's own (cpu/quantize_bodies.h); one call per chunk of rows runs them
// inside the ISA variant, so the inner loops vectorize there.
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

#include "common/rng.h"
#include "cpu/isa.h"
#include "cpu/mem.h"
#include "cpu/quantize_bodies.h"
#include "cpu/ranges.h"
#include "cpu/threads.h"

namespace qtrain {
namespace {

// ---------------------------------------------------------------- kernel bodies

// Rows [r0, r1) of x [.., cols] into q and scale. Returns the largest row absmax as a bit
// pattern: >= 0x7f800000 means a NaN / Inf, and such a row is left unquantized (the
// caller refuses x after the parallel region).
template <bool STOCH>
QT_ALWAYS_INLINE uint32_t rows_body(const float* __restrict x, int8_t* __restrict q,
                                    float* __restrict scale, int64_t r0, int64_t r1,
                                    int64_t cols, int32_t qmax, rng::Keys keys, uint64_t offset) {
  const float qf = static_cast<float>(qmax);
  uint32_t worst = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols;
    int8_t* qr = q + r * cols;
    const uint32_t mbits = cpu::absmax_bits_body(xr, cols);
    worst = mbits > worst ? mbits : worst;
    if (mbits >= 0x7f800000u) continue;  // NaN / Inf: refused by the caller
    float absmax;
    std::memcpy(&absmax, &mbits, sizeof absmax);
    scale[r] = absmax / qf;
    if (mbits == 0u) {  // inv = 0: every value rounds to 0 (the row is finite)
      std::memset(qr, 0, static_cast<size_t>(cols));
      continue;
    }
    const cpu::ScaleParams p = cpu::scale_params(absmax, qmax);
    if constexpr (!STOCH) {
      cpu::nearest_body(xr, qr, cols, p.pre, p.inv, qmax);
    } else {
      // counters offset + r * cols + j, split where their high word changes
      uint64_t c = offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(cols);
      for (int64_t j = 0; j < cols;) {
        const auto lo = static_cast<uint32_t>(c);
        const auto hi = static_cast<uint32_t>(c >> 32);
        const int64_t len =
            std::min<int64_t>(cols - j, static_cast<int64_t>((uint64_t{1} << 32) - lo));
        cpu::stochastic_body(xr + j, qr + j, len, p.pre, p.inv, qmax, lo, keys.k1,
                             rng::block_key(keys, hi));
        j += len;
        c += static_cast<uint64_t>(len);
      }
    }
  }
  return worst;
}

// ---------------------------------------------------------------- ISA variants

using RowsFn = uint32_t (*)(const float*, int8_t*, float*, int64_t, int64_t, int64_t, int32_t,
                            rng::Keys, uint64_t);

struct Kernels {
  RowsFn nearest;
  RowsFn stochastic;
};

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                          \
  ATTR uint32_t nearest_rows_##NAME(const float* x, int8_t* q, float* scale, int64_t r0,       \
                                    int64_t r1, int64_t cols, int32_t qmax, rng::Keys keys,    \
                                    uint64_t offset) {                                         \
    return rows_body<false>(x, q, scale, r0, r1, cols, qmax, keys, offset);                    \
  }                                                                                            \
  ATTR uint32_t stochastic_rows_##NAME(const float* x, int8_t* q, float* scale, int64_t r0,    \
                                       int64_t r1, int64_t cols, int32_t qmax, rng::Keys keys, \
                                       uint64_t offset) {                                      \
    return rows_body<true>(x, q, scale, r0, r1, cols, qmax, keys, offset);                     \
  }                                                                                            \
  const Kernels kernels_##NAME = {nearest_rows_##NAME, stochastic_rows_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- op

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_rows(const at::Tensor& x_in, int64_t bits,
                                                           bool stochastic, int64_t seed,
                                                           int64_t offset) {
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t n = rows * cols;
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (n == 0) return {q, at::zeros({rows, 1}, x.options())};  // no columns: range 0
  at::Tensor scale = at::empty({rows, 1}, x.options());

  const float* xp = x.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  float* sp = scale.mutable_data_ptr<float>();
  advise_huge_pages(qp, static_cast<size_t>(n));
  const int32_t qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  const RowsFn body = stochastic ? kernels().stochastic : kernels().nearest;

  const int nt = static_cast<int>(std::min<int64_t>(plan_threads(n, ranges::kGrain), rows));
  std::vector<uint32_t> worst(static_cast<size_t>(nt), 0u);
  for_team_ranges(nt, rows, [&](int t, int64_t r0, int64_t r1) {
    worst[static_cast<size_t>(t)] = body(xp, qp, sp, r0, r1, cols, qmax, keys, off);
  });
  const uint32_t m = *std::max_element(worst.begin(), worst.end());
  TORCH_CHECK_VALUE(m < 0x7f800000u,
                    "qtrain::quantize_symmetric_rows: x contains NaN or Inf; quantization needs "
                    "finite values");
  return {q, scale};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_symmetric_rows", &qtrain::quantize_symmetric_rows);
}
