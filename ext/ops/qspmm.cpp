// qspmm: quantized SpMM over the rows of a CSR graph (tango-sc23 sec. 3.2-3.3).
// Reference: qtrain/ops/sparse.py reference_qspmm; kernels: cpu/qspmm_kernel.cpp,
// cuda/qspmm_kernel.cu.
//
//   copy (no weight): out[r] = fl32(float(sum_k q[indices[k]]) * scale)       exact int sum
//   weighted:         acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))
//                     out[r] = fl32(acc[r] * scale)                   float32, CSR order
//
// Row r's entries are indptr[r] .. indptr[r + 1]; q is int8 [N, D] or [N, H, D] and
// out float32 [rows, D] or [rows, H, D]; weight is [E], [E, 1] (one per edge) or
// [E, H], [E, H, 1] (one per head), of any real dtype (taken as float32); without
// eids entry k uses weight row k. indptr, indices and eids may mix int32 and int64
// (the kernels promote them to one type). The kernels refuse what only the data
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
      " Tensor? eids=None) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&);

  static void check(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                    double, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& eids) {
    constexpr const char* fn = "qtrain::qspmm";
    checks::index(fn, "indptr", indptr);
    const at::Device device = indptr.device();
    checks::index(fn, "indices", indices);
    checks::same_device(fn, "indices", indices, "indptr", device);
    checks::int8_rows(fn, "q", q);
    checks::same_device(fn, "q", q, "indptr", device);
    TORCH_CHECK_VALUE(indptr.numel() >= 1, fn, ": indptr needs at least one entry (rows + 1)");
    const int64_t nnz = indices.numel();
    const bool has_eids = eids.has_value() && eids->defined();
    if (has_eids) {
      checks::index(fn, "eids", *eids);
      checks::same_device(fn, "eids", *eids, "indptr", device);
      TORCH_CHECK_VALUE(eids->numel() == nnz, fn, ": eids has ", eids->numel(),
                        " entries, indices ", nnz);
    }
    if (weight.has_value() && weight->defined()) {
      const at::Tensor& w = *weight;
      checks::dense(fn, "weight", w);
      checks::same_device(fn, "weight", w, "indptr", device);
      TORCH_CHECK_TYPE(!at::isComplexType(w.scalar_type()) && w.scalar_type() != at::kBool, fn,
                       ": weight must be a real (float32) tensor, got ",
                       checks::dtype_name(w.scalar_type()));
      const int64_t heads = q.dim() == 3 ? q.size(1) : 1;
      const int64_t per_edge = w.dim() >= 2 ? w.size(1) : 1;
      const bool shape_ok = (w.dim() == 1 || w.dim() == 2 || (w.dim() == 3 && w.size(2) == 1)) &&
                            (per_edge == 1 || per_edge == heads);
      TORCH_CHECK_VALUE(shape_ok, fn, ": weight must have shape [E], [E, 1], [E, ", heads,
                        "] or [E, ", heads, ", 1], got ", w.sizes());
      TORCH_CHECK_VALUE(has_eids || w.size(0) >= nnz, fn, ": weight has ", w.size(0),
                        " rows but there are ", nnz, " entries and no eids");
    }
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QSpmm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::QSpmm>(m); }
