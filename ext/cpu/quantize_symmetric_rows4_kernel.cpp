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

#define QT_NO_ATTR
QT_DEFINE_ROWS_VARIANT(default, QT_NO_ATTR, true)
#if QT_X86_DISPATCH
QT_DEFINE_ROWS_VARIANT(avx2, QT_TARGET_AVX2, true)
QT_DEFINE_ROWS_VARIANT(avx512, QT_TARGET_AVX512, true)
#endif

std::tuple<at::Tensor, at::Tensor> quantize_symmetric_rows4(const at::Tensor& x_in, int64_t bits,
                                                            bool stochastic, int64_t seed,
                                                            int64_t offset) {
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t row_bytes = (cols + 1) / 2;
  at::Tensor packed = at::empty({rows, row_bytes}, x.options().dtype(at::kByte));
  if (rows * cols == 0) return {packed, at::zeros({rows, 1}, x.options())};  // range 0
  at::Tensor scale = at::empty({rows, 1}, x.options());
  uint8_t* pp = packed.mutable_data_ptr<uint8_t>();
  advise_huge_pages(pp, static_cast<size_t>(rows * row_bytes));
  const cpu::RowKernels& K = QT_SELECT_VARIANT(row_kernels_);
  cpu::run_rows("qtrain::quantize_symmetric_rows4", stochastic ? K.stochastic : K.nearest,
                x.const_data_ptr<float>(), pp, scale.mutable_data_ptr<float>(), rows, cols, bits,
                seed, offset, true);
  return {packed, scale};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("quantize_symmetric_rows4", &qtrain::quantize_symmetric_rows4);
}
