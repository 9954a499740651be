// dequantize_unproject_rows: float32 [rows, d] back from project_quantize_rows: the
// rows dequantized to k columns, then multiplied by R^T (the same [d, k] Rademacher
// matrix, signed sums in input order) without materializing them. Reference:
// qtrain/quant/rowwise.py dequantize_rows, then qtrain/quant/projection.py
// unproject_rows; kernels: cpu/dequantize_unproject_rows_kernel.cpp,
// cuda/dequantize_unproject_rows_kernel.cu.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct DequantizeUnprojectRows {
  static constexpr const char* kName = "dequantize_unproject_rows";
  static constexpr const char* kSchema =
      "dequantize_unproject_rows(Tensor packed, Tensor zero, Tensor range, int bits, int k,"
      " int d, int seed=0, int projection_offset=0) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                               int64_t, int64_t, int64_t, int64_t);

  static void check(const at::Tensor& packed, const at::Tensor& zero, const at::Tensor& range,
                    int64_t bits, int64_t k, int64_t d, int64_t, int64_t projection_offset) {
    constexpr const char* fn = "qtrain::dequantize_unproject_rows";
    checks::projection(fn, d, k, projection_offset);
    const int64_t rows = checks::quantized_rows(fn, packed, zero, range, bits, k);
    checks::rows_times(fn, rows, d, "d");
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::DequantizeUnprojectRows>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::DequantizeUnprojectRows>(m);
}
