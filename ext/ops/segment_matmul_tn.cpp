// segment_matmul_tn: the weight gradient of segment_matmul (ops/segment_matmul.cpp), per
// relation r over its rows offsets[r] .. offsets[r + 1]:
//
//   out[r] = x[offsets[r] : offsets[r + 1]]^T @ grad[offsets[r] : offsets[r + 1]]   out [R, K, M]
//
// zeros for a relation without rows. x [N, K] and grad [N, M]: one floating dtype, one
// device, any strides; offsets as segment_matmul's (int64 [R + 1] on the CPU, 0 first,
// non-decreasing, N last; the values checked by the kernels). Reference:
// qtrain/ops/typed.py reference_segment_matmul_tn; kernels: cpu/segment_matmul_tn_kernel.cpp,
// cuda/segment_matmul_tn_kernel.cu (common/segment_matmul.h).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct SegmentMatmulTn {
  static constexpr const char* kName = "segment_matmul_tn";
  static constexpr const char* kSchema =
      "segment_matmul_tn(Tensor x, Tensor offsets, Tensor grad) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);

  static void check(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& grad) {
    constexpr const char* fn = "qtrain::segment_matmul_tn";
    checks::float_matrix(fn, "x", x);
    checks::segment_offsets(fn, offsets);
    checks::dense(fn, "grad", grad);
    checks::same_dtype(fn, "grad", grad, "x", x);
    TORCH_CHECK_VALUE(grad.dim() == 2, fn, ": grad must be 2-d, got shape ", grad.sizes());
    checks::same_device(fn, "grad", grad, "x", x.device());
    TORCH_CHECK_VALUE(grad.size(0) == x.size(0), fn, ": grad has ", grad.size(0),
                      " rows but x has ", x.size(0));
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::SegmentMatmulTn>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::SegmentMatmulTn>(m);
}
