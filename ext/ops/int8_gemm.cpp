// int8_gemm: INT8 GEMM with the dequantization (and bias) fused into the output.
// Reference: qtrain/ops/gemm.py reference_int8_gemm; kernels: cpu/int8_gemm_kernel.cpp,
// cuda/int8_gemm_kernel.cu.
//
//   "nn": C[M,N] = A[M,K] @ B[K,N]   "nt": A[M,K] @ B[N,K]^T   "tn": A[K,M]^T @ B[K,N]
//   C = fl32(float(sum_k qa * qb) * f[m, n]) (+ bias[n] as float32), float32 [M, N]
//   f[m, n] = fl32(fl32(fl32(scale) * row_scale[m]) * col_scale[n])
//
// qa, qb int8 2-d, stored as the layout says (any strides); bias floating 1-d of N;
// row_scale float32 (M,), col_scale float32 (N,), each optional (absent: 1, so without
// either f = fl32(scale), the per-tensor product): per-row / per-column quantization
// scales (qtrain.ops.quantize quantize_per_row / quantize_per_column), which never vary
// along K, so the sum stays one exact integer.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Int8Gemm {
  static constexpr const char* kName = "int8_gemm";
  static constexpr const char* kSchema =
      "int8_gemm(Tensor qa, Tensor qb, float scale, str layout, Tensor? bias=None, "
      "Tensor? row_scale=None, Tensor? col_scale=None) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, double, c10::string_view,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&);

  static void check(const at::Tensor& qa, const at::Tensor& qb, double, c10::string_view layout,
                    const std::optional<at::Tensor>& bias,
                    const std::optional<at::Tensor>& row_scale,
                    const std::optional<at::Tensor>& col_scale) {
    constexpr const char* fn = "qtrain::int8_gemm";
    checks::gemm_layout(fn, layout);
    checks::gemm_operand(fn, "qa", qa, at::kChar);
    checks::gemm_operand(fn, "qb", qb, at::kChar);
    checks::same_device(fn, "qb", qb, "qa", qa.device());
    const int64_t n = checks::gemm_columns(fn, layout, "qa", qa, "qb", qb);
    checks::gemm_bias(fn, bias, n, "qa", qa.device());
    const int64_t m = layout == "tn" ? qa.size(1) : qa.size(0);
    checks::gemm_scale_vector(fn, "row_scale", row_scale, m, "qa", qa.device());
    checks::gemm_scale_vector(fn, "col_scale", col_scale, n, "qa", qa.device());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Int8Gemm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::Int8Gemm>(m); }
