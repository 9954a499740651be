// dyq on the CPU (front: ops/dyq.cpp; reference qtrain/ops/integer.py reference_dyq; CUDA
// twin cuda/dyq_kernel.cu): GCINT's DyQ. Two passes over the int32 tensor: the 32-bin
// histogram of the magnitudes' leading-one positions (per-thread bins over flat ranges,
// summed: integer counts, so the result does not depend on the thread count), the window
// chosen from it (cpu/integer.h window_shift, or bounded_window_shift with a tail), then
// requantize's pass with that window.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <tuple>

#include "cpu/integer.h"
#include "cpu/mem.h"

namespace qtrain {
namespace integer {
namespace {

std::tuple<at::Tensor, at::Tensor> dyq(const at::Tensor& x_in, std::optional<int64_t> tail) {
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  const int32_t* px = x.const_data_ptr<int32_t>();
  int64_t hist[32] = {};
  std::mutex merge;
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    int64_t part[32] = {};
    msb_histogram(px + b, e - b, part);
    const std::lock_guard<std::mutex> lock(merge);
    for (int i = 0; i < 32; ++i) hist[i] += part[i];
  });
  const int shift =
      tail.has_value() ? bounded_window_shift(hist, static_cast<int>(*tail)) : window_shift(hist);
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (n > 0) {
    advise_huge_pages(out.mutable_data_ptr<int8_t>(), static_cast<size_t>(n));
    requantize_range(px, out.mutable_data_ptr<int8_t>(), n, shift);
  }
  return {out, at::scalar_tensor(shift, x.options().dtype(at::kLong))};
}

}  // namespace
}  // namespace integer
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("dyq", &qtrain::integer::dyq); }
