// quantize_rows_means: float32 rows [rows, width] to 1 bit, each row split at its mean and
// stored as the mean of each side (the exact plugin's 1-bit activations). Reference:
// qtrain/quant/rowwise.py quantize_rows_means; kernels: cpu/quantize_rows_means_kernel.cpp,
// cuda/quantize_rows_means_kernel.cu.
//
//   (packed uint8 [ceil(rows * width / 8)], zero bf16 [rows], range bf16 [rows]): the
//   format of quantize_rows at bits = 1, so dequantize_rows reads it. Deterministic: no
//   seed. A row holding a NaN dequantizes to NaN.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeRowsMeans {
  static constexpr const char* kName = "quantize_rows_means";
  static constexpr const char* kSchema =
      "quantize_rows_means(Tensor x) -> (Tensor packed, Tensor zero, Tensor range)";
  using Signature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&);

  static void check(const at::Tensor& x) {
    constexpr const char* fn = "qtrain::quantize_rows_means";
    checks::float_rows(fn, "x", x);
    checks::element_count(fn, x.numel());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeRowsMeans>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeRowsMeans>(m);
}
