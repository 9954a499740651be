// pack_int4: signed 4-bit values stored two per byte (issue 32, packed storage).
// Reference: qtrain/quant/packed.py pack_int4; kernels: cpu/pack_int4_kernel.cpp,
// cuda/pack_int4_kernel.cu; Python front qtrain/ops/packed.py; inverse: unpack_int4.
//
//   q int8 [..., D], every value in [-8, 7]  ->  uint8 [..., ceil(D / 2)]
//   out[..., i] = (q[..., 2i] & 0xF) | (q[..., 2i + 1] & 0xF) << 4
//   (value j of a row in byte j / 2: the low nibble for an even j, the high one for an odd
//   j, as 4-bit two's complement; an odd D leaves the last byte's high nibble 0)
//
// A value outside [-8, 7] is refused (ValueError) by the kernels, which read the data.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct PackInt4 {
  static constexpr const char* kName = "pack_int4";
  static constexpr const char* kSchema = "pack_int4(Tensor q) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&);

  static void check(const at::Tensor& q) {
    constexpr const char* fn = "qtrain::pack_int4";
    checks::dense(fn, "q", q);
    checks::dtype(fn, "q", q, at::kChar);
    TORCH_CHECK_VALUE(q.dim() >= 1, fn, ": q must have at least one dimension, got a 0-d tensor");
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::PackInt4>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::PackInt4>(m); }
