// qspmm on CUDA (front: ops/qspmm.cpp): quantized SpMM on a CSR graph (tango-sc23
// sec. 3.2-3.3); the definition is qtrain/ops/sparse.py (reference_qspmm), the CPU twin
// cpu/qspmm_kernel.cpp:
//
//   copy:      out[r] = fl32(float(sum_k q[indices[k]]) * scale)             exact integer sum
//   weighted:  acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))  float32, CSR order
//              out[r] = fl32(acc[r] * scale)
//
// The body (merge-path units over lane groups, the split rows' fix-up, the device-side data
// checks) is cuda/spmm_body.cuh, shared with qspmm4 (packed 4-bit rows); here it reads int8
// rows, 4 values per 32-bit gather.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>

#include "common/sparse_operands.h"
#include "cuda/common.cuh"
#include "cuda/spmm_body.cuh"

namespace qtrain {
namespace cuda {
namespace {

at::Tensor qspmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                 double scale, const std::optional<at::Tensor>& weight,
                 const std::optional<at::Tensor>& eids,
                 const std::optional<at::Tensor>& row_scale) {
  const c10::cuda::CUDAGuard guard(indptr.device());
  return spmm_body::run<spmm_body::Int8Rows>(
      "qtrain::qspmm", "q", sparse_operands::spmm(indptr, indices, q, weight, eids, row_scale),
      scale);
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("qspmm", &qtrain::cuda::qspmm); }
