// fill_counter_uniform: out[i] = the counter stream's uniform at (seed, offset + i),
// float32 in [0, 1) with 24 random bits. Reference: qtrain/quant/rng.py
// counter_uniform; kernels: cpu/quantize_symmetric_kernel.cpp,
// cuda/quantize_symmetric_kernel.cu (the stream stochastic rounding draws from).
// It fills a tensor the caller allocated, so the dispatcher routes it by that
// tensor's device (an op without tensor arguments could not be routed).
#include "common/checks.h"
#include "common/front.h"

namespace qtrain {
namespace {

struct FillCounterUniform {
  static constexpr const char* kName = "fill_counter_uniform";
  static constexpr const char* kSchema =
      "fill_counter_uniform(Tensor(a!) out, int seed=0, int offset=0) -> ()";
  using Signature = void(const at::Tensor&, int64_t, int64_t);

  static void check(const at::Tensor& out, int64_t, int64_t offset) {
    constexpr const char* fn = "qtrain::fill_counter_uniform";
    checks::dense(fn, "out", out);
    checks::dtype(fn, "out", out, at::kFloat);
    TORCH_CHECK_VALUE(out.is_contiguous(), fn, ": out must be contiguous");
    checks::counter_range(fn, out.numel(), offset);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::FillCounterUniform>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) {
  qtrain::front::check_first<qtrain::FillCounterUniform>(m);
}
