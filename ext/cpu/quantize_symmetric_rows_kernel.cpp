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
// quantize_symmetric's own (cpu/quantize_bodies.h, through cpu/quantize_rows_body.h, which
// quantize_symmetric_rows4 shares); one call per chunk of rows runs them inside the ISA
// variant, so the inner loops vectorize there.
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
#include "cpu/quantize_rows_body.h"
#include "cpu/ranges.h"
#include "cpu/threads.h"

namespace qtrain {
namespace {

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
    return cpu::quantize_rows_body<false, false>(x, q, scale, r0, r1, cols, qmax, keys,       \
                                                 offset, nullptr);                            \
  }                                                                                            \
  ATTR uint32_t stochastic_rows_##NAME(const float* x, int8_t* q, float* scale, int64_t r0,    \
                                       int64_t r1, int64_t cols, int32_t qmax, rng::Keys keys, \
                                       uint64_t offset) {                                      \
    return cpu::quantize_rows_body<true, false>(x, q, scale, r0, r1, cols, qmax, keys, offset, \
                                                nullptr);                                     \
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
