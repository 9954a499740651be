// The CPU INT8 GEMM as a C++ function: the int8_gemm op's CPU kernel
// (cpu/int8_gemm_kernel.cpp), which quantized_gemm's CPU kernel
// (cpu/quantized_gemm_kernel.cpp) calls directly rather than through the dispatcher, and
// its variant into a given output, which int8_segment_gemm's CPU kernel
// (cpu/int8_segment_gemm_kernel.cpp) calls once per segment, and the int32-output variant of
// int8_gemm_int32.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

namespace qtrain {
namespace cpu {

// C (float32 [M, N]) = fl32(float(sum_k qa * qb) * f[m, n]) (+ bias[n]) for
// layout "nn" (qa [M, K], qb [K, N]), "nt" (qb [N, K]) or "tn" (qa [K, M]); bias
// float (any floating dtype, taken as float32) of N; f[m, n] =
// fl32(fl32(fl32(scale) * row_scale[m]) * col_scale[n]), an absent row_scale (float32 [M]) or
// col_scale (float32 [N]) counting as 1, so f = fl32(scale) without either. Arguments as
// the op's front (ops/int8_gemm.cpp) has checked them: int8 2-d CPU tensors, any strides.
at::Tensor int8_gemm(const at::Tensor& qa, const at::Tensor& qb, double scale,
                     c10::string_view layout, const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& row_scale = std::nullopt,
                     const std::optional<at::Tensor>& col_scale = std::nullopt);

// int8_gemm written into `out`, a contiguous float32 [M, N] CPU tensor (a slice of a larger
// output may be one: int8_segment_gemm's kernel, cpu/int8_segment_gemm_kernel.cpp). The same
// kernels and the same bits as int8_gemm, which allocates `out` and calls this.
void int8_gemm_out(const at::Tensor& qa, const at::Tensor& qb, double scale,
                   c10::string_view layout, const std::optional<at::Tensor>& bias,
                   const at::Tensor& out,
                   const std::optional<at::Tensor>& row_scale = std::nullopt,
                   const std::optional<at::Tensor>& col_scale = std::nullopt);

// int8_gemm_int32's CPU kernel (cpu/int8_gemm_int32_kernel.cpp): the exact int32 sums
// sum_k qa * qb (saturated where K > 131071 lets them leave int32) written into `out`, a
// contiguous int32 [M, N] CPU tensor; the same packing, tiles and threads as int8_gemm.
void int8_gemm_int32_out(const at::Tensor& qa, const at::Tensor& qb, c10::string_view layout,
                         const at::Tensor& out);

// int8_block_gemm's CPU kernel (cpu/int8_block_gemm_kernel.cpp, front ops/int8_block_gemm.cpp)
// written into `out`, a contiguous float32 [M, N] CPU tensor: "tn" with one scale per block
// of `block` rows of every column of qa [K, M] and qb [K, N] (scale_a [ceil(K / block), M],
// scale_b [.., N], float32; either operand int8, or uint8 [K, ceil(width / 2)] holding 4-bit
// values packed two a byte), as the front has checked them; gemm_tn_blocks in
// cpu/int8_gemm_kernel.cpp, with int8_gemm's packing and tiles.
void int8_block_gemm_out(const at::Tensor& qa, const at::Tensor& qb, const at::Tensor& scale_a,
                         const at::Tensor& scale_b, int64_t block, const at::Tensor& out);

}  // namespace cpu
}  // namespace qtrain
