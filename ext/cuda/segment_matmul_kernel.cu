// segment_matmul on CUDA (front: ops/segment_matmul.cpp; reference qtrain/ops/typed.py
// reference_segment_matmul; CPU twin cpu/segment_matmul_kernel.cpp): the host loop of
// common/segment_matmul.h on the operands' device, one cuBLAS GEMM (at::mm_out) per
// nonempty segment on the current stream. offsets stay on the CPU, so nothing here
// waits for the GPU.
#include <torch/library.h>

#include "common/segment_matmul.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

at::Tensor segment_matmul(const at::Tensor& x, const at::Tensor& offsets,
                          const at::Tensor& weight, bool transpose_weight) {
  const c10::cuda::CUDAGuard guard(x.device());
  return qtrain::segment_matmul::forward(x, offsets, weight, transpose_weight);
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("segment_matmul", &qtrain::cuda::segment_matmul); }
