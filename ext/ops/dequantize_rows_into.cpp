// dequantize_rows_into: the `rows` rows of a quantize_rows_into segment dequantized into
// out[index] (out's rows in order if index is None), or added onto them with `add`:
// halo rows land where the layer reads them, gradients where their owner sums them.
// Reference: qtrain/quant/rowwise.py dequantize_rows_into; kernels:
// cpu/dequantize_rows_into_kernel.cpp, cuda/dequantize_rows_into_kernel.cu. An index
// entry outside [0, out.size(0)) (IndexError) or a row named twice (ValueError: each row
// may be written once) is found by the kernel.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct DequantizeRowsInto {
  static constexpr const char* kName = "dequantize_rows_into";
  static constexpr const char* kSchema =
      "dequantize_rows_into(Tensor segment, int rows, int bits, Tensor(a!) out, Tensor? index,"
      " bool add) -> ()";
  using Signature = void(const at::Tensor&, int64_t, int64_t, const at::Tensor&,
                         const std::optional<at::Tensor>&, bool);

  static void check(const at::Tensor& segment, int64_t rows, int64_t bits, const at::Tensor& out,
                    const std::optional<at::Tensor>& index, bool) {
    constexpr const char* fn = "qtrain::dequantize_rows_into";
    checks::pack_bits_in(fn, bits);
    checks::dense(fn, "out", out);
    TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat && out.dim() == 2, fn,
                     ": out must be a 2-d float32 tensor [rows, width], got ",
                     checks::dtype_name(out.scalar_type()), " ", out.sizes());
    TORCH_CHECK_VALUE(out.is_contiguous(), fn, ": out must be a contiguous tensor");
    TORCH_CHECK_VALUE(rows >= 0, fn, ": rows must be >= 0, got ", rows);
    const int64_t width = out.size(1);
    if (index.has_value()) {
      checks::row_index(fn, *index);
      TORCH_CHECK_VALUE(index->numel() == rows, fn, ": index has ", index->numel(),
                        " entries for ", rows, " rows");
    } else {
      TORCH_CHECK_VALUE(rows == out.size(0), fn, ": without an index the segment's ", rows,
                        " rows must fill out's ", out.size(0));
    }
    checks::rows_times(fn, rows, width, "width");
    checks::segment(fn, segment, checks::segment_bytes(rows, width, bits));
    checks::same_device(fn, "out", out, "segment", segment.device());
    if (index.has_value()) checks::same_device(fn, "index", *index, "segment", segment.device());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::DequantizeRowsInto>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::DequantizeRowsInto>(m);
}
