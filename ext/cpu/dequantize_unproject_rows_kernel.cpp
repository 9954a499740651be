// dequantize_unproject_rows on the CPU (front: ops/dequantize_unproject_rows.cpp; the
// codec and the signed products: rowwise.h). Each thread dequantizes its rows into a
// stage of kStageRows rows of k values and projects the stage back to d columns of
// the output (signed sums in input order): the dequantized [rows, k] tensor never
// exists.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>

#include "common/rng.h"
#include "cpu/mem.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

at::Tensor dequantize_unproject_rows(const at::Tensor& packed, const at::Tensor& zero,
                                     const at::Tensor& range, int64_t bits, int64_t k,
                                     int64_t d, int64_t seed, int64_t projection_offset) {
  const int64_t rows = zero.numel();
  at::Tensor out = at::empty({rows, d}, packed.options().dtype(at::kFloat));
  if (rows * d == 0) return out;
  float* op = out.mutable_data_ptr<float>();
  advise_huge_pages(op, static_cast<size_t>(rows * d) * sizeof(float));
  const QuantizedInput q = quantized_input(packed, zero, range, bits, k);
  const SignMasks m = sign_masks(d, k, rng::keys_from_seed(static_cast<uint64_t>(seed)),
                                 static_cast<uint64_t>(projection_offset), true);
  parallel_rows(
      rows, k,
      [&](int, int64_t r0, int64_t r1) {
        UnprojectedRows sink(*q.args.K, op, d, k, m, r0, r1);
        dequantize_block(q.args, r0, r1, sink);
      },
      d);
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("dequantize_unproject_rows", &qtrain::dequantize_unproject_rows);
}
