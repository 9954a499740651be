// int8_segment_gemm on CUDA (front: ops/int8_segment_gemm.cpp; reference qtrain/ops/typed.py
// reference_int8_segment_gemm; CPU twin cpu/int8_segment_gemm_kernel.cpp): the host loop of
// common/int8_segment_gemm.h on the operands' device, one launch of int8_gemm's tensor-core
// GEMM (cuda/gemm.cuh run_gemm, split-K included) per nonempty segment on the current
// stream, its epilogue writing the segment's slice of the output. offsets stay on the CPU,
// so nothing here waits for the GPU.
#include <torch/library.h>

#include "common/int8_segment_gemm.h"
#include "cuda/gemm.cuh"

namespace qtrain {
namespace cuda {
namespace {

// int8_gemm's CUDA kernel (int8_gemm_kernel.cu) without a bias, into `out` (contiguous
// float32 [M, N]); a and b are contiguous slices.
void segment_gemm(const at::Tensor& a, const at::Tensor& b, double scale,
                  c10::string_view layout, const at::Tensor& out) {
  const int lay = gemm::layout_code(layout);
  int64_t M, K, N;
  gemm::gemm_dims(lay, a, b, M, K, N);
  if (M == 0 || N == 0) return;
  gemm::Epilogue ep{};
  ep.scale = static_cast<float>(scale);
  ep.bias = nullptr;
  ep.out = out.mutable_data_ptr<float>();
  gemm::run_gemm<int8_t>("qtrain::int8_segment_gemm", lay, a, b, M, K, N, ep, current_stream(),
                         a.options());
}

at::Tensor int8_segment_gemm(const at::Tensor& qa, const at::Tensor& qb,
                             const at::Tensor& offsets, double scale, c10::string_view layout) {
  const c10::cuda::CUDAGuard guard(qa.device());
  return qtrain::int8_segment_gemm::run(qa, qb, offsets, scale, layout, &segment_gemm);
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("int8_segment_gemm", &qtrain::cuda::int8_segment_gemm);
}
