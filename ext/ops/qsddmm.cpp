// qsddmm: quantized SDDMM per edge (tango-sc23 sec. 3.3). Reference:
// qtrain/ops/sparse.py reference_qsddmm; kernels: cpu/qsddmm_kernel.cpp,
// cuda/qsddmm_kernel.cu. For edge e, i = lhs_index[e], j = rhs_index[e]:
//
//   add / sub: out[e] = fl32(q_l[i] * s_l) +/- fl32(q_r[j] * s_r)
//   mul:       out[e] = fl32(float(q_l[i] * q_r[j]) * fl32(s_l * s_r))
//   dot:       out[e, h, 0] = fl32(float(sum_d q_l[i,h,d] * q_r[j,h,d]) * fl32(s_l * s_r))
//
// s_l is scale_lhs, or with row_scale_lhs fl32(scale_lhs * row_scale_lhs[i, h]) (one scale per
// row of q_lhs, float32 [N_l], [N_l, 1], or per row and head [N_l, H]: the head's); s_r the
// same on the right.
//
// q_lhs and q_rhs are int8 with the same trailing shape [D] or [H, D]; add / sub / mul
// give float32 [E, *trailing], dot [E, 1] or [E, H, 1]. The two index tensors may mix
// int32 and int64 (the kernels promote them). The kernels refuse an index outside its
// operand's rows, which only the data shows.
#include "common/checks.h"
#include "common/front.h"

#include <c10/util/string_view.h>

#include <optional>

namespace qtrain {
namespace {

struct QSddmm {
  static constexpr const char* kName = "qsddmm";
  static constexpr const char* kSchema =
      "qsddmm(str op, Tensor q_lhs, float scale_lhs, Tensor lhs_index, Tensor q_rhs,"
      " float scale_rhs, Tensor rhs_index, Tensor? row_scale_lhs=None,"
      " Tensor? row_scale_rhs=None) -> Tensor";
  using Signature = at::Tensor(c10::string_view, const at::Tensor&, double, const at::Tensor&,
                               const at::Tensor&, double, const at::Tensor&,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&);

  static void check(c10::string_view op, const at::Tensor& q_lhs, double,
                    const at::Tensor& lhs_index, const at::Tensor& q_rhs, double,
                    const at::Tensor& rhs_index, const std::optional<at::Tensor>& row_scale_lhs,
                    const std::optional<at::Tensor>& row_scale_rhs) {
    checks::sddmm("qtrain::qsddmm", op, false, "q_lhs", q_lhs, lhs_index, "q_rhs", q_rhs,
                  rhs_index, row_scale_lhs, row_scale_rhs);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QSddmm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::QSddmm>(m); }
