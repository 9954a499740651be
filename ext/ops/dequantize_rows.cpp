// dequantize_rows: float32 rows [rows, width] back from quantize_rows's (packed, zero,
// range): fl32(fl32(float(q) * fl32(range / B)) + zero), B = 2^bits - 1. Reference:
// qtrain/quant/rowwise.py dequantize_rows; kernels: cpu/dequantize_rows_kernel.cpp,
// cuda/dequantize_rows_kernel.cu. rows = zero.numel(); packed may be longer than needed.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct DequantizeRows {
  static constexpr const char* kName = "dequantize_rows";
  static constexpr const char* kSchema =
      "dequantize_rows(Tensor packed, Tensor zero, Tensor range, int bits, int width) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                               int64_t);

  static void check(const at::Tensor& packed, const at::Tensor& zero, const at::Tensor& range,
                    int64_t bits, int64_t width) {
    checks::quantized_rows("qtrain::dequantize_rows", packed, zero, range, bits, width);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::DequantizeRows>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::DequantizeRows>(m);
}
