// quantized_gemm on CUDA (front: ops/quantized_gemm.cpp; reference qtrain/ops/gemm.py
// reference_quantized_gemm, CPU twin cpu/quantized_gemm_kernel.cpp).
//
// B, which every row block reads, is quantized once up front with the given absmax_b
// (launch_quantize_given, cuda/quantize_symmetric_kernel.cu); A is quantized inside the
// tile loads of the GEMM of cuda/gemm.cuh, with pre / inv derived on the device from
// absmax_a, so a range that a previous call left on the GPU never visits the host. The
// epilogue multiplies by fl32(fl32(absmax_a / qmax_a) * fl32(absmax_b / qmax_b)), adds
// the bias and reduces max |C| (bit-pattern max, one atomicMax per block).
//
// A range given on the CPU is read here and refused unless finite and >= 0
// (ValueError), then copied to the device; a range on the device is used as it is.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>

#include "cuda/gemm.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr const char* kFn = "qtrain::quantized_gemm";

// A one-element float32 range as a [1] tensor on `dev`; a CPU value is checked here.
at::Tensor range_on_device(const char* name, const at::Tensor& t, const at::Device& dev) {
  if (t.device().is_cpu()) {
    const float v = *t.const_data_ptr<float>();
    TORCH_CHECK_VALUE(std::isfinite(v) && v >= 0.0f, kFn, ": ", name,
                      " must be finite and >= 0, got ", v);
    return t.reshape({1}).to(dev).contiguous();
  }
  return t.reshape({1}).contiguous();
}

std::tuple<at::Tensor, at::Tensor> quantized_gemm(
    const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& absmax_a_in,
    const at::Tensor& absmax_b_in, int64_t bits_a, int64_t bits_b, c10::string_view layout,
    const std::optional<at::Tensor>& bias_in, bool stochastic, int64_t seed, int64_t offset_a,
    int64_t offset_b) {
  const int lay = gemm::layout_code(layout);
  int64_t M, K, N;
  gemm::gemm_dims(lay, a_in, b_in, M, K, N);
  const at::Device dev = a_in.device();
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor amax_a = range_on_device("absmax_a", absmax_a_in, dev);
  const at::Tensor amax_b = range_on_device("absmax_b", absmax_b_in, dev);
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) bias = bias_in->to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, N}, a_in.options());
  at::Tensor amax_bits = at::zeros({1}, a_in.options().dtype(at::kInt));
  at::Tensor amax_out = amax_bits.view(at::kFloat).reshape({});
  if (M == 0 || N == 0) return {out, amax_out};

  cudaStream_t stream = current_stream();
  const at::Tensor a = a_in.contiguous();
  const at::Tensor b = b_in.contiguous();
  const int qmax_a = (1 << (bits_a - 1)) - 1;
  const int qmax_b = (1 << (bits_b - 1)) - 1;
  const auto seed_bits = static_cast<uint64_t>(seed);
  // B is read by every row block: quantize it once rather than in each block's load
  at::Tensor qb = at::empty(b.sizes(), b.options().dtype(at::kChar));
  launch_quantize_given(b.const_data_ptr<float>(), qb.mutable_data_ptr<int8_t>(), b.numel(),
                        amax_b.const_data_ptr<float>(), qmax_b, stochastic, seed_bits,
                        static_cast<uint64_t>(offset_b), nullptr, stream);
  gemm::Epilogue ep{};
  ep.absmax_a = amax_a.const_data_ptr<float>();
  ep.absmax_b = amax_b.const_data_ptr<float>();
  ep.qmax_a = qmax_a;
  ep.qmax_b = qmax_b;
  ep.stochastic = stochastic;
  ep.keys = rng::keys_from_seed(seed_bits);
  ep.offset_a = static_cast<uint64_t>(offset_a);
  ep.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  ep.out = out.mutable_data_ptr<float>();
  ep.absmax_out = reinterpret_cast<uint32_t*>(amax_bits.mutable_data_ptr<int32_t>());
  gemm::run_gemm<float>(kFn, lay, a, qb, M, K, N, ep, stream, a.options());
  return {out, amax_out};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("quantized_gemm", &qtrain::cuda::quantized_gemm); }
