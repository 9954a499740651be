// fill_counter_uniform on the CPU (front: ops/fill_counter_uniform.cpp): out[i] is a
// pure function of (seed, offset + i), so any thread split gives the same values as
// the reference qtrain/quant/rng.py counter_uniform.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

#include "common/rng.h"
#include "cpu/isa.h"
#include "cpu/ranges.h"

namespace qtrain {
namespace {

QT_ALWAYS_INLINE void uniform_body(float* __restrict out, int64_t n, uint32_t lo0, uint32_t k1,
                                   uint32_t kh) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = rng::to_unit(rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(i)));
  }
}

using UniformFn = void (*)(float*, int64_t, uint32_t, uint32_t, uint32_t);

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                        \
  ATTR void uniform_##NAME(float* out, int64_t n, uint32_t lo0, uint32_t k1, uint32_t kh) {  \
    uniform_body(out, n, lo0, k1, kh);                                                       \
  }                                                                                          \
  const UniformFn kernels_##NAME = uniform_##NAME;

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

void fill_counter_uniform(const at::Tensor& out, int64_t seed, int64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  float* op = out.mutable_data_ptr<float>();
  const UniformFn uniform = QT_SELECT_VARIANT(kernels_);
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  ranges::parallel(n, [&](int, int64_t b, int64_t e) {
    ranges::for_counter_segments(static_cast<uint64_t>(offset), b, e,
                                 [&](int64_t i, int64_t len, uint32_t lo, uint32_t hi) {
                                   uniform(op + i, len, lo, keys.k1, rng::block_key(keys, hi));
                                 });
  });
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("fill_counter_uniform", &qtrain::fill_counter_uniform);
}
