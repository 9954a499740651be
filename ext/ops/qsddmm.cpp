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
    constexpr const char* fn = "qtrain::qsddmm";
    TORCH_CHECK_VALUE(op == c10::string_view("add") || op == c10::string_view("sub") ||
                          op == c10::string_view("mul") || op == c10::string_view("dot"),
                      fn, ": op must be one of 'add', 'sub', 'mul', 'dot', got '", op, "'");
    checks::int8_rows(fn, "q_lhs", q_lhs);
    const at::Device device = q_lhs.device();
    checks::int8_rows(fn, "q_rhs", q_rhs);
    checks::same_device(fn, "q_rhs", q_rhs, "q_lhs", device);
    checks::index(fn, "lhs_index", lhs_index);
    checks::same_device(fn, "lhs_index", lhs_index, "q_lhs", device);
    checks::index(fn, "rhs_index", rhs_index);
    checks::same_device(fn, "rhs_index", rhs_index, "q_lhs", device);
    TORCH_CHECK_VALUE(q_lhs.sizes().slice(1) == q_rhs.sizes().slice(1), fn,
                      ": q_lhs and q_rhs need the same trailing shape, got ", q_lhs.sizes(),
                      " and ", q_rhs.sizes());
    TORCH_CHECK_VALUE(lhs_index.numel() == rhs_index.numel(), fn, ": lhs_index has ",
                      lhs_index.numel(), " entries, rhs_index ", rhs_index.numel());
    const int64_t heads = q_lhs.dim() == 3 ? q_lhs.size(1) : 1;
    checks::row_scale(fn, "row_scale_lhs", "q_lhs", device, q_lhs.size(0), heads, row_scale_lhs);
    checks::row_scale(fn, "row_scale_rhs", "q_rhs", device, q_rhs.size(0), heads, row_scale_rhs);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QSddmm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::QSddmm>(m); }
