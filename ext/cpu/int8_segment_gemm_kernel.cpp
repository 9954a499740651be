// int8_segment_gemm on the CPU (front: ops/int8_segment_gemm.cpp; reference
// qtrain/ops/typed.py reference_int8_segment_gemm): the host loop of
// common/int8_segment_gemm.h, one int8_gemm_out (cpu/gemm.h: int8_gemm's kernels, every
// ISA variant, its threads and "tn" strategies) per nonempty segment, into the output.
#include <torch/library.h>

#include <optional>

#include "common/int8_segment_gemm.h"
#include "cpu/gemm.h"
#include "cpu/mem.h"

namespace qtrain {
namespace cpu {
namespace {

void segment_gemm(const at::Tensor& a, const at::Tensor& b, double scale,
                  c10::string_view layout, const at::Tensor& out) {
  int8_gemm_out(a, b, scale, layout, std::nullopt, out);
}

void fresh_output(const at::Tensor& out) {
  const size_t bytes = static_cast<size_t>(out.numel()) * sizeof(float);
  advise_huge_pages(out.mutable_data_ptr<float>(), bytes);
}

at::Tensor int8_segment_gemm(const at::Tensor& qa, const at::Tensor& qb,
                             const at::Tensor& offsets, double scale, c10::string_view layout) {
  return qtrain::int8_segment_gemm::run(qa, qb, offsets, scale, layout, &segment_gemm,
                                        &fresh_output);
}

}  // namespace
}  // namespace cpu
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("int8_segment_gemm", &qtrain::cpu::int8_segment_gemm);
}
