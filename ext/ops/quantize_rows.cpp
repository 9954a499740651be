// quantize_rows: per-row quantization of float32 rows [rows, width] to 1, 2, 4 or 8 bits
// (the exact plugin's activation compression, exact-iclr22). Reference:
// qtrain/quant/rowwise.py quantize_rows; kernels: cpu/quantize_rows_kernel.cpp,
// cuda/quantize_rows_kernel.cu (the codec itself: cpu/rowwise.h, cuda/rowwise.cuh).
//
//   (packed uint8 [ceil(rows * width * bits / 8)], zero bf16 [rows], range bf16 [rows]):
//   each row's values relative to its bfloat16 zero point and range, as one dense
//   little-endian bit stream; stochastic rounding draws u_i from the counter stream at
//   (seed, offset + i). Non-finite rows are not refused: they dequantize to NaN rows.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeRows {
  static constexpr const char* kName = "quantize_rows";
  static constexpr const char* kSchema =
      "quantize_rows(Tensor x, int bits, bool stochastic=True, int seed=0, int offset=0)"
      " -> (Tensor packed, Tensor zero, Tensor range)";
  using Signature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, int64_t,
                                                                   bool, int64_t, int64_t);

  static void check(const at::Tensor& x, int64_t bits, bool, int64_t, int64_t offset) {
    constexpr const char* fn = "qtrain::quantize_rows";
    checks::pack_bits_in(fn, bits);
    checks::float_rows(fn, "x", x);
    checks::element_count(fn, x.numel());
    checks::counter_range(fn, x.numel(), offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeRows>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeRows>(m);
}
