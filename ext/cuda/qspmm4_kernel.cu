// qspmm4 on CUDA (front: ops/qspmm4.cpp): qspmm over rows of 4-bit values packed two per
// byte, bit for bit qspmm(indptr, indices, unpack_int4(packed, width), scale, weight, eids)
// (reference: qtrain/ops/sparse.py reference_qspmm4; CPU twin cpu/qspmm4_kernel.cpp). The
// body is qspmm's (cuda/spmm_body.cuh) with the rows read as nibbles: 4 values per 16-bit
// gather when the width is even, so the same values are summed in the same order from
// half the bytes.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>

#include "common/sparse_operands.h"
#include "cuda/common.cuh"
#include "cuda/spmm_body.cuh"

namespace qtrain {
namespace cuda {
namespace {

at::Tensor qspmm4(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& packed,
                  int64_t width, double scale, const std::optional<at::Tensor>& weight,
                  const std::optional<at::Tensor>& eids,
                  const std::optional<at::Tensor>& row_scale) {
  const c10::cuda::CUDAGuard guard(indptr.device());
  return spmm_body::run<spmm_body::Int4Rows>(
      "qtrain::qspmm4", "packed",
      sparse_operands::spmm(indptr, indices, packed, weight, eids, row_scale, width), scale);
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("qspmm4", &qtrain::cuda::qspmm4); }
