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

#define QT_NO_ATTR
QT_DEFINE_ROWS_VARIANT(default, QT_NO_ATTR, false)
#if QT_X86_DISPATCH
QT_DEFINE_ROWS_VARIANT(avx2, QT_TARGET_AVX2, false)
QT_DEFINE_ROWS_VARIANT(avx512, QT_TARGET_AVX512, false)
#endif

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
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  advise_huge_pages(qp, static_cast<size_t>(n));
  const cpu::RowKernels& K = QT_SELECT_VARIANT(row_kernels_);
  cpu::run_rows("qtrain::quantize_symmetric_rows", stochastic ? K.stochastic : K.nearest,
                x.const_data_ptr<float>(), qp, scale.mutable_data_ptr<float>(), rows, cols, bits,
                seed, offset, false);
  return {q, scale};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_symmetric_rows", &qtrain::quantize_symmetric_rows);
}
