// quantize_symmetric_rows: symmetric quantization with one scale per row of a 2-d x.
// Reference: qtrain/quant/granular.py quantize_rows_symmetric (quantize_tiles with
// tile (1, cols)); kernels: cpu/quantize_symmetric_rows_kernel.cpp,
// cuda/quantize_symmetric_rows_kernel.cu.
//
//   (q int8 of x's shape, scale float32 [rows, 1]), x[i] ~ q[i] * scale[i]; bits 2..8.
//   Row i is quantize_symmetric (ops/quantize_symmetric.cpp) of row i alone, with the
//   counters of its elements' flat indices in x: element (i, j) draws u from the
//   counter stream at (seed, offset + i * cols + j). A row of zeros (and every row of
//   an x without columns) gets scale 0 and q 0. x must be finite (the kernels refuse
//   NaN / Inf, which only the data shows).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeSymmetricRows {
  static constexpr const char* kName = "quantize_symmetric_rows";
  static constexpr const char* kSchema =
      "quantize_symmetric_rows(Tensor x, int bits, bool stochastic=False, int seed=0, "
      "int offset=0) -> (Tensor q, Tensor scale)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool, int64_t,
                                                       int64_t);

  static void check(const at::Tensor& x, int64_t bits, bool, int64_t, int64_t offset) {
    constexpr const char* fn = "qtrain::quantize_symmetric_rows";
    checks::quantizer_input(fn, x, bits, 8, offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeSymmetricRows>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeSymmetricRows>(m);
}
