// unpack_int4: the inverse of pack_int4 (issue 32, packed storage).
// Reference: qtrain/quant/packed.py unpack_int4; kernels: cpu/unpack_int4_kernel.cpp,
// cuda/unpack_int4_kernel.cu; Python front qtrain/ops/packed.py.
//
//   packed uint8 [..., ceil(width / 2)]  ->  int8 [..., width]
//   out[..., j] = the 4-bit two's-complement nibble j % 2 (low first) of packed[..., j / 2]
//
// width must satisfy ceil(width / 2) == packed.size(-1); every byte is a valid pair of
// values, so the kernels refuse nothing (a high nibble past an odd width is ignored).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct UnpackInt4 {
  static constexpr const char* kName = "unpack_int4";
  static constexpr const char* kSchema = "unpack_int4(Tensor packed, int width) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, int64_t);

  static void check(const at::Tensor& packed, int64_t width) {
    constexpr const char* fn = "qtrain::unpack_int4";
    checks::dense(fn, "packed", packed);
    checks::dtype(fn, "packed", packed, at::kByte);
    TORCH_CHECK_VALUE(packed.dim() >= 1, fn,
                      ": packed must have at least one dimension, got a 0-d tensor");
    checks::int4_width(fn, packed, width);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::UnpackInt4>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::UnpackInt4>(m);
}
