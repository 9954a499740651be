// requantize: int32 to int8 through a fixed 7-bit window of bit positions (GCINT's StQ,
// gcint sec. 3.3, and the second half of DyQ).
// Reference: qtrain/ops/integer.py reference_requantize; kernels:
// cpu/requantize_kernel.cpp, cuda/requantize_kernel.cu.
//
//   m = |x| (in int64), rounded to nearest at bit `shift`: (m + 2^(shift-1)) >> shift
//   out = sign(x) * min(m, 127), int8 of x's shape                    shift in 0..25
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Requantize {
  static constexpr const char* kName = "requantize";
  static constexpr const char* kSchema = "requantize(Tensor x, int shift) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, int64_t);

  static void check(const at::Tensor& x, int64_t shift) {
    constexpr const char* fn = "qtrain::requantize";
    checks::dense(fn, "x", x);
    checks::dtype(fn, "x", x, at::kInt);
    checks::window_shift(fn, shift);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Requantize>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::Requantize>(m); }
