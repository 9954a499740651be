// int8_gemm_int32: INT8 GEMM with exact int32 output (GCINT's dense product: int8
// operands, int32 accumulation, no dequantization; gcint sec. 3.2).
// Reference: qtrain/ops/integer.py reference_int_gemm; kernels:
// cpu/int8_gemm_int32_kernel.cpp, cuda/int8_gemm_int32_kernel.cu (int8_gemm's kernels with
// an int32 store).
//
//   "nn": C[M,N] = A[M,K] @ B[K,N]   "nt": A[M,K] @ B[N,K]^T   "tn": A[K,M]^T @ B[K,N]
//   C = saturate_int32(sum_k qa * qb), int32 [M, N]
//
// The sum is exact (|qa * qb| <= 2^14); it can leave int32 only when K > 131071, and then
// saturates at -2^31 or 2^31 - 1 instead of wrapping. qa, qb int8 2-d, any strides.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Int8GemmInt32 {
  static constexpr const char* kName = "int8_gemm_int32";
  static constexpr const char* kSchema =
      "int8_gemm_int32(Tensor qa, Tensor qb, str layout) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);

  static void check(const at::Tensor& qa, const at::Tensor& qb, c10::string_view layout) {
    constexpr const char* fn = "qtrain::int8_gemm_int32";
    checks::gemm_layout(fn, layout);
    checks::gemm_operand(fn, "qa", qa, at::kChar);
    checks::gemm_operand(fn, "qb", qb, at::kChar);
    checks::same_device(fn, "qb", qb, "qa", qa.device());
    checks::gemm_columns(fn, layout, "qa", qa, "qb", qb);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Int8GemmInt32>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::Int8GemmInt32>(m);
}
