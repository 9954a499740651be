// int8_gemm on CUDA (front: ops/int8_gemm.cpp; reference qtrain/ops/gemm.py
// reference_int8_gemm, CPU twin cpu/int8_gemm_kernel.cpp): the tensor-core GEMM of
// cuda/gemm.cuh on int8 operands, with the dequantization (and bias) fused into the
// epilogue. Integer sums are exact and the epilogue is fl32(float(acc) * f) (+ bias),
// f = fl32(fl32(scale * row_scale[m]) * col_scale[n]) (an absent vector is 1), so the
// result is bit-identical to the reference for any launch shape.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda/gemm.cuh"

namespace qtrain {
namespace cuda {
namespace {

at::Tensor int8_gemm(const at::Tensor& qa_in, const at::Tensor& qb_in, double scale,
                     c10::string_view layout, const std::optional<at::Tensor>& bias_in,
                     const std::optional<at::Tensor>& row_scale_in,
                     const std::optional<at::Tensor>& col_scale_in) {
  const int lay = gemm::layout_code(layout);
  int64_t M, K, N;
  gemm::gemm_dims(lay, qa_in, qb_in, M, K, N);
  const c10::cuda::CUDAGuard guard(qa_in.device());
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) bias = bias_in->to(at::kFloat).contiguous();
  // float32 [M] / [N] on qa's device, as the front checked
  at::Tensor row_scale, col_scale;
  if (row_scale_in.has_value() && row_scale_in->defined()) row_scale = row_scale_in->contiguous();
  if (col_scale_in.has_value() && col_scale_in->defined()) col_scale = col_scale_in->contiguous();
  at::Tensor out = at::empty({M, N}, qa_in.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return out;
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  gemm::Epilogue ep{};
  ep.scale = static_cast<float>(scale);
  ep.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  ep.row_scale = row_scale.defined() ? row_scale.const_data_ptr<float>() : nullptr;
  ep.col_scale = col_scale.defined() ? col_scale.const_data_ptr<float>() : nullptr;
  ep.out = out.mutable_data_ptr<float>();
  gemm::run_gemm<int8_t>("qtrain::int8_gemm", lay, qa, qb, M, K, N, ep, current_stream(),
                         qa.options());
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("int8_gemm", &qtrain::cuda::int8_gemm); }
