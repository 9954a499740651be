// unpack_bits on the CPU (front: ops/unpack_bits.cpp; packing bodies:
// rowwise_variants.cpp): `bits` bytes back to 8 values per group, contiguous ranges of
// groups per thread; the last, partial group reads only the bytes it needs.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

#include "cpu/mem.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

at::Tensor unpack_bits(const at::Tensor& packed_in, int64_t bits, int64_t n) {
  at::Tensor out = at::empty({n}, packed_in.options());
  if (n == 0) return out;
  const at::Tensor packed = packed_in.contiguous();
  const auto* in = static_cast<const uint8_t*>(packed.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  advise_huge_pages(op, static_cast<size_t>(n));
  if (bits == 8) {
    parallel_ranges(n, [&](int64_t b, int64_t e) {
      std::memcpy(op + b, in + b, static_cast<size_t>(e - b));
    });
    return out;
  }
  const Kernels& K = kernels();
  const PackFn unpack = K.unpack[bits_index(bits)];
  const int64_t groups = n / 8;
  parallel_ranges(groups,
                  [&](int64_t b, int64_t e) { unpack(in + bits * b, op + 8 * b, e - b); });
  unpack_tail(K, in + bits * groups, n - 8 * groups, op + 8 * groups, bits);
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("unpack_bits", &qtrain::unpack_bits); }
