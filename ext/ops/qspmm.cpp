// qspmm: quantized SpMM over the rows of a CSR graph (tango-sc23 sec. 3.2-3.3).
// Reference: qtrain/ops/sparse.py reference_qspmm; kernels: cpu/qspmm_kernel.cpp,
// cuda/qspmm_kernel.cu.
//
//   copy (no weight): out[r] = fl32(float(sum_k q[indices[k]]) * scale)       exact int sum
//   weighted:         acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))
//                     out[r] = fl32(acc[r] * scale)                   float32, CSR order
//   row_scale given:  w[eids[k], h] above is fl32(w[eids[k], h] * row_scale[indices[k], h])
//                     (w taken as 1 without weight): q quantized with one scale per row
//                     (or row and head), the scales applied as the rows are gathered
//
// Row r's entries are indptr[r] .. indptr[r + 1]; q is int8 [N, D] or [N, H, D] and
// out float32 [rows, D] or [rows, H, D]; weight is [E], [E, 1] (one per edge) or
// [E, H], [E, H, 1] (one per head), of any real dtype (taken as float32); without
// eids entry k uses weight row k. indptr, indices and eids may mix int32 and int64
// (the kernels promote them to one type); row_scale is float32 [N_in], [N_in, 1] or
// [N_in, H] (one per row of q, or per row and head). The kernels refuse what only the data
// shows: indptr not starting at 0, decreasing or not ending at the number of
// entries; an index outside q's rows, an eid outside weight's rows.
#include "common/checks.h"
#include "common/front.h"

#include <optional>

namespace qtrain {
namespace {

struct QSpmm {
  static constexpr const char* kName = "qspmm";
  static constexpr const char* kSchema =
      "qspmm(Tensor indptr, Tensor indices, Tensor q, float scale, Tensor? weight=None,"
      " Tensor? eids=None, Tensor? row_scale=None) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&);

  static void check(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                    double, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& eids,
                    const std::optional<at::Tensor>& row_scale) {
    constexpr const char* fn = "qtrain::qspmm";
    checks::spmm_indices(fn, indptr, indices);
    checks::int8_rows(fn, "q", q);
    checks::same_device(fn, "q", q, "indptr", indptr.device());
    checks::spmm_weights(fn, indptr, indices, q.dim() == 3 ? q.size(1) : 1, weight, eids);
    checks::row_scale(fn, "row_scale", "q", q.device(), q.size(0), q.dim() == 3 ? q.size(1) : 1,
                      row_scale);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QSpmm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::QSpmm>(m); }
