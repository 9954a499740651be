// segment_matmul: the typed (per-relation) segment GEMM of relational GNNs (Hector:
// one segment GEMM across all relations, no per-edge copy of the weights). Rows
// offsets[r] .. offsets[r + 1] of x [N, K] belong to relation r:
//
//   out[offsets[r] : offsets[r + 1]] = x[offsets[r] : offsets[r + 1]] @ W_r        out [N, M]
//
// with W_r = weight[r] (weight [R, K, M]) or weight[r]^T (weight [R, M, K], transpose_weight).
// x and weight: one floating dtype (float32, float64, float16, bfloat16), one device, any
// strides. offsets: int64 [R + 1] on the CPU for every device (the host loop reads them
// without a device sync); starting at 0, non-decreasing and ending at N, which the kernels
// check as they read them. Reference: qtrain/ops/typed.py reference_segment_matmul;
// kernels: cpu/segment_matmul_kernel.cpp, cuda/segment_matmul_kernel.cu (both the loop of
// common/segment_matmul.h); autograd: qtrain/ops/typed.py.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct SegmentMatmul {
  static constexpr const char* kName = "segment_matmul";
  static constexpr const char* kSchema =
      "segment_matmul(Tensor x, Tensor offsets, Tensor weight, bool transpose_weight=False)"
      " -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool);

  static void check(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& weight,
                    bool transpose_weight) {
    constexpr const char* fn = "qtrain::segment_matmul";
    checks::float_matrix(fn, "x", x);
    const int64_t relations = checks::segment_offsets(fn, offsets);
    checks::dense(fn, "weight", weight);
    checks::same_dtype(fn, "weight", weight, "x", x);
    TORCH_CHECK_VALUE(weight.dim() == 3, fn, ": weight must be 3-d, got shape ", weight.sizes());
    checks::same_device(fn, "weight", weight, "x", x.device());
    TORCH_CHECK_VALUE(weight.size(0) == relations, fn, ": weight has ", weight.size(0),
                      " relations but offsets give R = ", relations, " (weight shape ",
                      weight.sizes(), ", offsets shape ", offsets.sizes(), ")");
    const int64_t k = weight.size(transpose_weight ? 2 : 1);
    TORCH_CHECK_VALUE(k == x.size(1), fn, ": x has K = ", x.size(1), " columns but weight ",
                      transpose_weight ? "[R, M, K]" : "[R, K, M]", " of shape ",
                      weight.sizes(), " has K = ", k);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::SegmentMatmul>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::SegmentMatmul>(m);
}
