// int8_block_gemm on the CPU (front: ops/int8_block_gemm.cpp; reference qtrain/ops/gemm.py
// reference_block_gemm): allocates the output and runs cpu::int8_block_gemm_out
// (cpu/int8_gemm_kernel.cpp gemm_tn_blocks: int8_gemm's split-K packing and tiles with an
// int32 store per block of k, each block's term added in float32 into its group's partial,
// the groups in order; bit-identical to the reference for any thread count and ISA; a packed
// operand's rows unpacked a block at a time as they are packed for the tiles).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu/gemm.h"

namespace qtrain {
namespace {

at::Tensor int8_block_gemm(const at::Tensor& qa, const at::Tensor& qb, const at::Tensor& scale_a,
                           const at::Tensor& scale_b, int64_t block) {
  // the widths are the scales': an operand may be stored packed (uint8)
  at::Tensor out = at::empty({scale_a.size(1), scale_b.size(1)}, qa.options().dtype(at::kFloat));
  cpu::int8_block_gemm_out(qa, qb, scale_a, scale_b, block, out);
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("int8_block_gemm", &qtrain::int8_block_gemm); }
