// Symmetric per-tensor quantization (tango-sc23 eq. 1-3) on the CPU.
//
// Two passes over x: the absolute maximum (an integer max over the float bit
// patterns with the sign cleared, exact, order-free, and it flags NaN/Inf for
// free), then quantization. Both are split into contiguous per-thread ranges;
// every element depends only on its value, the scale and its index, so the
// result is the same for any thread count and bit-identical to
// qtrain/quant/quantize.py (the reference):
//
//   qmax = 2^(bits-1) - 1, inv = fl32(qmax / absmax)       (0 if absmax == 0)
//   nearest:    q = clamp(rint(fl32(x * inv)), -qmax, qmax)        (ties to even)
//   stochastic: q = clamp(floor(fl32(fl32(x * inv) + u_i)), -qmax, qmax)
//   scale = fl32(absmax / qmax)
//
// If fl32(qmax / absmax) overflows (absmax below ~1e-37), x and absmax are
// first multiplied by 2^64 (exact), as the reference does.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_isa.h"
#include "cpu_mem.h"
#include "cpu_threads.h"
#include "qtrain_ops.h"
#include "qtrain_rng.h"

namespace qtrain {
namespace {

// ---------------------------------------------------------------- kernel bodies

// max over |x| as bit patterns: for non-negative floats the integer order is
// the float order, and NaN/Inf compare above every finite value.
QT_ALWAYS_INLINE uint32_t absmax_bits_body(const float* __restrict x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    b &= 0x7fffffffu;
    m = b > m ? b : m;
  }
  return m;
}

QT_ALWAYS_INLINE int32_t clamp_q(int32_t k, int32_t qmax) {
  k = k < -qmax ? -qmax : k;
  return k > qmax ? qmax : k;
}

// Ties-to-even rounding that vectorizes on every x86 level: for |v| < 2^22,
// v + 1.5*2^23 lands where the float spacing is 1, so the add rounds v to the
// nearest integer (ties to even) and the subtraction is exact.
QT_ALWAYS_INLINE float rint_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (v + magic) - magic;
}

QT_ALWAYS_INLINE void nearest_body(const float* __restrict x, int8_t* __restrict q, int64_t n,
                                   float pre, float inv, int32_t qmax) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = (x[i] * pre) * inv;
    q[i] = static_cast<int8_t>(clamp_q(static_cast<int32_t>(rint_small(v)), qmax));
  }
}

QT_ALWAYS_INLINE void stochastic_body(const float* __restrict x, int8_t* __restrict q, int64_t n,
                                      float pre, float inv, int32_t qmax, uint32_t lo0,
                                      uint32_t k1, uint32_t kh) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = rng::to_unit(rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(i)));
    const float w = (x[i] * pre) * inv + u;
    int32_t k = static_cast<int32_t>(w);  // toward zero; |w| < 2^8
    k -= (w < static_cast<float>(k)) ? 1 : 0;  // floor
    q[i] = static_cast<int8_t>(clamp_q(k, qmax));
  }
}

QT_ALWAYS_INLINE void uniform_body(float* __restrict out, int64_t n, uint32_t lo0, uint32_t k1,
                                   uint32_t kh) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = rng::to_unit(rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(i)));
  }
}

// ---------------------------------------------------------------- ISA variants

struct Kernels {
  uint32_t (*absmax_bits)(const float*, int64_t);
  void (*nearest)(const float*, int8_t*, int64_t, float, float, int32_t);
  void (*stochastic)(const float*, int8_t*, int64_t, float, float, int32_t, uint32_t, uint32_t,
                     uint32_t);
  void (*uniform)(float*, int64_t, uint32_t, uint32_t, uint32_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                          \
  ATTR uint32_t absmax_bits_##NAME(const float* x, int64_t n) {                                \
    return absmax_bits_body(x, n);                                                             \
  }                                                                                            \
  ATTR void nearest_##NAME(const float* x, int8_t* q, int64_t n, float pre, float inv,         \
                           int32_t qmax) {                                                     \
    nearest_body(x, q, n, pre, inv, qmax);                                                     \
  }                                                                                            \
  ATTR void stochastic_##NAME(const float* x, int8_t* q, int64_t n, float pre, float inv,      \
                              int32_t qmax, uint32_t lo0, uint32_t k1, uint32_t kh) {          \
    stochastic_body(x, q, n, pre, inv, qmax, lo0, k1, kh);                                     \
  }                                                                                            \
  ATTR void uniform_##NAME(float* out, int64_t n, uint32_t lo0, uint32_t k1, uint32_t kh) {    \
    uniform_body(out, n, lo0, k1, kh);                                                         \
  }                                                                                            \
  const Kernels kernels_##NAME = {absmax_bits_##NAME, nearest_##NAME, stochastic_##NAME,       \
                                  uniform_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- threading

// Elements per thread at least. One thread quantizes 1M floats in about half a
// millisecond, so smaller tensors (GAT's [N, heads, 1] attention terms) are not
// worth a parallel region that a busy second core can stall.
constexpr int64_t kGrain = int64_t{1} << 20;

// Contiguous range of thread t of T, boundaries on 64-element multiples.
std::pair<int64_t, int64_t> split(int64_t n, int t, int T) {
  int64_t chunk = (n + T - 1) / T;
  chunk = (chunk + 63) & ~int64_t{63};
  const int64_t b = std::min(n, chunk * t);
  return {b, std::min(n, b + chunk)};
}

