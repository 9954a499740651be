// qsddmm4: qsddmm over rows of 4-bit values packed two per byte (issue 32, packed storage).
// Reference: qtrain/ops/sparse.py reference_qsddmm4 (= reference_qsddmm of
// qtrain/quant/packed.py unpack_int4 of each side); kernels: cpu/qsddmm4_kernel.cpp,
// cuda/qsddmm4_kernel.cu; Python front qtrain/ops/sparse.py qsddmm_packed.
//
//   qsddmm4(op, packed_lhs, scale_lhs, lhs_index, packed_rhs, scale_rhs, rhs_index, width,
//           row_scale_lhs, row_scale_rhs)
//     == qsddmm(op, unpack_int4(packed_lhs, width), scale_lhs, lhs_index,
//               unpack_int4(packed_rhs, width), scale_rhs, rhs_index, row_scale_lhs,
//               row_scale_rhs)
//   bit for bit
//
// packed_lhs and packed_rhs are uint8 with the same trailing shape [ceil(width / 2)] or
// [H, ceil(width / 2)] (pack_int4's layout: value j of a row in byte j / 2, the low nibble
// for an even j, 4-bit two's complement; past an odd width the high nibble is ignored). The
// output and the other arguments, and what the kernels refuse, are qsddmm's
// (ops/qsddmm.cpp).
#include "common/checks.h"
#include "common/front.h"

#include <c10/util/string_view.h>

#include <optional>

namespace qtrain {
namespace {

struct QSddmm4 {
  static constexpr const char* kName = "qsddmm4";
  static constexpr const char* kSchema =
      "qsddmm4(str op, Tensor packed_lhs, float scale_lhs, Tensor lhs_index, Tensor packed_rhs,"
      " float scale_rhs, Tensor rhs_index, int width, Tensor? row_scale_lhs=None,"
      " Tensor? row_scale_rhs=None) -> Tensor";
  using Signature = at::Tensor(c10::string_view, const at::Tensor&, double, const at::Tensor&,
                               const at::Tensor&, double, const at::Tensor&, int64_t,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&);

  static void check(c10::string_view op, const at::Tensor& packed_lhs, double,
                    const at::Tensor& lhs_index, const at::Tensor& packed_rhs, double,
                    const at::Tensor& rhs_index, int64_t width,
                    const std::optional<at::Tensor>& row_scale_lhs,
                    const std::optional<at::Tensor>& row_scale_rhs) {
    constexpr const char* fn = "qtrain::qsddmm4";
    checks::sddmm(fn, op, true, "packed_lhs", packed_lhs, lhs_index, "packed_rhs", packed_rhs,
                  rhs_index, row_scale_lhs, row_scale_rhs);
    checks::int4_width(fn, packed_lhs, width, "packed_lhs");
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QSddmm4>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::QSddmm4>(m); }
