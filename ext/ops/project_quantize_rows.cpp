// project_quantize_rows: quantize_rows of x R, where R is the [d, k] normalized
// Rademacher matrix at counters (seed, projection_offset + i * k + j) and the product is
// the reference's signed sums in input order; the projected rows are never
// materialized. Reference: qtrain/quant/projection.py project_rows, then
// qtrain/quant/rowwise.py quantize_rows (rounding draws at offset); kernels:
// cpu/project_quantize_rows_kernel.cpp, cuda/project_quantize_rows_kernel.cu.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct ProjectQuantizeRows {
  static constexpr const char* kName = "project_quantize_rows";
  static constexpr const char* kSchema =
      "project_quantize_rows(Tensor x, int k, int bits, bool stochastic=True, int seed=0,"
      " int offset=0, int projection_offset=0) -> (Tensor packed, Tensor zero, Tensor range)";
  using Signature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, int64_t, int64_t, bool, int64_t, int64_t, int64_t);

  static void check(const at::Tensor& x, int64_t k, int64_t bits, bool, int64_t, int64_t offset,
                    int64_t projection_offset) {
    constexpr const char* fn = "qtrain::project_quantize_rows";
    checks::pack_bits_in(fn, bits);
    checks::float_rows(fn, "x", x);
    const int64_t rows = x.size(0), d = x.size(1);
    checks::projection(fn, d, k, projection_offset);
    checks::rows_times(fn, rows, k, "k");
    checks::counter_range(fn, rows * k, offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::ProjectQuantizeRows>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::ProjectQuantizeRows>(m);
}
