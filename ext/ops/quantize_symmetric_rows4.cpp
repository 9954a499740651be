// quantize_symmetric_rows4: quantize_symmetric_rows at 2 to 4 bits, its rows written as
// 4-bit values packed two per byte (issue 32, packed storage). Reference:
// qtrain/ops/quantize.py reference_quantize_rows4; kernels:
// cpu/quantize_symmetric_rows4_kernel.cpp, cuda/quantize_symmetric_rows4_kernel.cu.
//
//   (packed uint8 [rows, ceil(cols / 2)], scale float32 [rows, 1])
//     == (pack_int4(q), scale) of quantize_symmetric_rows(x, bits, stochastic, seed, offset)
//   bit for bit
//
// What tango stores at 4 bits or fewer, made in one pass: the int8 values are never
// written out. x must be finite (the kernels refuse NaN / Inf, which only the data shows).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeSymmetricRows4 {
  static constexpr const char* kName = "quantize_symmetric_rows4";
  static constexpr const char* kSchema =
      "quantize_symmetric_rows4(Tensor x, int bits, bool stochastic=False, int seed=0, "
      "int offset=0) -> (Tensor packed, Tensor scale)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool, int64_t,
                                                       int64_t);

  static void check(const at::Tensor& x, int64_t bits, bool, int64_t, int64_t offset) {
    constexpr const char* fn = "qtrain::quantize_symmetric_rows4";
    checks::quantizer_input(fn, x, bits, 4, offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeSymmetricRows4>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeSymmetricRows4>(m);
}
