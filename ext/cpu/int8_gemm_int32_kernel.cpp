// int8_gemm_int32 on the CPU (front: ops/int8_gemm_int32.cpp; reference qtrain/ops/integer.py
// reference_int_gemm; CUDA twin cuda/int8_gemm_int32_kernel.cu): GCINT's dense product,
// int8 operands and exact int32 sums. It is int8_gemm's kernel (cpu/int8_gemm_kernel.cpp:
// VNNI vpdpbusd, or vpmaddwd pairs, per the ISA in use) with the tiles storing their int32
// accumulators instead of scaling them: exact for any blocking and thread count, so bit
// for bit the reference. Inner lengths over 65536 are summed in int64 and saturated.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu/gemm.h"
#include "cpu/mem.h"

namespace qtrain {
namespace {

at::Tensor int8_gemm_int32(const at::Tensor& qa, const at::Tensor& qb, c10::string_view layout) {
  const int64_t M = layout == "tn" ? qa.size(1) : qa.size(0);
  const int64_t N = layout == "nt" ? qb.size(0) : qb.size(1);
  at::Tensor out = at::empty({M, N}, qa.options().dtype(at::kInt));
  advise_huge_pages(out.mutable_data_ptr<int32_t>(), static_cast<size_t>(M * N) * sizeof(int32_t));
  cpu::int8_gemm_int32_out(qa, qb, layout, out);
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("int8_gemm_int32", &qtrain::int8_gemm_int32); }