// Run body(thread, begin, end) over [0, n) on up to plan_threads(n, kGrain) OpenMP threads.
template <typename F>
void parallel_ranges(int64_t n, const F& body) {
  const int nt = plan_threads(n, kGrain);
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num();
      const auto r = split(n, t, omp_get_num_threads());
      if (r.first < r.second) body(t, r.first, r.second);
    }
    return;
  }
#endif
  (void)nt;
  body(0, int64_t{0}, n);
}

// Split [begin, end) of a counter stream at 2^32 boundaries of the counter,
// so the high word (and its block key) is constant inside each call.
template <typename F>
void for_counter_segments(uint64_t offset, int64_t begin, int64_t end, const F& seg) {
  uint64_t c = offset + static_cast<uint64_t>(begin);
  int64_t i = begin;
  while (i < end) {
    const auto lo = static_cast<uint32_t>(c);
    const auto hi = static_cast<uint32_t>(c >> 32);
    const int64_t room = static_cast<int64_t>((uint64_t{1} << 32) - lo);
    const int64_t len = std::min(end - i, room);
    seg(i, len, lo, hi);
    i += len;
    c += static_cast<uint64_t>(len);
  }
}

void check_counter_range(const char* fn, int64_t n, int64_t offset) {
  TORCH_CHECK_VALUE(offset >= 0, fn, ": offset must be >= 0, got ", offset);
  TORCH_CHECK_VALUE(n <= std::numeric_limits<int64_t>::max() - offset, fn,
                    ": offset + numel must stay below 2^63, got offset ", offset, " and numel ",
                    n);
}

}  // namespace

// ---------------------------------------------------------------- ops

std::tuple<at::Tensor, at::Tensor> quantize_symmetric(const at::Tensor& x_in, int64_t bits,
                                                      bool stochastic, uint64_t seed,
                                                      int64_t offset) {
  constexpr const char* fn = "qtrain._ext.quantize_symmetric";
  TORCH_CHECK_VALUE(bits >= 2 && bits <= 8, fn, ": bits must be an integer in 2..8, got ", bits);
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::kFloat, fn, ": x must be float32, got ",
                   x_in.scalar_type());
  TORCH_CHECK_VALUE(x_in.device().is_cpu(), fn, ": x must be a CPU tensor, got device ",
                    x_in.device());
  TORCH_CHECK_VALUE(x_in.layout() == at::kStrided, fn, ": x must be a dense (strided) tensor");
  const int64_t n = x_in.numel();
  check_counter_range(fn, n, offset);

  const at::Tensor x = x_in.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  const int32_t qmax = (1 << (bits - 1)) - 1;
  if (n == 0) return {q, at::zeros({}, x.options())};

  const float* xp = x.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  advise_huge_pages(qp, static_cast<size_t>(n));
  const Kernels& K = kernels();

  // pass 1: absmax
  std::vector<uint32_t> partial(static_cast<size_t>(plan_threads(n, kGrain)), 0u);
  parallel_ranges(n, [&](int t, int64_t b, int64_t e) {
    partial[static_cast<size_t>(t)] = K.absmax_bits(xp + b, e - b);
  });
  const uint32_t mbits = *std::max_element(partial.begin(), partial.end());
  TORCH_CHECK_VALUE(mbits < 0x7f800000u, fn,
                    ": x contains NaN or Inf; quantization needs finite values");
  float absmax;
  std::memcpy(&absmax, &mbits, sizeof absmax);
  const float scale = absmax / static_cast<float>(qmax);
  at::Tensor scale_t = at::full({}, scale, x.options());
  if (absmax == 0.0f) {
    q.zero_();
    return {q, scale_t};
  }
  float pre = 1.0f;
  float inv = static_cast<float>(qmax) / absmax;
  if (!std::isfinite(inv)) {
    pre = 18446744073709551616.0f;  // 2^64
    inv = static_cast<float>(qmax) / (absmax * pre);
  }

  // pass 2: quantize
  if (!stochastic) {
    parallel_ranges(n, [&](int, int64_t b, int64_t e) {
      K.nearest(xp + b, qp + b, e - b, pre, inv, qmax);
    });
  } else {
    const rng::Keys keys = rng::keys_from_seed(seed);
    parallel_ranges(n, [&](int, int64_t b, int64_t e) {
      for_counter_segments(static_cast<uint64_t>(offset), b, e,
                           [&](int64_t i, int64_t len, uint32_t lo, uint32_t hi) {
                             K.stochastic(xp + i, qp + i, len, pre, inv, qmax, lo, keys.k1,
                                          rng::block_key(keys, hi));
                           });
    });
  }
  return {q, scale_t};
}

at::Tensor counter_uniform(int64_t n, uint64_t seed, int64_t offset) {
  constexpr const char* fn = "qtrain._ext.counter_uniform";
  TORCH_CHECK_VALUE(n >= 0, fn, ": n must be >= 0, got ", n);
  check_counter_range(fn, n, offset);
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  if (n == 0) return out;
  float* op = out.mutable_data_ptr<float>();
  const Kernels& K = kernels();
  const rng::Keys keys = rng::keys_from_seed(seed);
  parallel_ranges(n, [&](int, int64_t b, int64_t e) {
    for_counter_segments(static_cast<uint64_t>(offset), b, e,
                         [&](int64_t i, int64_t len, uint32_t lo, uint32_t hi) {
                           K.uniform(op + i, len, lo, keys.k1, rng::block_key(keys, hi));
                         });
  });
  return out;
}

}  // namespace qtrain
