// unpack_bits: the first n values (uint8 [n]) of a stream pack_bits wrote; packed may be
// longer. Reference: qtrain/quant/rowwise.py unpack_bits; kernels:
// cpu/unpack_bits_kernel.cpp, cuda/unpack_bits_kernel.cu.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct UnpackBits {
  static constexpr const char* kName = "unpack_bits";
  static constexpr const char* kSchema = "unpack_bits(Tensor packed, int bits, int n) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, int64_t, int64_t);

  static void check(const at::Tensor& packed, int64_t bits, int64_t n) {
    constexpr const char* fn = "qtrain::unpack_bits";
    checks::pack_bits_in(fn, bits);
    checks::byte_stream(fn, "packed", packed);
    checks::element_count(fn, n);
    TORCH_CHECK_VALUE(packed.numel() >= checks::packed_bytes(n, bits), fn, ": packed has ",
                      packed.numel(), " bytes, ", n, " values of ", bits, " bits need ",
                      checks::packed_bytes(n, bits));
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::UnpackBits>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::UnpackBits>(m); }
