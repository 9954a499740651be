// int8_gemm_int32 on CUDA (front: ops/int8_gemm_int32.cpp; reference qtrain/ops/integer.py
// reference_int_gemm, CPU twin cpu/int8_gemm_int32_kernel.cpp): int8_gemm's tensor-core GEMM
// (cuda/gemm.cuh run_gemm) with an int32 store instead of the float epilogue
// (Epilogue::out_i32). A K-chunk of at most 65536 sums exactly in int32 (|acc| <= 2^30),
// which the epilogue stores as it is; longer K splits across blocks into an int64 workspace
// (integer atomics, order-free), and the finalize kernel stores that sum saturated to
// [-2^31, 2^31 - 1]. Integers only: bit-identical to the reference for any launch shape.
// An empty product (K = 0) is zeros.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/gemm.cuh"

namespace qtrain {
namespace cuda {
namespace {

at::Tensor int8_gemm_int32(const at::Tensor& qa_in, const at::Tensor& qb_in,
                           c10::string_view layout) {
  const int lay = gemm::layout_code(layout);
  int64_t M, K, N;
  gemm::gemm_dims(lay, qa_in, qb_in, M, K, N);
  const c10::cuda::CUDAGuard guard(qa_in.device());
  const at::TensorOptions opts = qa_in.options().dtype(at::kInt);
  if (M == 0 || N == 0 || K == 0) return at::zeros({M, N}, opts);
  at::Tensor out = at::empty({M, N}, opts);
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  gemm::Epilogue ep{};
  ep.scale = 1.0f;
  ep.bias = nullptr;
  ep.out = nullptr;
  ep.out_i32 = out.mutable_data_ptr<int32_t>();
  gemm::run_gemm<int8_t>("qtrain::int8_gemm_int32", lay, qa, qb, M, K, N, ep, current_stream(),
                         qa.options());
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("int8_gemm_int32", &qtrain::cuda::int8_gemm_int32); }
