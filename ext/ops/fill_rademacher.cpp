// fill_rademacher: out [d, k] = the normalized Rademacher matrix of the counter stream:
// entry (i, j) is +-fl32(1 / sqrt(k)), negative where the top bit of the hash at
// (seed, offset + i * k + j) is set. Reference: qtrain/quant/projection.py rademacher;
// kernels: cpu/fill_rademacher_kernel.cpp, cuda/fill_rademacher_kernel.cu. It fills a
// tensor the caller allocated, so the dispatcher routes it by that tensor's device (an
// op without tensor arguments could not be routed).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct FillRademacher {
  static constexpr const char* kName = "fill_rademacher";
  static constexpr const char* kSchema =
      "fill_rademacher(Tensor(a!) out, int seed=0, int offset=0) -> ()";
  using Signature = void(const at::Tensor&, int64_t, int64_t);

  static void check(const at::Tensor& out, int64_t, int64_t offset) {
    constexpr const char* fn = "qtrain::fill_rademacher";
    checks::dense(fn, "out", out);
    checks::dtype(fn, "out", out, at::kFloat);
    TORCH_CHECK_VALUE(out.dim() == 2, fn, ": out must be 2-d [d, k], got shape ", out.sizes());
    TORCH_CHECK_VALUE(out.size(1) >= 1, fn, ": need d >= 0 and k >= 1, got d=", out.size(0),
                      ", k=", out.size(1));
    TORCH_CHECK_VALUE(out.is_contiguous(), fn, ": out must be contiguous");
    checks::counter_range(fn, out.numel(), offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::FillRademacher>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::FillRademacher>(m);
}
