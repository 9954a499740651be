// dyq: GCINT's dynamic quantization (gcint sec. 3.3, eq. 2-4), int32 to int8 through the
// 7-bit window of bit positions that holds the most nonzero magnitudes, chosen on the
// tensor's device (no host round trip).
// Reference: qtrain/ops/integer.py reference_dyq; kernels: cpu/dyq_kernel.cpp,
// cuda/dyq_kernel.cu.
//
//   hist[i] = #{ x : |x| in [2^i, 2^(i+1)) }                          (zeros in no bin)
//   k = the first argmax over k = 0..25 of hist[k] + ... + hist[k + 6]  (0 for all zeros)
//   (requantize(x, k), k as an int64 0-d tensor on x's device)
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Dyq {
  static constexpr const char* kName = "dyq";
  static constexpr const char* kSchema = "dyq(Tensor x) -> (Tensor q, Tensor shift)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&);

  static void check(const at::Tensor& x) {
    constexpr const char* fn = "qtrain::dyq";
    checks::dense(fn, "x", x);
    checks::dtype(fn, "x", x, at::kInt);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Dyq>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::Dyq>(m); }
