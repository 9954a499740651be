// int8_block_gemm: the "tn" INT8 GEMM with one scale per block of `block` rows of each
// operand's columns: the weight gradient X^T dY when X and dY were quantized by
// quantize_symmetric_cols with that block (a sum over every node, where one scale per
// column leaves a 2-bit column of 169,343 nodes with almost every value rounded to 0).
// Reference: qtrain/ops/gemm.py reference_block_gemm; kernels: cpu/int8_block_gemm_kernel.cpp
// (cpu/int8_gemm_kernel.cpp gemm_tn_blocks), cuda/int8_block_gemm_kernel.cu.
//
//   C[m, n] = sum over blocks b = 0 .. ceil(K / block) - 1 of
//             fl32(float(acc_b[m, n]) * fl32(scale_a[b, m] * scale_b[b, n]))
//   (in float32, in the order common/block_gemm.h fixes: blocks in groups, groups in order)
//   acc_b[m, n] = sum over k in [b * block, min((b + 1) * block, K)) of qa[k, m] * qb[k, n]
//
// qa [K, M], qb [K, N] int8; scale_a [ceil(K / block), M], scale_b [ceil(K / block), N]
// float32, on qa's device; block in 1..65536 (acc_b is exact in int32). The block sums are
// exact and the float32 additions the reference's, in its order, on every device and for any
// thread count: bit for bit. K = 0 gives zeros.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

constexpr const char* kFn = "qtrain::int8_block_gemm";

void block_scales(const char* name, const at::Tensor& s, int64_t blocks, int64_t n,
                  const at::Device& device) {
  checks::dense(kFn, name, s);
  checks::dtype(kFn, name, s, at::kFloat);
  TORCH_CHECK_VALUE(s.dim() == 2 && s.size(0) == blocks && s.size(1) == n, kFn, ": ", name,
                    " must have shape (", blocks, ", ", n, ") (one scale per block of rows ",
                    "of each column), got ", s.sizes());
  checks::same_device(kFn, name, s, "qa", device);
}

struct Int8BlockGemm {
  static constexpr const char* kName = "int8_block_gemm";
  static constexpr const char* kSchema =
      "int8_block_gemm(Tensor qa, Tensor qb, Tensor scale_a, Tensor scale_b, int block) -> "
      "Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, int64_t);

  static void check(const at::Tensor& qa, const at::Tensor& qb, const at::Tensor& scale_a,
                    const at::Tensor& scale_b, int64_t block) {
    TORCH_CHECK_VALUE(block >= 1 && block <= 65536, kFn,
                      ": block must be an integer in 1..65536, got ", block);
    checks::gemm_operand(kFn, "qa", qa, at::kChar);
    checks::gemm_operand(kFn, "qb", qb, at::kChar);
    checks::same_device(kFn, "qb", qb, "qa", qa.device());
    checks::gemm_columns(kFn, "tn", "qa", qa, "qb", qb);
    const int64_t blocks = (qa.size(0) + block - 1) / block;
    block_scales("scale_a", scale_a, blocks, qa.size(1), qa.device());
    block_scales("scale_b", scale_b, blocks, qb.size(1), qa.device());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Int8BlockGemm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::Int8BlockGemm>(m);
}
