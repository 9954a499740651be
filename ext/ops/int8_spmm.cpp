// int8_spmm: SpMM with int8 edge values and int8 rows, exact int32 sums (GCINT's sparse
// product, gcint eq. 1: the adjacency quantized to int8, no dequantization).
// Reference: qtrain/ops/integer.py reference_int_spmm; kernels: cpu/int8_spmm_kernel.cpp,
// cuda/int8_spmm_kernel.cu.
//
//   out[r] = saturate_int32(sum_k values[k] * q[indices[k]])     k = indptr[r] .. indptr[r+1]
//
// q int8 [N, D]; values int8 [E], one per entry in CSR order; out int32 [rows, D]. The sum
// is exact; it can leave int32 only for a row of more than 131071 entries, and then
// saturates. indptr and indices may mix int32 and int64. The kernels refuse what only the
// data shows: indptr not starting at 0, decreasing or not ending at the number of entries;
// an index outside q's rows.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Int8Spmm {
  static constexpr const char* kName = "int8_spmm";
  static constexpr const char* kSchema =
      "int8_spmm(Tensor indptr, Tensor indices, Tensor values, Tensor q) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&);

  static void check(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                    const at::Tensor& q) {
    constexpr const char* fn = "qtrain::int8_spmm";
    checks::index(fn, "indptr", indptr);
    const at::Device device = indptr.device();
    checks::index(fn, "indices", indices);
    checks::same_device(fn, "indices", indices, "indptr", device);
    checks::dense(fn, "values", values);
    checks::dtype(fn, "values", values, at::kChar);
    checks::same_device(fn, "values", values, "indptr", device);
    TORCH_CHECK_VALUE(values.dim() == 1 && values.numel() == indices.numel(), fn,
                      ": values must be 1-d with one entry per index (", indices.numel(),
                      "), got shape ", values.sizes());
    checks::dense(fn, "q", q);
    checks::dtype(fn, "q", q, at::kChar);
    TORCH_CHECK_VALUE(q.dim() == 2, fn, ": q must have shape [N, D], got ", q.sizes());
    checks::same_device(fn, "q", q, "indptr", device);
    TORCH_CHECK_VALUE(indptr.numel() >= 1, fn, ": indptr needs at least one entry (rows + 1)");
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Int8Spmm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::Int8Spmm>(m); }
