// dyq: GCINT's dynamic quantization (gcint sec. 3.3, eq. 2-4), int32 to int8 through the
// 7-bit window of bit positions that holds the most nonzero magnitudes (or, with a tail,
// the lowest window that saturates at most one in 2^tail), chosen on the tensor's device
// (no host round trip).
// Reference: qtrain/ops/integer.py reference_dyq; kernels: cpu/dyq_kernel.cpp,
// cuda/dyq_kernel.cu.
//
//   hist[i] = #{ x : |x| in [2^i, 2^(i+1)) }                          (zeros in no bin)
//   tail = None: k = the first argmax over k = 0..25 of hist[k] + ... + hist[k + 6]
//                (0 for all zeros)
//   tail = t:    k = the first k in 0..25 with (hist[k + 7] + ... + hist[31]) * 2^t
//                <= hist[0] + ... + hist[31]                       (t in 0..24)
//   (requantize(x, k), k as an int64 0-d tensor on x's device)
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct Dyq {
  static constexpr const char* kName = "dyq";
  static constexpr const char* kSchema =
      "dyq(Tensor x, int? tail=None) -> (Tensor q, Tensor shift)";
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, std::optional<int64_t>);

  static void check(const at::Tensor& x, std::optional<int64_t> tail) {
    constexpr const char* fn = "qtrain::dyq";
    checks::dense(fn, "x", x);
    checks::dtype(fn, "x", x, at::kInt);
    checks::dyq_tail(fn, tail);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::Dyq>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::Dyq>(m); }
