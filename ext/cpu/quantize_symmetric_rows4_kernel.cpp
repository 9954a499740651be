// quantize_symmetric_rows4 on the CPU (front: ops/quantize_symmetric_rows4.cpp; reference
// qtrain/ops/quantize.py reference_quantize_rows4): quantize_symmetric_rows written as rows
// of 4-bit values packed two per byte, bit for bit pack_int4 of its q. The row loop is
// quantize_symmetric_rows's (cpu/quantize_rows_body.h): each row is quantized into a
// per-thread buffer and packed from there while it is in cache, so no int8 copy of x is
// written or read again (a separate pack_int4 pass reads one and writes the packed rows).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
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

using RowsFn = uint32_t (*)(const float*, uint8_t*, float*, int64_t, int64_t, int64_t, int32_t,
                            rng::Keys, uint64_t, int8_t*);

struct Kernels {
  RowsFn nearest;
  RowsFn stochastic;
};

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                         \
  ATTR uint32_t nearest_rows_##NAME(const float* x, uint8_t* out, float* scale, int64_t r0,   \
                                    int64_t r1, int64_t cols, int32_t qmax, rng::Keys keys,   \
                                    uint64_t offset, int8_t* buf) {                           \
    return cpu::quantize_rows_body<false, true>(x, out, scale, r0, r1, cols, qmax, keys,     \
                                                offset, buf);                                \
  }                                                                                           \
  ATTR uint32_t stochastic_rows_##NAME(const float* x, uint8_t* out, float* scale, int64_t r0, \
                                       int64_t r1, int64_t cols, int32_t qmax,                \
                                       rng::Keys keys, uint64_t offset, int8_t* buf) {        \
    return cpu::quantize_rows_body<true, true>(x, out, scale, r0, r1, cols, qmax, keys,      \
                                               offset, buf);                                 \
  }                                                                                           \
  const Kernels kernels_##NAME = {nearest_rows_##NAME, stochastic_rows_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_rows4(const at::Tensor& x_in, int64_t bits,
                                                            bool stochastic, int64_t seed,
                                                            int64_t offset) {
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t n = rows * cols;
  const int64_t row_bytes = (cols + 1) / 2;
  at::Tensor packed = at::empty({rows, row_bytes}, x.options().dtype(at::kByte));
  if (n == 0) return {packed, at::zeros({rows, 1}, x.options())};  // no columns: range 0
  at::Tensor scale = at::empty({rows, 1}, x.options());

  const float* xp = x.const_data_ptr<float>();
  uint8_t* pp = packed.mutable_data_ptr<uint8_t>();
  float* sp = scale.mutable_data_ptr<float>();
  advise_huge_pages(pp, static_cast<size_t>(rows * row_bytes));
  const int32_t qmax = (1 << (bits - 1)) - 1;
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto off = static_cast<uint64_t>(offset);
  const Kernels& K = QT_SELECT_VARIANT(kernels_);
  const RowsFn body = stochastic ? K.stochastic : K.nearest;

  const int nt = static_cast<int>(std::min<int64_t>(plan_threads(n, ranges::kGrain), rows));
  std::vector<uint32_t> worst(static_cast<size_t>(nt), 0u);
  for_team_ranges(nt, rows, [&](int t, int64_t r0, int64_t r1) {
    std::vector<int8_t> buf(static_cast<size_t>(cols));  // one row, quantized then packed
    worst[static_cast<size_t>(t)] = body(xp, pp, sp, r0, r1, cols, qmax, keys, off, buf.data());
  });
  const uint32_t m = *std::max_element(worst.begin(), worst.end());
  TORCH_CHECK_VALUE(m < 0x7f800000u,
                    "qtrain::quantize_symmetric_rows4: x contains NaN or Inf; quantization "
                    "needs finite values");
  return {packed, scale};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_symmetric_rows4", &qtrain::quantize_symmetric_rows4);
}
