// unpack_int4 on the CPU (front: ops/unpack_int4.cpp): the inverse of pack_int4, each
// nibble sign-extended to int8 (value j of a row from byte j / 2, low nibble for an even
// j; cpu/int4.h unpack_row); reference qtrain/quant/packed.py unpack_int4. Rows in
// contiguous chunks per thread.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "cpu/int4.h"
#include "cpu/threads.h"

namespace qtrain {
namespace {

at::Tensor unpack_int4(const at::Tensor& packed_in, int64_t width) {
  const at::Tensor packed = packed_in.contiguous();
  const int64_t bytes = packed.size(-1);
  std::vector<int64_t> shape(packed.sizes().begin(), packed.sizes().end());
  shape.back() = width;
  at::Tensor out = at::empty(shape, packed.options().dtype(at::kChar));
  const int64_t rows = width == 0 ? 0 : out.numel() / width;
  const uint8_t* src = packed.const_data_ptr<uint8_t>();
  int8_t* dst = out.mutable_data_ptr<int8_t>();
  const int nt = plan_threads(out.numel(), 1 << 18);
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
#endif
  for (int64_t r = 0; r < rows; ++r) int4::unpack_row(src + r * bytes, width, dst + r * width);
  (void)nt;
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("unpack_int4", &qtrain::unpack_int4); }
