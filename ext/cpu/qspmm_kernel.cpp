// qspmm on the CPU (front: ops/qspmm.cpp): quantized SpMM on a CSR graph
// (tango-sc23 sec. 3.2-3.3); the definition is qtrain/ops/sparse.py (reference_qspmm):
//
//   copy:      out[r] = fl32(float(sum_k q[indices[k]]) * scale)             exact integer sum
//   weighted:  acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))  float32
//              out[r] = fl32(acc[r] * scale)
//
// The body (merge-path units, register tiles, the split rows' fix-up, the data checks) is
// cpu/spmm_body.h, shared with qspmm4 (packed 4-bit rows); here it reads int8 rows.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "common/sparse_operands.h"
#include "cpu/isa.h"
#include "cpu/spmm_body.h"

namespace qtrain {
namespace {

using spmm_cpu::Int8Rows;

#define QT_NO_ATTR
QT_DEFINE_SPMM_VARIANT(Int8Rows, default, QT_NO_ATTR, isa::kDefault)
#if QT_X86_DISPATCH
QT_DEFINE_SPMM_VARIANT(Int8Rows, avx2, QT_TARGET_AVX2, isa::kAvx2)
QT_DEFINE_SPMM_VARIANT(Int8Rows, avx512, QT_TARGET_AVX512, isa::kAvx512)
#endif

at::Tensor qspmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                 double scale, const std::optional<at::Tensor>& weight,
                 const std::optional<at::Tensor>& eids,
                 const std::optional<at::Tensor>& row_scale) {
  return spmm_cpu::run<Int8Rows>(
      "qtrain::qspmm", "q", QT_SELECT_VARIANT(kernels_),
      sparse_operands::spmm(indptr, indices, q, weight, eids, row_scale), scale);
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("qspmm", &qtrain::qspmm); }
