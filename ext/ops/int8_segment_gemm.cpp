// int8_segment_gemm: the INT8 typed (per-relation) segment GEMM of relational GNNs, the
// quantized segment_matmul (ops/segment_matmul.cpp) of tango's relational layers. Rows
// offsets[r] .. offsets[r + 1] (seg r) of qa belong to relation r:
//
//   "nn": out[seg r] = int8_gemm(qa[seg r], qb[r], scale, "nn")   qa [N, K], qb [R, K, M] -> [N, M]
//   "nt": out[seg r] = int8_gemm(qa[seg r], qb[r], scale, "nt")   qa [N, M], qb [R, K, M] -> [N, K]
//   "tn": out[r] = int8_gemm(qa[seg r], qb[seg r], scale, "tn")   qa [N, K], qb [N, M] -> [R, K, M]
//
// each element fl32(float(sum_k qa * qb) * fl32(scale)), float32, bit for bit int8_gemm's
// (ops/int8_gemm.cpp) for its segment; a "tn" relation without rows gives zeros. qa, qb int8,
// one device, any strides. offsets: int64 [R + 1] on the CPU for every device, 0 first,
// non-decreasing, N last (the values checked by the kernels, which read them). Reference:
// qtrain/ops/typed.py reference_int8_segment_gemm; kernels: cpu/int8_segment_gemm_kernel.cpp,
// cuda/int8_segment_gemm_kernel.cu (both the loop of common/int8_segment_gemm.h).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Int8SegmentGemm {
  static constexpr const char* kName = "int8_segment_gemm";
  static constexpr const char* kSchema =
      "int8_segment_gemm(Tensor qa, Tensor qb, Tensor offsets, float scale, str layout)"
      " -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                               c10::string_view);

  static void check(const at::Tensor& qa, const at::Tensor& qb, const at::Tensor& offsets,
                    double, c10::string_view layout) {
    constexpr const char* fn = "qtrain::int8_segment_gemm";
    checks::gemm_layout(fn, layout);
    checks::gemm_operand(fn, "qa", qa, at::kChar);
    checks::dense(fn, "qb", qb);
    checks::dtype(fn, "qb", qb, at::kChar);
    const int64_t relations = checks::segment_offsets(fn, offsets);
    checks::same_device(fn, "qb", qb, "qa", qa.device());
    if (layout == "tn") {
      TORCH_CHECK_VALUE(qb.dim() == 2, fn, ": qb must be 2-d [N, M] for layout 'tn', got shape ",
                        qb.sizes());
      TORCH_CHECK_VALUE(qb.size(0) == qa.size(0), fn, ": qb has ", qb.size(0),
                        " rows but qa has ", qa.size(0));
      return;
    }
    TORCH_CHECK_VALUE(qb.dim() == 3, fn, ": qb must be 3-d [R, K, M] for layout '", layout,
                      "', got shape ", qb.sizes());
    TORCH_CHECK_VALUE(qb.size(0) == relations, fn, ": qb has ", qb.size(0),
                      " relations but offsets give R = ", relations, " (qb shape ", qb.sizes(),
                      ", offsets shape ", offsets.sizes(), ")");
    // "nn": qa's columns are K (qb's dim 1); "nt": they are M (qb's dim 2)
    const bool nn = layout == "nn";
    const int64_t inner = qb.size(nn ? 1 : 2);
    TORCH_CHECK_VALUE(inner == qa.size(1), fn, ": qa has ", nn ? "K" : "M", " = ", qa.size(1),
                      " columns but qb [R, K, M] of shape ", qb.sizes(), " has ", nn ? "K" : "M",
                      " = ", inner, " (layout '", layout, "')");
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Int8SegmentGemm>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::Int8SegmentGemm>(m);
}
