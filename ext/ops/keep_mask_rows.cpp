// keep_mask_rows: the dropout keep-mask of a [rows, width] tensor whose row r belongs to
// global id ids[r]: element (r, j) is kept when (hash(seed, ids[r] * width + j) >> 8) >=
// threshold (0..2^24), packed 1 bit per element, row-major, little-endian (the layout of
// pack_bits(values, 1)). Reference: qtrain/ops/masks.py reference_keep_mask; kernels:
// cpu/keep_mask_rows_kernel.cpp, cuda/keep_mask_rows_kernel.cu. Each id must lie in
// [0, 2^62 / width) so its counters stay below 2^63: the kernels check that, as only the
// data shows it.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct KeepMaskRows {
  static constexpr const char* kName = "keep_mask_rows";
  static constexpr const char* kSchema =
      "keep_mask_rows(Tensor ids, int width, int threshold, int seed=0) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, int64_t, int64_t, int64_t);

  static void check(const at::Tensor& ids, int64_t width, int64_t threshold, int64_t) {
    constexpr const char* fn = "qtrain::keep_mask_rows";
    checks::dense(fn, "ids", ids);
    checks::dtype(fn, "ids", ids, at::kLong);
    TORCH_CHECK_VALUE(ids.dim() == 1, fn, ": ids must be 1-d, got shape ", ids.sizes());
    TORCH_CHECK_VALUE(width >= 0, fn, ": width must be >= 0, got ", width);
    TORCH_CHECK_VALUE(threshold >= 0 && threshold <= (int64_t{1} << 24), fn,
                      ": threshold must be in [0, 2^24], got ", threshold);
    TORCH_CHECK_VALUE(width == 0 || ids.numel() <= (int64_t{1} << 60) / width, fn,
                      ": rows * width too large: ", ids.numel(), " x ", width);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::KeepMaskRows>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::KeepMaskRows>(m);
}
