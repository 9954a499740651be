// scatter_rows_add: the transposed product of a 0/1 CSR matrix, a block of its rows at a
// time: every row r of x added onto the rows of out that row r's entries name.
// Reference: qtrain/ops/scatter.py reference_scatter_rows_add; kernels:
// cpu/scatter_rows_add_kernel.cpp, cuda/scatter_rows_add_kernel.cu.
//
//   out[indices[k]] += x[r]        r = 0 .. R - 1, k = indptr[r] .. indptr[r + 1]
//
// out float32 [N, D], contiguous, written in place; x float32 [R, D] with R = indptr.numel()
// - 1. indptr may be a row range of a larger CSR (indptr[a : b + 1] with the whole indices):
// it need not start at 0 nor end at indices.numel(), and only indices[indptr[0] ..
// indptr[R]) is read. indptr and indices may mix int32 and int64. The kernels refuse what
// only the data shows, before anything is added (out is then left as it was):
// indptr[0] < 0, a decrease, indptr[R] > indices.numel(), an index read outside out's rows.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct ScatterRowsAdd {
  static constexpr const char* kName = "scatter_rows_add";
  static constexpr const char* kSchema =
      "scatter_rows_add(Tensor(a!) out, Tensor indptr, Tensor indices, Tensor x) -> ()";
  using Signature = void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&);

  static void check(const at::Tensor& out, const at::Tensor& indptr, const at::Tensor& indices,
                    const at::Tensor& x) {
    constexpr const char* fn = "qtrain::scatter_rows_add";
    checks::dense(fn, "out", out);
    checks::dtype(fn, "out", out, at::kFloat);
    TORCH_CHECK_VALUE(out.dim() == 2, fn, ": out must have shape [N, D], got ", out.sizes());
    TORCH_CHECK_VALUE(out.is_contiguous(), fn,
                      ": out must be a contiguous tensor (it is written in place)");
    const at::Device device = out.device();
    checks::index(fn, "indptr", indptr);
    checks::same_device(fn, "indptr", indptr, "out", device);
    checks::index(fn, "indices", indices);
    checks::same_device(fn, "indices", indices, "out", device);
    checks::dense(fn, "x", x);
    checks::dtype(fn, "x", x, at::kFloat);
    TORCH_CHECK_VALUE(x.dim() == 2, fn, ": x must have shape [R, D], got ", x.sizes());
    checks::same_device(fn, "x", x, "out", device);
    TORCH_CHECK_VALUE(indptr.numel() >= 1, fn, ": indptr needs at least one entry (rows + 1)");
    TORCH_CHECK_VALUE(x.size(0) == indptr.numel() - 1, fn,
                      ": x must have one row per row of indptr (", indptr.numel() - 1,
                      "), got ", x.size(0));
    TORCH_CHECK_VALUE(x.size(1) == out.size(1), fn, ": x and out must have one width, got ",
                      x.size(1), " and ", out.size(1));
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::ScatterRowsAdd>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::ScatterRowsAdd>(m);
}
