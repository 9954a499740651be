// quantize_symmetric on the CPU (front: ops/quantize_symmetric.cpp).
//
// Two passes over x: the absolute maximum (an integer max over the float bit
// patterns with the sign cleared, exact, order-free, and it flags NaN/Inf for
// free), then quantization. Both are split into contiguous per-thread ranges;
// every element depends only on its value, the scale and its index, so the
// result is the same for any thread count and bit-identical to
// qtrain/quant/quantize.py (the reference):
//
//   qmax = 2^(bits-1) - 1, inv = fl32(qmax / absmax)       (0 if absmax == 0)
//   nearest:    q = clamp(rint(fl32(x * inv)), -qmax, qmax)        (ties to even)
//   stochastic: q = clamp(floor(fl32(fl32(x * inv) + u_i)), -qmax, qmax)
//   scale = fl32(absmax / qmax)
//
// If fl32(qmax / absmax) overflows (absmax below ~1e-37), x and absmax are
// first multiplied by 2^64 (exact), as the reference does.
//
// The two passes are also C++ functions (cpu/quantize.h) for quantized_gemm's CPU
// kernel, which quantizes with a given range instead of max |x|; their loop bodies are
// in cpu/quantize_bodies.h, shared with quantize_symmetric_rows.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "cpu/isa.h"
#include "cpu/mem.h"
#include "cpu/quantize.h"
#include "cpu/quantize_bodies.h"
#include "cpu/ranges.h"

namespace qtrain {
namespace {

// ---------------------------------------------------------------- kernel bodies

// (cpu/quantize_bodies.h, shared with quantize_symmetric_rows)
using cpu::absmax_bits_body;
using cpu::nearest_body;
using cpu::stochastic_body;

// ---------------------------------------------------------------- ISA variants

struct Kernels {
  uint32_t (*absmax_bits)(const float*, int64_t);
  void (*nearest)(const float*, int8_t*, int64_t, float, float, int32_t);
  void (*stochastic)(const float*, int8_t*, int64_t, float, float, int32_t, uint32_t, uint32_t,
                     uint32_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                          \
  ATTR uint32_t absmax_bits_##NAME(const float* x, int64_t n) {                                \
    return absmax_bits_body(x, n);                                                             \
  }                                                                                            \
  ATTR void nearest_##NAME(const float* x, int8_t* q, int64_t n, float pre, float inv,         \
                           int32_t qmax) {                                                     \
    nearest_body(x, q, n, pre, inv, qmax);                                                     \
  }                                                                                            \
  ATTR void stochastic_##NAME(const float* x, int8_t* q, int64_t n, float pre, float inv,      \
                              int32_t qmax, uint32_t lo0, uint32_t k1, uint32_t kh) {          \
    stochastic_body(x, q, n, pre, inv, qmax, lo0, k1, kh);                                     \
  }                                                                                            \
  const Kernels kernels_##NAME = {absmax_bits_##NAME, nearest_##NAME, stochastic_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

}  // namespace

// ---------------------------------------------------------------- shared (cpu/quantize.h)

namespace cpu {

uint32_t absmax_bits(const float* x, int64_t n) {
  if (n == 0) return 0u;
  const Kernels& K = kernels();
  std::vector<uint32_t> partial(static_cast<size_t>(plan_threads(n, ranges::kGrain)), 0u);
  ranges::parallel(n, [&](int t, int64_t b, int64_t e) {
    partial[static_cast<size_t>(t)] = K.absmax_bits(x + b, e - b);
  });
  return *std::max_element(partial.begin(), partial.end());
}

void quantize_with_absmax(const float* x, int8_t* q, int64_t n, float absmax, int64_t bits,
                          bool stochastic, uint64_t seed, uint64_t offset) {
  if (n == 0) return;
  if (absmax == 0.0f) {  // inv = 0: every value rounds to 0 (x is finite)
    std::memset(q, 0, static_cast<size_t>(n));
    return;
  }
  const int32_t qmax = (1 << (bits - 1)) - 1;
  const cpu::ScaleParams sp = cpu::scale_params(absmax, qmax);
  const float pre = sp.pre;
  const float inv = sp.inv;
  const Kernels& K = kernels();
  if (!stochastic) {
    ranges::parallel(n, [&](int, int64_t b, int64_t e) {
      K.nearest(x + b, q + b, e - b, pre, inv, qmax);
    });
  } else {
    const rng::Keys keys = rng::keys_from_seed(seed);
    ranges::parallel(n, [&](int, int64_t b, int64_t e) {
      ranges::for_counter_segments(offset, b, e,
                                   [&](int64_t i, int64_t len, uint32_t lo, uint32_t hi) {
                                     K.stochastic(x + i, q + i, len, pre, inv, qmax, lo,
                                                  keys.k1, rng::block_key(keys, hi));
                                   });
    });
  }
}

}  // namespace cpu

// ---------------------------------------------------------------- op

namespace {

std::tuple<at::Tensor, at::Tensor> quantize_symmetric(const at::Tensor& x_in, int64_t bits,
                                                      bool stochastic, int64_t seed,
                                                      int64_t offset) {
  const int64_t n = x_in.numel();
  const at::Tensor x = x_in.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  const int32_t qmax = (1 << (bits - 1)) - 1;
  if (n == 0) return {q, at::zeros({}, x.options())};

  const float* xp = x.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  advise_huge_pages(qp, static_cast<size_t>(n));
  // pass 1: absmax
  const uint32_t mbits = cpu::absmax_bits(xp, n);
  TORCH_CHECK_VALUE(mbits < 0x7f800000u,
                    "qtrain::quantize_symmetric: x contains NaN or Inf; quantization needs "
                    "finite values");
  float absmax;
  std::memcpy(&absmax, &mbits, sizeof absmax);
  const float scale = absmax / static_cast<float>(qmax);
  // pass 2: quantize
  cpu::quantize_with_absmax(xp, qp, n, absmax, bits, stochastic, static_cast<uint64_t>(seed),
                            static_cast<uint64_t>(offset));
  return {q, at::full({}, scale, x.options())};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("quantize_symmetric", &qtrain::quantize_symmetric); }
