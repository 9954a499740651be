// segment_matmul_tn on CUDA (front: ops/segment_matmul_tn.cpp; reference
// qtrain/ops/typed.py reference_segment_matmul_tn; CPU twin cpu/segment_matmul_tn_kernel.cpp):
// the host loop of common/segment_matmul.h, one cuBLAS GEMM (at::mm_out) per nonempty
// segment on the current stream, offsets read on the host.
#include <torch/library.h>

#include "common/segment_matmul.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

at::Tensor segment_matmul_tn(const at::Tensor& x, const at::Tensor& offsets,
                             const at::Tensor& grad) {
  const c10::cuda::CUDAGuard guard(x.device());
  return qtrain::segment_matmul::tn(x, offsets, grad);
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("segment_matmul_tn", &qtrain::cuda::segment_matmul_tn);
}
