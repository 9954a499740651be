// quantized_gemm on the CPU (front: ops/quantized_gemm.cpp; reference
// qtrain/ops/gemm.py reference_quantized_gemm, CUDA twin cuda/quantized_gemm_kernel.cu).
//
// By definition, with the given ranges absmax_a, absmax_b (read here: they must be
// finite and >= 0, which only the values tell):
//
//   qa = quantize a with absmax_a (quantize_symmetric's rule, counters offset_a + i)
//   qb = quantize b with absmax_b (counters offset_b + i)
//   C  = int8_gemm(qa, qb, fl32(fl32(absmax_a / qmax_a) * fl32(absmax_b / qmax_b)),
//                  layout, bias);   returns (C, max |C|)
//
// Both operands are quantized by cpu/quantize_symmetric_kernel.cpp's own code
// (cpu/quantize.h) and multiplied by the int8 GEMM's C++ entry (cpu/gemm.h), so the
// result is bit-identical to the reference for any thread count and ISA variant.
// max |C| is a bit-pattern max (order-free; a NaN in C, from an infinite scale or
// bias, comes out as a NaN).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>

#include "cpu/gemm.h"
#include "cpu/quantize.h"

namespace qtrain {
namespace {

constexpr const char* kFn = "qtrain::quantized_gemm";

// The value of a one-element float32 CPU range; ValueError unless finite and >= 0.
float range_value(const char* name, const at::Tensor& t) {
  const float v = *t.const_data_ptr<float>();
  TORCH_CHECK_VALUE(std::isfinite(v) && v >= 0.0f, kFn, ": ", name,
                    " must be finite and >= 0, got ", v);
  return v;
}

// A float32 operand quantized with the given range into a fresh int8 tensor of its shape
// (the counter of element i is offset + its index in row-major order).
at::Tensor quantize_operand(const at::Tensor& x_in, float absmax, int64_t bits, bool stochastic,
                            int64_t seed, int64_t offset) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  cpu::quantize_with_absmax(x.const_data_ptr<float>(), q.mutable_data_ptr<int8_t>(), x.numel(),
                            absmax, bits, stochastic, static_cast<uint64_t>(seed),
                            static_cast<uint64_t>(offset));
  return q;
}

std::tuple<at::Tensor, at::Tensor> quantized_gemm(
    const at::Tensor& a, const at::Tensor& b, const at::Tensor& absmax_a,
    const at::Tensor& absmax_b, int64_t bits_a, int64_t bits_b, c10::string_view layout,
    const std::optional<at::Tensor>& bias, bool stochastic, int64_t seed, int64_t offset_a,
    int64_t offset_b) {
  const float range_a = range_value("absmax_a", absmax_a);
  const float range_b = range_value("absmax_b", absmax_b);
  const at::Tensor qa = quantize_operand(a, range_a, bits_a, stochastic, seed, offset_a);
  const at::Tensor qb = quantize_operand(b, range_b, bits_b, stochastic, seed, offset_b);
  const float scale_a = range_a / static_cast<float>((1 << (bits_a - 1)) - 1);
  const float scale_b = range_b / static_cast<float>((1 << (bits_b - 1)) - 1);
  const at::Tensor c = cpu::int8_gemm(qa, qb, static_cast<double>(scale_a * scale_b), layout, bias);
  const uint32_t mbits = cpu::absmax_bits(c.const_data_ptr<float>(), c.numel());
  float absmax;
  std::memcpy(&absmax, &mbits, sizeof absmax);
  return {c, at::full({}, absmax, a.options())};
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("quantized_gemm", &qtrain::quantized_gemm); }
