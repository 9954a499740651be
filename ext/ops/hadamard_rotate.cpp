// hadamard_rotate: the block-diagonal Walsh-Hadamard rotation of the rows of a 2-d x.
// Reference: qtrain/quant/granular.py hadamard_rotate (hadamard_matrix for H_B); kernels:
// cpu/hadamard_rotate_kernel.cpp, cuda/hadamard_rotate_kernel.cu; autograd in
// qtrain/ops/autograd.py; Python front qtrain/ops/rotate.py.
//
//   out float32 [rows, P], P = ceil(cols / B) * B, B = block a power of two in 1..1024:
//   x's rows padded with zeros to P values, and every run of B values multiplied by the
//   orthonormal Sylvester Walsh-Hadamard matrix H_B (entries +-1 / sqrt(B)):
//     out[i, b * B + j] = sum_t xpad[i, b * B + t] * H_B[t, j]
//   The kernels run the fast transform: log2(B) butterfly stages (h = 1, 2, ..., B / 2;
//   the pair (k, k + h) becomes (u + v, u - v)), then one multiply by fl32(1 / sqrt(B))
//   (computed in double). Every device does these float32 operations in this order, so the
//   kernels agree bit for bit with each other; with the matmul reference to float32
//   rounding (a sum of B terms), not bit for bit. H_B is symmetric and orthonormal, so
//   the op is its own inverse on padded rows and its gradient is
//   hadamard_rotate(grad, B)[:, :cols]. cols == 0 gives [rows, 0]; rows == 0, [0, P].
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct HadamardRotate {
  static constexpr const char* kName = "hadamard_rotate";
  static constexpr const char* kSchema = "hadamard_rotate(Tensor x, int block) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, int64_t);

  static void check(const at::Tensor& x, int64_t block) {
    constexpr const char* fn = "qtrain::hadamard_rotate";
    TORCH_CHECK_VALUE(block >= 1 && block <= 1024 && (block & (block - 1)) == 0, fn,
                      ": block must be a power of two in 1..1024, got ", block);
    checks::dense(fn, "x", x);
    checks::dtype(fn, "x", x, at::kFloat);
    TORCH_CHECK_VALUE(x.dim() == 2, fn, ": x must be 2-d [rows, cols], got shape ", x.sizes());
    const int64_t padded = (x.size(1) + block - 1) / block * block;
    checks::rows_times(fn, x.size(0), padded, "padded cols");
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::HadamardRotate>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::HadamardRotate>(m);
}
