// masked_scale: out[i] = fl32(grad[i] * fl32(scale)) where bit i of the 1-bit stream
// `packed` is set, else +0 (grad float32, any shape taken flat; out has grad's shape):
// the backward of ReLU (scale 1) and of inverted dropout (scale 1 / (1 - p)) straight
// from a packed mask. Reference: qtrain/quant/rowwise.py masked_scale; kernels:
// cpu/masked_scale_kernel.cpp, cuda/masked_scale_kernel.cu.
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct MaskedScale {
  static constexpr const char* kName = "masked_scale";
  static constexpr const char* kSchema =
      "masked_scale(Tensor grad, Tensor packed, float scale) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, double);

  static void check(const at::Tensor& grad, const at::Tensor& packed, double) {
    constexpr const char* fn = "qtrain::masked_scale";
    checks::dense(fn, "grad", grad);
    checks::dtype(fn, "grad", grad, at::kFloat);
    checks::byte_stream(fn, "packed", packed);
    checks::same_device(fn, "packed", packed, "grad", grad.device());
    const int64_t n = grad.numel();
    TORCH_CHECK_VALUE(packed.numel() >= checks::packed_bytes(n, 1), fn, ": packed has ",
                      packed.numel(), " bytes, ", n, " mask bits need ",
                      checks::packed_bytes(n, 1));
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::MaskedScale>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::MaskedScale>(m); }
