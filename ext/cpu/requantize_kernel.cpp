// requantize on the CPU (front: ops/requantize.cpp; reference qtrain/ops/integer.py
// reference_requantize; CUDA twin cuda/requantize_kernel.cu): int32 to int8 through the
// window [shift, shift + 6], rounded to nearest and saturated at 127 (GCINT's StQ). One
// elementwise pass, split over threads in flat ranges; the rule is cpu/integer.h's, in
// uint32 arithmetic that each ISA variant vectorizes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu/integer.h"
#include "cpu/mem.h"

namespace qtrain {
namespace integer {
namespace {

template <int ISA>
QT_ALWAYS_INLINE void requantize_body(const int32_t* x, int8_t* out, int64_t n, int shift) {
  const uint32_t half = shift > 0 ? uint32_t{1} << (shift - 1) : 0u;
  for (int64_t i = 0; i < n; ++i) out[i] = requantize_one(x[i], shift, half);
}

using RangeFn = void (*)(const int32_t*, int8_t*, int64_t, int);

void range_default(const int32_t* x, int8_t* out, int64_t n, int shift) {
  requantize_body<isa::kDefault>(x, out, n, shift);
}
#if QT_X86_DISPATCH
QT_TARGET_AVX2 void range_avx2(const int32_t* x, int8_t* out, int64_t n, int shift) {
  requantize_body<isa::kAvx2>(x, out, n, shift);
}
QT_TARGET_AVX512 void range_avx512(const int32_t* x, int8_t* out, int64_t n, int shift) {
  requantize_body<isa::kAvx512>(x, out, n, shift);
}
#endif

at::Tensor requantize(const at::Tensor& x_in, int64_t shift) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kChar));
  const int64_t n = x.numel();
  if (n == 0) return out;
  advise_huge_pages(out.mutable_data_ptr<int8_t>(), static_cast<size_t>(n));
  requantize_range(x.const_data_ptr<int32_t>(), out.mutable_data_ptr<int8_t>(), n,
                   static_cast<int>(shift));
  return out;
}

}  // namespace

void requantize_range(const int32_t* x, int8_t* out, int64_t n, int shift) {
  // chosen per call: the ISA in use may be changed at run time (qtrain._ext.set_isa)
  const RangeFn fn = QT_SELECT_VARIANT(range_);
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { fn(x + b, out + b, e - b, shift); });
}

}  // namespace integer
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("requantize", &qtrain::integer::requantize); }
