// The typed (per-relation) segment GEMM on any device: segment_matmul and
// segment_matmul_tn (fronts ops/segment_matmul.cpp, ops/segment_matmul_tn.cpp; references
// qtrain/ops/typed.py). Rows offsets[r] .. offsets[r + 1] of x belong to relation r, so
// one host loop over the relations calls the device's dense GEMM (at::mm_out: MKL /
// oneDNN on the CPU, cuBLAS on CUDA) once per nonempty segment, on slices of the
// operands: no per-edge copy of the weights (Hector's "one segment GEMM across all
// relations"). offsets are on the CPU for every device, so the loop never waits for a
// GPU; their values are checked here, where they are read. cpu/segment_matmul*_kernel.cpp
// and cuda/segment_matmul*_kernel.cu only register these functions.
//
// Each product is the at::mm call the reference makes (same slices, same strides), but
// written into a slice of the output, not a fresh tensor: the BLAS picks its code path
// by the output's alignment too (MKL's small-matrix path for rows not 16-byte aligned),
// so a product may differ from the reference's in the last bits. The tests compare with
// the dtype's tight tolerance; the alternative, a fresh product copied into place per
// segment, would add a pass over the output for no accuracy.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>

namespace qtrain {
namespace segment_matmul {

// offsets (CPU int64, checked by the front) as a contiguous tensor whose values start at
// 0, never decrease and end at `rows`, the rows of the operand named `operand` (ValueError
// naming the first violation otherwise). Also int8_segment_gemm's (common/int8_segment_gemm.h).
inline at::Tensor checked_offsets(const char* fn, const at::Tensor& offsets, int64_t rows,
                                  const char* operand = "x") {
  at::Tensor o = offsets.contiguous();
  const int64_t* p = o.const_data_ptr<int64_t>();
  const int64_t n = o.numel();
  TORCH_CHECK_VALUE(p[0] == 0, fn, ": offsets must start at 0, got offsets[0] = ", p[0]);
  for (int64_t i = 1; i < n; ++i) {
    TORCH_CHECK_VALUE(p[i] >= p[i - 1], fn, ": offsets must be non-decreasing, got offsets[",
                      i, "] = ", p[i], " < offsets[", i - 1, "] = ", p[i - 1]);
  }
  TORCH_CHECK_VALUE(p[n - 1] == rows, fn, ": offsets must end at the rows of ", operand, " (",
                    rows, "), got offsets[", n - 1, "] = ", p[n - 1]);
  return o;
}

// out [N, M]: out[seg r] = x[seg r] @ W_r, W_r = weight[r] ([R, K, M]) or weight[r]^T
// ([R, M, K] when transpose_weight). Every row lies in one segment, so out needs no fill.
inline at::Tensor forward(const at::Tensor& x, const at::Tensor& offsets,
                          const at::Tensor& weight, bool transpose_weight) {
  const at::Tensor o = checked_offsets("qtrain::segment_matmul", offsets, x.size(0));
  const int64_t* p = o.const_data_ptr<int64_t>();
  const int64_t relations = o.numel() - 1;
  const int64_t m = weight.size(transpose_weight ? 1 : 2);
  at::Tensor out = at::empty({x.size(0), m}, x.options());
  for (int64_t r = 0; r < relations; ++r) {
    const int64_t len = p[r + 1] - p[r];
    if (len == 0) continue;
    const at::Tensor w = transpose_weight ? weight.select(0, r).t() : weight.select(0, r);
    at::Tensor dst = out.narrow(0, p[r], len);
    at::mm_out(dst, x.narrow(0, p[r], len), w);
  }
  return out;
}

// out [R, K, M]: out[r] = x[seg r]^T @ grad[seg r] (the weight gradient), zeros for an
// empty segment (one fill for all of them, only when there is one).
inline at::Tensor tn(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& grad) {
  const at::Tensor o = checked_offsets("qtrain::segment_matmul_tn", offsets, x.size(0));
  const int64_t* p = o.const_data_ptr<int64_t>();
  const int64_t relations = o.numel() - 1;
  bool any_empty = false;
  for (int64_t r = 0; r < relations; ++r) any_empty |= p[r + 1] == p[r];
  const std::array<int64_t, 3> shape{relations, x.size(1), grad.size(1)};
  at::Tensor out = any_empty ? at::zeros(shape, x.options()) : at::empty(shape, x.options());
  for (int64_t r = 0; r < relations; ++r) {
    const int64_t len = p[r + 1] - p[r];
    if (len == 0) continue;
    at::Tensor dst = out.select(0, r);
    at::mm_out(dst, x.narrow(0, p[r], len).t(), grad.narrow(0, p[r], len));
  }
  return out;
}

}  // namespace segment_matmul
}  // namespace qtrain
