// quantized_gemm: quantize two float32 operands with given ranges, INT8-multiply them,
// dequantize (+ bias), and return the output's absmax too (the next layer's range).
// Reference: qtrain/ops/gemm.py reference_quantized_gemm; kernels:
// cpu/quantized_gemm_kernel.cpp, cuda/quantized_gemm_kernel.cu.
//
//   qa = a quantized to bits_a with absmax_a (quantize_symmetric's rule, counters
//        offset_a + i of stream seed when stochastic; values beyond the range clamp)
//   qb = b likewise with absmax_b, bits_b, offset_b
//   C  = int8_gemm(qa, qb, fl32(fl32(absmax_a / qmax_a) * fl32(absmax_b / qmax_b)),
//                  layout, bias);  returns (C float32 [M, N], max |C| float32 0-d)
//
// absmax_a / absmax_b are one-element float32 tensors on a's device or on the CPU (a
// range the previous GPU call returned stays on the GPU: no wait for it). That they are
// finite and >= 0 only their values tell: the kernels check it.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

constexpr const char* kFn = "qtrain::quantized_gemm";

// A one-element float32 range on a's device or on the CPU.
void range_arg(const char* name, const at::Tensor& t, const at::Device& device) {
  checks::dense(kFn, name, t);
  checks::dtype(kFn, name, t, at::kFloat);
  TORCH_CHECK_VALUE(t.numel() == 1, kFn, ": ", name, " must hold one value, got shape ",
                    t.sizes());
  TORCH_CHECK_VALUE(t.device() == device || t.device().is_cpu(), kFn, ": ", name, " is on ",
                    t.device(), " but must be on a's device (", device, ") or on the CPU");
}

void bits_arg(const char* name, int64_t bits) {
  TORCH_CHECK_VALUE(bits >= 2 && bits <= 8, kFn, ": ", name, " must be an integer in 2..8, got ",
                    bits);
}

// Counters offset .. offset + n - 1 of the random stream stay in [0, 2^63).
void counters_arg(const char* name, const char* of, int64_t n, int64_t offset) {
  TORCH_CHECK_VALUE(offset >= 0, kFn, ": ", name, " must be >= 0, got ", offset);
  TORCH_CHECK_VALUE(n <= std::numeric_limits<int64_t>::max() - offset, kFn, ": ", name,
                    " + numel of ", of, " must stay below 2^63, got ", name, " ", offset,
                    " and numel ", n);
}

struct QuantizedGemm {
  static constexpr const char* kName = "quantized_gemm";
  static constexpr const char* kSchema =
      "quantized_gemm(Tensor a, Tensor b, Tensor absmax_a, Tensor absmax_b, int bits_a=8,"
      " int bits_b=8, str layout=\"nn\", Tensor? bias=None, bool stochastic=False, int seed=0,"
      " int offset_a=0, int offset_b=0) -> (Tensor c, Tensor absmax)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
      int64_t, c10::string_view, const std::optional<at::Tensor>&, bool, int64_t, int64_t,
      int64_t);

  static void check(const at::Tensor& a, const at::Tensor& b, const at::Tensor& absmax_a,
                    const at::Tensor& absmax_b, int64_t bits_a, int64_t bits_b,
                    c10::string_view layout, const std::optional<at::Tensor>& bias, bool,
                    int64_t, int64_t offset_a, int64_t offset_b) {
    checks::gemm_layout(kFn, layout);
    bits_arg("bits_a", bits_a);
    bits_arg("bits_b", bits_b);
    checks::gemm_operand(kFn, "a", a, at::kFloat);
    checks::gemm_operand(kFn, "b", b, at::kFloat);
    checks::same_device(kFn, "b", b, "a", a.device());
    const int64_t n = checks::gemm_columns(kFn, layout, "a", a, "b", b);
    range_arg("absmax_a", absmax_a, a.device());
    range_arg("absmax_b", absmax_b, a.device());
    checks::gemm_bias(kFn, bias, n, "a", a.device());
    counters_arg("offset_a", "a", a.numel(), offset_a);
    counters_arg("offset_b", "b", b.numel(), offset_b);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizedGemm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizedGemm>(m);
}
