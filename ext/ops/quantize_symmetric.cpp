// quantize_symmetric: symmetric per-tensor quantization (tango-sc23 eq. 1-3).
// Reference: qtrain/quant/quantize.py; kernels: cpu/quantize_symmetric_kernel.cpp,
// cuda/quantize_symmetric_kernel.cu.
//
//   (q int8 of x's shape, scale float32 0-d), x ~ q * scale; bits 2..8; stochastic
//   rounding draws u_i from the counter stream (seed, offset + i). x must be finite
//   (the kernels refuse NaN / Inf, which only the data shows).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeSymmetric {
  static constexpr const char* kName = "quantize_symmetric";
  static constexpr const char* kSchema =
      "quantize_symmetric(Tensor x, int bits, bool stochastic=False, int seed=0, int offset=0)"
      " -> (Tensor q, Tensor scale)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool, int64_t,
                                                       int64_t);

  static void check(const at::Tensor& x, int64_t bits, bool, int64_t, int64_t offset) {
    constexpr const char* fn = "qtrain::quantize_symmetric";
    checks::bits_in(fn, bits, 2, 8);
    checks::dense(fn, "x", x);
    checks::dtype(fn, "x", x, at::kFloat);
    checks::counter_range(fn, x.numel(), offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeSymmetric>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeSymmetric>(m);
}
