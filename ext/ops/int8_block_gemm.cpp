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
// qa [K, M], qb [K, N] int8, or either stored packed: 4-bit values two a byte (uint8
// [K, ceil(M / 2)], pack_int4's layout; a packed width is its scales' columns), read as they
// are, no int8 copy made; scale_a [ceil(K / block), M], scale_b [ceil(K / block), N] float32,
// on qa's device; block in 1..65536 (acc_b is exact in int32). The block sums are exact and
// the float32 additions the reference's, in its order, on every device and for any thread
// count: bit for bit, packed or not. K = 0 gives zeros.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

constexpr const char* kFn = "qtrain::int8_block_gemm";

// The columns of operand `name`: an int8 one's, or a packed one's (uint8, two 4-bit values a
// byte: its scales' columns, which its bytes must hold).
int64_t operand_width(const char* name, const at::Tensor& q, const char* scale_name,
                      const at::Tensor& scale) {
  checks::dense(kFn, name, q);
  TORCH_CHECK_TYPE(q.scalar_type() == at::kChar || q.scalar_type() == at::kByte, kFn, ": ",
                   name, " must be int8, or uint8 holding 4-bit values packed two a byte, got ",
                   checks::dtype_name(q.scalar_type()));
  TORCH_CHECK_VALUE(q.dim() == 2, kFn, ": ", name, " must be 2-d, got shape ", q.sizes());
  if (q.scalar_type() == at::kChar) return q.size(1);
  TORCH_CHECK_VALUE(scale.dim() == 2, kFn, ": ", scale_name, " must be 2-d (one scale per ",
                    "block of rows of each column), got shape ", scale.sizes());
  const int64_t width = scale.size(1);
  TORCH_CHECK_VALUE(q.size(1) == (width + 1) / 2, kFn, ": ", name, " is packed (uint8, two ",
                    "4-bit values a byte), so its ", scale_name, "'s ", width, " columns need ",
                    (width + 1) / 2, " bytes a row, got ", q.size(1));
  return width;
}

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
    const int64_t m = operand_width("qa", qa, "scale_a", scale_a);
    const int64_t n = operand_width("qb", qb, "scale_b", scale_b);
    checks::same_device(kFn, "qb", qb, "qa", qa.device());
    checks::gemm_columns(kFn, "tn", "qa", qa, "qb", qb);
    const int64_t blocks = (qa.size(0) + block - 1) / block;
    block_scales("scale_a", scale_a, blocks, m, qa.device());
    block_scales("scale_b", scale_b, blocks, n, qa.device());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Int8BlockGemm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::Int8BlockGemm>(m);
}
