// quantize_symmetric_cols4: quantize_symmetric_cols at 2 to 4 bits, x's rows written as 4-bit
// values packed two per byte (issue 32, packed storage: the X columns a GEMM keeps for its
// weight gradient, which int8_block_gemm reads packed). Reference: qtrain/ops/quantize.py
// reference_quantize_cols4; kernels: cpu/quantize_symmetric_cols4_kernel.cpp,
// cuda/quantize_symmetric_cols4_kernel.cu (quantize_symmetric_cols's code, through
// common/quantize_cols.h).
//
//   (packed uint8 [rows, ceil(cols / 2)], scale float32 [1 or ceil(rows / block), cols])
//     == (pack_int4(q), scale) of quantize_symmetric_cols(x, bits, stochastic, seed, offset,
//        block)   bit for bit
//
// Made in one pass over each row: the int8 values are never written out. x must be finite
// (the kernels refuse NaN / Inf, which only the data shows).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeSymmetricCols4 {
  static constexpr const char* kName = "quantize_symmetric_cols4";
  static constexpr const char* kSchema =
      "quantize_symmetric_cols4(Tensor x, int bits, bool stochastic=False, int seed=0, "
      "int offset=0, int block=0) -> (Tensor packed, Tensor scale)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool, int64_t,
                                                       int64_t, int64_t);

  static void check(const at::Tensor& x, int64_t bits, bool, int64_t, int64_t offset,
                    int64_t block) {
    constexpr const char* fn = "qtrain::quantize_symmetric_cols4";
    checks::column_block(fn, block);
    checks::quantizer_input(fn, x, bits, 4, offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeSymmetricCols4>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeSymmetricCols4>(m);
}
