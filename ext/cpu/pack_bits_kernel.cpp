// pack_bits on the CPU (front: ops/pack_bits.cpp; packing bodies: rowwise_variants.cpp).
// Groups of 8 values become `bits` bytes each (three doubling steps in a 64-bit word),
// split over threads in contiguous ranges of groups; the stream's last, partial group
// writes only the bytes that exist. 8 bits: the stream is the values themselves.
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

at::Tensor pack_bits(const at::Tensor& values_in, int64_t bits) {
  const int64_t n = values_in.numel();
  const at::Tensor values = values_in.contiguous();
  const int64_t nbytes = packed_bytes(n, bits);
  at::Tensor out = at::empty({nbytes}, values.options().dtype(at::kByte));
  if (n == 0) return out;
  const auto* in = static_cast<const uint8_t*>(values.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  advise_huge_pages(op, static_cast<size_t>(nbytes));
  if (bits == 8) {
    parallel_ranges(n, [&](int64_t b, int64_t e) {
      std::memcpy(op + b, in + b, static_cast<size_t>(e - b));
    });
    return out;
  }
  const Kernels& K = kernels();
  const PackFn pack = K.pack[bits_index(bits)];
  const int64_t groups = n / 8;
  parallel_ranges(groups, [&](int64_t b, int64_t e) { pack(in + 8 * b, op + bits * b, e - b); });
  pack_tail(K, in + 8 * groups, n - 8 * groups, op + bits * groups, bits);
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("pack_bits", &qtrain::pack_bits); }
