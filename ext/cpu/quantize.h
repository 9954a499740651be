// The rule of quantize_symmetric's CPU kernel (cpu/quantize_symmetric_kernel.cpp) as
// C++ functions, for other CPU kernels that quantize (quantized_gemm). Both run on
// torch's thread team and give the same bits for any thread count and ISA variant.
#pragma once

#include <cstdint>

namespace qtrain {
namespace cpu {

// max over i of |x[i]| as a bit pattern (0 for n == 0): for non-negative floats the
// integer order is the float order, and NaN / Inf compare above every finite value
// (>= 0x7f800000), so the caller can refuse them.
uint32_t absmax_bits(const float* x, int64_t n);

// q[i] = x[i] quantized to qmax = 2^(bits-1) - 1 levels with the range absmax (finite
// and >= 0; values beyond it clamp to +-qmax), exactly qtrain/quant/quantize.py:
//   pre, inv = 1, fl32(qmax / absmax)  (x and absmax times 2^64 first if that overflows;
//                                        inv = 0 for absmax == 0)
//   nearest:    q = clamp(rint(fl32(fl32(x * pre) * inv)), -qmax, qmax)
//   stochastic: q = clamp(floor(fl32(fl32(fl32(x * pre) * inv) + u)), -qmax, qmax),
//               u the counter stream's uniform at (seed, offset + i)
// The scale that goes with q is fl32(absmax / qmax).
void quantize_with_absmax(const float* x, int8_t* q, int64_t n, float absmax, int64_t bits,
                          bool stochastic, uint64_t seed, uint64_t offset);

}  // namespace cpu
}  // namespace qtrain
