// quantize_symmetric_cols: symmetric quantization with one scale per column of a 2-d x, or
// per block of `block` rows of each column, q in x's own layout (no transpose).
// Reference: qtrain/quant/granular.py quantize_cols_symmetric (quantize_tiles with
// tile (rows, 1)); kernels: cpu/quantize_symmetric_cols_kernel.cpp,
// cuda/quantize_symmetric_cols_kernel.cu.
//
//   (q int8 of x's shape, scale float32 [1, cols]), x[:, j] ~ q[:, j] * scale[j]; bits 2..8.
//   Column j is quantize_symmetric (ops/quantize_symmetric.cpp) of column j alone, with
//   the counters of its elements' flat indices in x: element (i, j) draws u from the
//   counter stream at (seed, offset + i * cols + j). A column of zeros (and every column
//   of an x without rows) gets scale 0 and q 0. x must be finite (the kernels refuse
//   NaN / Inf, which only the data shows).
//   block > 0: the same rule for every block of rows [b * block, (b + 1) * block) of each
//   column (counters unchanged: the element's flat index); scale float32
//   [ceil(rows / block), cols] (quantize_tiles with tile (block, 1); [0, cols] without rows).
//   The operands of int8_block_gemm.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeSymmetricCols {
  static constexpr const char* kName = "quantize_symmetric_cols";
  static constexpr const char* kSchema =
      "quantize_symmetric_cols(Tensor x, int bits, bool stochastic=False, int seed=0, "
      "int offset=0, int block=0) -> (Tensor q, Tensor scale)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool, int64_t,
                                                       int64_t, int64_t);

  static void check(const at::Tensor& x, int64_t bits, bool, int64_t, int64_t offset,
                    int64_t block) {
    constexpr const char* fn = "qtrain::quantize_symmetric_cols";
    checks::column_block(fn, block);
    checks::quantizer_input(fn, x, bits, 8, offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeSymmetricCols>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeSymmetricCols>(m);
}
