// The host loop of int8_segment_gemm on any device (front ops/int8_segment_gemm.cpp;
// reference qtrain/ops/typed.py reference_int8_segment_gemm): one call of the device's
// INT8 GEMM (the one int8_gemm runs: cpu/gemm.h int8_gemm_out, cuda/gemm.cuh run_gemm)
// per nonempty segment, on slices of the operands, written straight into the segment's
// slice of the output. offsets are on the CPU for every device, so the loop never waits
// for a GPU; their values are checked here, where they are read (common/segment_matmul.h).
//
//   "nn": out[seg r] = int8_gemm(qa[seg r], qb[r], scale, "nn")   qa [N, K], qb [R, K, M]
//   "nt": out[seg r] = int8_gemm(qa[seg r], qb[r], scale, "nt")   qa [N, M], qb [R, K, M]
//   "tn": out[r] = int8_gemm(qa[seg r], qb[seg r], scale, "tn")   qa [N, K], qb [N, M]
//
// Every slice of the output is contiguous ([len, cols] rows of a contiguous [N, cols], or
// the [K, M] matrix r of [R, K, M]), and the GEMMs' integer sums are exact, so each element
// is bit for bit what int8_gemm gives for its segment. "tn" relations without rows are
// zeros (one fill, only when there is one).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/string_view.h>

#include <array>
#include <cstdint>

#include "common/segment_matmul.h"

namespace qtrain {
namespace int8_segment_gemm {

constexpr const char* kFn = "qtrain::int8_segment_gemm";

// The device's INT8 GEMM into `out` (contiguous float32 [M, N]): a, b int8 2-d slices
// stored as `layout` says, the output fl32(float(sum_k a * b) * fl32(scale)).
using Gemm = void (*)(const at::Tensor& a, const at::Tensor& b, double scale,
                      c10::string_view layout, const at::Tensor& out);
// Called on the fresh output before the first GEMM writes it (the CPU's huge-page hint).
using Fresh = void (*)(const at::Tensor& out);

// The op on checked arguments (ops/int8_segment_gemm.cpp), offsets' values excepted.
inline at::Tensor run(const at::Tensor& qa_in, const at::Tensor& qb_in, const at::Tensor& offsets,
                      double scale, c10::string_view layout, Gemm gemm,
                      Fresh fresh = nullptr) {
  const at::Tensor o = segment_matmul::checked_offsets(kFn, offsets, qa_in.size(0), "qa");
  const int64_t* p = o.const_data_ptr<int64_t>();
  const int64_t relations = o.numel() - 1;
  // one copy of a strided operand for all segments (a no-op when contiguous); its slices
  // are then contiguous too
  const at::Tensor qa = qa_in.contiguous();
  const at::Tensor qb = qb_in.contiguous();
  const at::TensorOptions opts = qa.options().dtype(at::kFloat);
  if (layout == "tn") {
    bool any_empty = false;
    for (int64_t r = 0; r < relations; ++r) any_empty |= p[r + 1] == p[r];
    const std::array<int64_t, 3> shape{relations, qa.size(1), qb.size(1)};
    at::Tensor out = any_empty ? at::zeros(shape, opts) : at::empty(shape, opts);
    if (fresh != nullptr) fresh(out);
    for (int64_t r = 0; r < relations; ++r) {
      const int64_t len = p[r + 1] - p[r];
      if (len == 0) continue;
      gemm(qa.narrow(0, p[r], len), qb.narrow(0, p[r], len), scale, layout, out.select(0, r));
    }
    return out;
  }
  // "nn" / "nt": every row lies in one segment, so out needs no fill
  const int64_t cols = layout == "nn" ? qb.size(2) : qb.size(1);
  at::Tensor out = at::empty({qa.size(0), cols}, opts);
  if (fresh != nullptr) fresh(out);
  for (int64_t r = 0; r < relations; ++r) {
    const int64_t len = p[r + 1] - p[r];
    if (len == 0) continue;
    gemm(qa.narrow(0, p[r], len), qb.select(0, r), scale, layout, out.narrow(0, p[r], len));
  }
  return out;
}

}  // namespace int8_segment_gemm
}  // namespace qtrain
