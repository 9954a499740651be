// pack_bits: uint8 (or bool) values, any shape taken flat, as a dense little-endian bit
// stream of `bits` bits each (value i at bit i * bits; values masked to `bits` bits;
// the last byte zero-padded). Reference: qtrain/quant/rowwise.py pack_bits; kernels:
// cpu/pack_bits_kernel.cpp, cuda/pack_bits_kernel.cu.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct PackBits {
  static constexpr const char* kName = "pack_bits";
  static constexpr const char* kSchema = "pack_bits(Tensor values, int bits) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, int64_t);

  static void check(const at::Tensor& values, int64_t bits) {
    constexpr const char* fn = "qtrain::pack_bits";
    checks::pack_bits_in(fn, bits);
    checks::dense(fn, "values", values);
    TORCH_CHECK_TYPE(values.scalar_type() == at::kByte || values.scalar_type() == at::kBool, fn,
                     ": values must be uint8 or bool, got ",
                     checks::dtype_name(values.scalar_type()));
    checks::element_count(fn, values.numel());
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::PackBits>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::PackBits>(m); }
