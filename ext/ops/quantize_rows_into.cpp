// quantize_rows_into: quantize_rows of x[index] (all rows of x if index is None) written
// into the uint8 message segment `out`: the packed values, then the bfloat16 zeros, then
// the bfloat16 ranges (adaqp's halo messages: gathered, quantized and laid out in one
// pass into a buffer the caller reuses). Reference: qtrain/quant/rowwise.py
// quantize_rows_into / write_segment; kernels: cpu/quantize_rows_into_kernel.cpp,
// cuda/quantize_rows_into_kernel.cu. An index entry outside [0, x.size(0)) is found by
// the kernel (IndexError).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct QuantizeRowsInto {
  static constexpr const char* kName = "quantize_rows_into";
  static constexpr const char* kSchema =
      "quantize_rows_into(Tensor x, Tensor? index, int bits, bool stochastic, int seed,"
      " int offset, Tensor(a!) out) -> ()";
  using Signature = void(const at::Tensor&, const std::optional<at::Tensor>&, int64_t, bool,
                         int64_t, int64_t, const at::Tensor&);

  static void check(const at::Tensor& x, const std::optional<at::Tensor>& index, int64_t bits,
                    bool, int64_t, int64_t offset, const at::Tensor& out) {
    constexpr const char* fn = "qtrain::quantize_rows_into";
    checks::pack_bits_in(fn, bits);
    checks::float_rows(fn, "x", x);
    const int64_t width = x.size(1);
    int64_t rows = x.size(0);
    if (index.has_value()) {
      checks::row_index(fn, *index);
      checks::same_device(fn, "index", *index, "x", x.device());
      rows = index->numel();
    }
    checks::rows_times(fn, rows, width, "width");
    checks::counter_range(fn, rows * width, offset);
    checks::segment(fn, out, checks::segment_bytes(rows, width, bits));
    checks::same_device(fn, "out", out, "x", x.device());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QuantizeRowsInto>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::QuantizeRowsInto>(m);
}
