// unpack_int4 on the CPU (front: ops/unpack_int4.cpp): the inverse of pack_int4, each
// nibble sign-extended to int8 (value j of a row from byte j / 2, low nibble for an even
// j); reference qtrain/quant/packed.py unpack_int4. Rows in contiguous chunks per thread.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "cpu/threads.h"

namespace qtrain {
namespace {

// The 4-bit two's-complement values of byte b: (low, high).
inline int8_t low_nibble(uint8_t b) { return static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4; }
inline int8_t high_nibble(uint8_t b) { return static_cast<int8_t>(b) >> 4; }

inline void unpack_row(const uint8_t* p, int64_t d, int8_t* out) {
  const int64_t pairs = d / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    out[2 * i] = low_nibble(p[i]);
    out[2 * i + 1] = high_nibble(p[i]);
  }
  if (d % 2 != 0) out[d - 1] = low_nibble(p[pairs]);
}

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
  for (int64_t r = 0; r < rows; ++r) unpack_row(src + r * bytes, width, dst + r * width);
  (void)nt;
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("unpack_int4", &qtrain::unpack_int4); }
