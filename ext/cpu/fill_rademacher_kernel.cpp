// fill_rademacher on the CPU (front: ops/fill_rademacher.cpp; the sign body:
// rowwise_variants.cpp): out[i] = +-fl32(1 / sqrt(k)) by the top bit of the counter
// hash at (seed, offset + i), a pure function of i, so any thread split gives the
// reference qtrain/quant/projection.py rademacher bit for bit.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "common/rng.h"
#include "cpu/mem.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

void fill_rademacher(const at::Tensor& out, int64_t seed, int64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int64_t k = out.size(1);
  float* op = out.mutable_data_ptr<float>();
  advise_huge_pages(op, static_cast<size_t>(n) * sizeof(float));
  // fl32(1 / sqrt(k)): both double operations are correctly rounded, as in Python
  const uint32_t mag_bits = as_bits(static_cast<float>(1.0 / std::sqrt(static_cast<double>(k))));
  const Kernels& K = kernels();
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    for_counter_segments(static_cast<uint64_t>(offset), b, e,
                         [&](int64_t i, int64_t len, uint32_t lo, uint32_t hi) {
                           K.signs(op + i, len, mag_bits, lo, keys.k1, rng::block_key(keys, hi));
                         });
  });
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("fill_rademacher", &qtrain::fill_rademacher); }
