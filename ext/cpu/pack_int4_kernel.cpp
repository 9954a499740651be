// pack_int4 on the CPU (front: ops/pack_int4.cpp): int8 values in [-8, 7] stored two per
// byte, value j of a row in byte j / 2 (low nibble for an even j); reference
// qtrain/quant/packed.py pack_int4. Rows in contiguous chunks per thread; a value out of
// range is noted as the rows are packed and refused after the loop.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "cpu/int4.h"
#include "cpu/threads.h"

namespace qtrain {
namespace {

at::Tensor pack_int4(const at::Tensor& q_in) {
  const at::Tensor q = q_in.contiguous();
  const int64_t d = q.size(-1), bytes = (d + 1) / 2;
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  shape.back() = bytes;
  at::Tensor out = at::empty(shape, q.options().dtype(at::kByte));
  const int64_t rows = d == 0 ? 0 : q.numel() / d;
  const int8_t* src = q.const_data_ptr<int8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  const int nt = plan_threads(q.numel(), 1 << 18);
  bool ok = true;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static) reduction(&& : ok)
#endif
  for (int64_t r = 0; r < rows; ++r) ok = int4::pack_row(src + r * d, d, dst + r * bytes) && ok;
  (void)nt;
  TORCH_CHECK_VALUE(ok, "qtrain::pack_int4: every value of q must be in [-8, 7] (4-bit "
                        "two's complement)");
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("pack_int4", &qtrain::pack_int4); }
