// qspmm4 on the CPU (front: ops/qspmm4.cpp): qspmm over rows of 4-bit values packed two per
// byte, bit for bit qspmm(indptr, indices, unpack_int4(packed, width), scale, weight, eids)
// (reference: qtrain/ops/sparse.py reference_qspmm4). The body is qspmm's
// (cpu/spmm_body.h) with the rows read as nibbles: W / 2 bytes sign-extended into W int32
// lanes in value order, so the same values are summed in the same order from half the
// bytes.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "common/sparse_operands.h"
#include "cpu/isa.h"
#include "cpu/spmm_body.h"

namespace qtrain {
namespace {

using spmm_cpu::Int4Rows;

#define QT_NO_ATTR
QT_DEFINE_SPMM_VARIANT(Int4Rows, default, QT_NO_ATTR, isa::kDefault)
#if QT_X86_DISPATCH
QT_DEFINE_SPMM_VARIANT(Int4Rows, avx2, QT_TARGET_AVX2, isa::kAvx2)
QT_DEFINE_SPMM_VARIANT(Int4Rows, avx512, QT_TARGET_AVX512, isa::kAvx512)
#endif

at::Tensor qspmm4(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& packed,
                  int64_t width, double scale, const std::optional<at::Tensor>& weight,
                  const std::optional<at::Tensor>& eids,
                  const std::optional<at::Tensor>& row_scale) {
  return spmm_cpu::run<Int4Rows>(
      "qtrain::qspmm4", "packed", QT_SELECT_VARIANT(kernels_),
      sparse_operands::spmm(indptr, indices, packed, weight, eids, row_scale, width), scale);
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("qspmm4", &qtrain::qspmm4); }
