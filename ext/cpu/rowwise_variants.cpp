// The ISA variants of the row codecs' CPU kernel bodies (declared in rowwise.h): the
// per-row min / max keys, quantization (nearest and stochastic), dequantization, bit
// packing of 1, 2 and 4 bits, the Rademacher signs and the signed products of the
// fused projections, the side means' float64 row sums and comparisons. Each body is
// written once and compiled per variant here only, so the kernel files
// (quantize_rows_kernel.cpp, ...) that share them do not each carry three copies. Every
// variant does the same float32 (and float64) operations in the same order, so they
// agree bit for bit (see rowwise.h for the rule they implement).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/rng.h"
#include "cpu/isa.h"
#include "cpu/rowwise.h"

namespace qtrain {
namespace rowwise {
namespace {

// ---------------------------------------------------------------- kernel bodies

QT_ALWAYS_INLINE RowKeys row_keys_body(const float* __restrict x, int64_t n) {
  int32_t lo = std::numeric_limits<int32_t>::max();
  int32_t hi = std::numeric_limits<int32_t>::min();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    const int32_t k = order_key(b);
    lo = k < lo ? k : lo;
    hi = k > hi ? k : hi;
  }
  return {lo, hi};
}

// Ties-to-even rounding for 0 <= v < 2^22: v + 1.5*2^23 lands where the float
// spacing is 1, so the add rounds to the nearest integer and the subtraction
// is exact.
QT_ALWAYS_INLINE float rint_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (v + magic) - magic;
}

// clamp(v, 0, top) as torch does it for what follows: NaN -> 0 (torch turns a
// NaN into uint8 0), +inf -> top. v > 0 ? v : 0 is maxps's own definition.
QT_ALWAYS_INLINE float clamp_levels(float v, float top) {
  v = v > 0.0f ? v : 0.0f;
  return v < top ? v : top;
}

QT_ALWAYS_INLINE void nearest_body(const float* __restrict x, uint8_t* __restrict q, int64_t n,
                                   float zero, float inv, float top) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = (x[i] - zero) * inv;
    // clamp before rint: both bounds are integers, so this equals clamp(rint(v))
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(rint_small(clamp_levels(v, top))));
  }
}

QT_ALWAYS_INLINE void stochastic_body(const float* __restrict x, uint8_t* __restrict q, int64_t n,
                                      float zero, float inv, float top, uint32_t lo0, uint32_t k1,
                                      uint32_t kh) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = rng::to_unit(rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(i)));
    const float w = (x[i] - zero) * inv + u;
    // clamp first: on [0, top] truncation is floor, and floor(clamp) == clamp(floor)
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(clamp_levels(w, top)));
  }
}

QT_ALWAYS_INLINE void dequant_body(const uint8_t* __restrict q, float* __restrict out, int64_t n,
                                   float step, float zero) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * step + zero;
}

// Bits 1, 2, 4: 8 values (one per byte of a uint64, < 2^B after the mask) to
// 8*B bits by three doubling steps, and back.
template <int B>
struct Packing {
  static_assert(B == 1 || B == 2 || B == 4, "packing of 1, 2 or 4 bits");
  static constexpr uint64_t m8 = 0x0101010101010101ull * ((1ull << B) - 1);
  static constexpr uint64_t m16 = 0x0001000100010001ull * ((1ull << (2 * B)) - 1);
  static constexpr uint64_t m32 = 0x0000000100000001ull * ((1ull << (4 * B)) - 1);
  static constexpr uint64_t m64 = (1ull << (8 * B)) - 1;
  // one group of 8 values per B bytes
  using Word = typename std::conditional<
      B == 1, uint8_t, typename std::conditional<B == 2, uint16_t, uint32_t>::type>::type;

  static QT_ALWAYS_INLINE uint64_t squeeze(uint64_t t) {
    t &= m8;
    t = (t | (t >> (8 - B))) & m16;
    t = (t | (t >> (16 - 2 * B))) & m32;
    return (t | (t >> (32 - 4 * B))) & m64;
  }
  static QT_ALWAYS_INLINE uint64_t spread(uint64_t t) {
    t = (t | (t << (32 - 4 * B))) & m32;
    t = (t | (t << (16 - 2 * B))) & m16;
    return (t | (t << (8 - B))) & m8;
  }
};

template <int B>
QT_ALWAYS_INLINE void pack_body(const uint8_t* __restrict in, uint8_t* __restrict out,
                                int64_t groups) {
  using P = Packing<B>;
  for (int64_t g = 0; g < groups; ++g) {
    uint64_t t;
    std::memcpy(&t, in + 8 * g, sizeof t);
    const auto w = static_cast<typename P::Word>(P::squeeze(t));
    std::memcpy(out + B * g, &w, sizeof w);
  }
}

template <int B>
QT_ALWAYS_INLINE void unpack_body(const uint8_t* __restrict in, uint8_t* __restrict out,
                                  int64_t groups) {
  using P = Packing<B>;
  for (int64_t g = 0; g < groups; ++g) {
    typename P::Word w;
    std::memcpy(&w, in + B * g, sizeof w);
    const uint64_t t = P::spread(static_cast<uint64_t>(w));
    std::memcpy(out + 8 * g, &t, sizeof t);
  }
}

// +-mag with the sign bit of the counter hash (h >= 2^31 -> -mag).
QT_ALWAYS_INLINE void signs_body(float* __restrict out, int64_t n, uint32_t mag_bits, uint32_t lo0,
                                 uint32_t k1, uint32_t kh) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(i));
    const uint32_t b = mag_bits | (h & 0x80000000u);
    std::memcpy(out + i, &b, sizeof b);
  }
}

// Signed sums, the projection's products (qtrain/quant/projection.py):
//   out[r][c] = fl32(mag * acc),  acc = +0 + (+-in[r][0]) + (+-in[r][1]) + ... in input order,
// the sign of in[r][i] flipped where bit 31 of masks[i * n_pad + c] is set (exact: an
// XOR of the sign bit). Lanes are output columns, so every lane adds in input order
// whatever the vector width, and the variants agree bit for bit. A tile of 4 rows x
// 2 vectors of accumulators stays in registers: GCC's generic vectors of the
// variant's native width (L = 16 zmm lanes, 8 ymm, 4 xmm; wider ones would be split
// through the stack).
constexpr int kSignRows = 4;       // rows sharing each mask load

template <int L>
struct SignVec {
  typedef float F __attribute__((vector_size(4 * L)));
  typedef uint32_t U __attribute__((vector_size(4 * L)));
  static QT_ALWAYS_INLINE F as_float(U v) {
    F f;
    std::memcpy(&f, &v, sizeof f);
    return f;
  }
};

template <int L>
QT_ALWAYS_INLINE void signed_product_body(const float* __restrict in, int64_t ld_in,
                                          int64_t rows, int64_t n_in,
                                          const uint32_t* __restrict masks, int64_t n_pad,
                                          float mag, float* __restrict out, int64_t ld_out,
                                          int64_t n_out) {
  using F = typename SignVec<L>::F;
  using U = typename SignVec<L>::U;
  for (int64_t r0 = 0; r0 < rows; r0 += kSignRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kSignRows, rows - r0));
    const float* src[kSignRows];
    for (int r = 0; r < kSignRows; ++r) src[r] = in + (r0 + (r < nr ? r : 0)) * ld_in;
    for (int64_t c0 = 0; c0 < n_out; c0 += 2 * L) {
      F acc[kSignRows][2];
      for (int r = 0; r < kSignRows; ++r) acc[r][0] = acc[r][1] = F{};
      const uint32_t* m = masks + c0;
      for (int64_t i = 0; i < n_in; ++i, m += n_pad) {
        U m0, m1;
        std::memcpy(&m0, m, sizeof m0);
        std::memcpy(&m1, m + L, sizeof m1);
        for (int r = 0; r < kSignRows; ++r) {
          uint32_t b;
          std::memcpy(&b, src[r] + i, sizeof b);
          acc[r][0] += SignVec<L>::as_float(m0 ^ b);
          acc[r][1] += SignVec<L>::as_float(m1 ^ b);
        }
      }
      const int64_t n = std::min<int64_t>(2 * L, n_out - c0);
      for (int r = 0; r < nr; ++r) {
        F v[2] = {acc[r][0] * mag, acc[r][1] * mag};
        std::memcpy(out + (r0 + r) * ld_out + c0, v, static_cast<size_t>(n) * sizeof(float));
      }
    }
  }
}

// The float64 sums of quantize_rows_means (cpu/quantize_rows_means_kernel.cpp): element i
// of a row goes to accumulator i % kSumLanes, which are then added pairwise in a fixed
// order. The lane count is the same in every variant, so the variants add in the same order
// and agree bit for bit; where a row's sums are exact (the reference's condition,
// qtrain/quant/rowwise.py) any order gives the same sum. The op had summed each row in one
// chain, branching on each value's side: 9x slower than quantize_rows at 1 bit (177
// against 20 ms on [169343, 256], two threads), nearly all of it the side sums' mispredicted
// branches on values that fall either side of their row's mean at random.
constexpr int kSumLanes = 8;

QT_ALWAYS_INLINE double lane_total(const double* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

QT_ALWAYS_INLINE double row_sum_body(const float* __restrict x, int64_t n) {
  double acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int k = 0; k < kSumLanes; ++k) acc[k] += static_cast<double>(x[i + k]);
  }
  for (int k = 0; i + k < n; ++k) acc[k] += static_cast<double>(x[i + k]);
  return lane_total(acc);
}

// Two vectors of 4 lanes, so every variant keeps kSumLanes = 8 accumulators per side; GCC 12
// turns this form into vector code, where the same loop on scalars stays scalar (4x slower
// branch-free, 10x with a branch per value). A value joins its side's sum as its bits
// and-ed with the comparison mask and the other side's as +0.0 (its bits and-ed with the
// inverse), which leaves a sum as skipping the value would: the accumulators start at +0.0 and so are never -0.0, the one
// value that adding +0.0 changes. NaN compares false, so it goes to the low side.
typedef float Float4 __attribute__((vector_size(16)));
typedef double Double4 __attribute__((vector_size(32)));
typedef int64_t Int4 __attribute__((vector_size(32)));

QT_ALWAYS_INLINE SideSums side_sums_body(const float* __restrict x, int64_t n, float t) {
  Double4 high[2] = {}, low[2] = {};
  Int4 up_count[2] = {};  // -1 per value >= t
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int h = 0; h < 2; ++h) {
      Float4 v;
      std::memcpy(&v, x + i + 4 * h, sizeof v);
      const Double4 d = __builtin_convertvector(v, Double4);
      const Int4 up = __builtin_convertvector(v >= t, Int4);
      high[h] += reinterpret_cast<Double4>(reinterpret_cast<Int4>(d) & up);
      low[h] += reinterpret_cast<Double4>(reinterpret_cast<Int4>(d) & ~up);
      up_count[h] += up;
    }
  }
  double hi[kSumLanes], lo[kSumLanes];
  int64_t count = 0;
  for (int k = 0; k < kSumLanes; ++k) {
    hi[k] = high[k / 4][k % 4];
    lo[k] = low[k / 4][k % 4];
    count -= up_count[k / 4][k % 4];
  }
  for (int k = 0; i + k < n; ++k) {
    const float v = x[i + k];
    if (v >= t) {
      hi[k] += static_cast<double>(v);
      ++count;
    } else {
      lo[k] += static_cast<double>(v);
    }
  }
  return {lane_total(hi), lane_total(lo), count};
}

QT_ALWAYS_INLINE void at_least_body(const float* __restrict x, uint8_t* __restrict q, int64_t n,
                                    float t) {
  for (int64_t i = 0; i < n; ++i) q[i] = x[i] >= t ? 1 : 0;
}

// ---------------------------------------------------------------- ISA variants

#define QT_DEFINE_VARIANT(NAME, ATTR, LANES)                                                   \
  ATTR RowKeys row_keys_##NAME(const float* x, int64_t n) { return row_keys_body(x, n); }      \
  ATTR void nearest_##NAME(const float* x, uint8_t* q, int64_t n, float zero, float inv,       \
                           float top) {                                                        \
    nearest_body(x, q, n, zero, inv, top);                                                     \
  }                                                                                            \
  ATTR void stochastic_##NAME(const float* x, uint8_t* q, int64_t n, float zero, float inv,    \
                              float top, uint32_t lo0, uint32_t k1, uint32_t kh) {             \
    stochastic_body(x, q, n, zero, inv, top, lo0, k1, kh);                                     \
  }                                                                                            \
  ATTR void dequant_##NAME(const uint8_t* q, float* out, int64_t n, float step, float zero) {  \
    dequant_body(q, out, n, step, zero);                                                       \
  }                                                                                            \
  ATTR void pack1_##NAME(const uint8_t* in, uint8_t* out, int64_t g) { pack_body<1>(in, out, g); } \
  ATTR void pack2_##NAME(const uint8_t* in, uint8_t* out, int64_t g) { pack_body<2>(in, out, g); } \
  ATTR void pack4_##NAME(const uint8_t* in, uint8_t* out, int64_t g) { pack_body<4>(in, out, g); } \
  ATTR void unpack1_##NAME(const uint8_t* in, uint8_t* out, int64_t g) {                       \
    unpack_body<1>(in, out, g);                                                                \
  }                                                                                            \
  ATTR void unpack2_##NAME(const uint8_t* in, uint8_t* out, int64_t g) {                       \
    unpack_body<2>(in, out, g);                                                                \
  }                                                                                            \
  ATTR void unpack4_##NAME(const uint8_t* in, uint8_t* out, int64_t g) {                       \
    unpack_body<4>(in, out, g);                                                                \
  }                                                                                            \
  ATTR void signs_##NAME(float* out, int64_t n, uint32_t mag_bits, uint32_t lo0, uint32_t k1,  \
                         uint32_t kh) {                                                        \
    signs_body(out, n, mag_bits, lo0, k1, kh);                                                 \
  }                                                                                            \
  ATTR void signed_product_##NAME(const float* in, int64_t ld_in, int64_t rows, int64_t n_in,  \
                                  const uint32_t* masks, int64_t n_pad, float mag, float* out, \
                                  int64_t ld_out, int64_t n_out) {                             \
    signed_product_body<LANES>(in, ld_in, rows, n_in, masks, n_pad, mag, out, ld_out, n_out);  \
  }                                                                                            \
  ATTR double row_sum_##NAME(const float* x, int64_t n) { return row_sum_body(x, n); }         \
  ATTR SideSums side_sums_##NAME(const float* x, int64_t n, float t) {                         \
    return side_sums_body(x, n, t);                                                            \
  }                                                                                            \
  ATTR void at_least_##NAME(const float* x, uint8_t* q, int64_t n, float t) {                  \
    at_least_body(x, q, n, t);                                                                 \
  }                                                                                            \
  const Kernels kernels_##NAME = {row_keys_##NAME,                                             \
                                  nearest_##NAME,                                              \
                                  stochastic_##NAME,                                           \
                                  dequant_##NAME,                                              \
                                  {pack1_##NAME, pack2_##NAME, pack4_##NAME},                  \
                                  {unpack1_##NAME, unpack2_##NAME, unpack4_##NAME},            \
                                  signs_##NAME,                                                \
                                  signed_product_##NAME,                                       \
                                  row_sum_##NAME,                                              \
                                  side_sums_##NAME,                                            \
                                  at_least_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, 4)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, 8)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, 16)
#endif

}  // namespace

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

SignMasks sign_masks(int64_t d, int64_t k, const rng::Keys& keys, uint64_t offset,
                     bool transposed) {
  SignMasks m;
  const int64_t n_in = transposed ? k : d, n_out = transposed ? d : k;
  m.n_pad = (n_out + kSignTile - 1) / kSignTile * kSignTile;
  m.bits.assign(static_cast<size_t>(n_in * m.n_pad), 0u);
  m.mag = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k)));
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const uint64_t c = offset + static_cast<uint64_t>(i * k + j);
      const uint32_t h = rng::bits_lo(keys.k1, rng::block_key(keys, static_cast<uint32_t>(c >> 32)),
                                      static_cast<uint32_t>(c));
      const int64_t at = transposed ? j * m.n_pad + i : i * m.n_pad + j;
      m.bits[static_cast<size_t>(at)] = h & 0x80000000u;
    }
  }
  return m;
}

}  // namespace rowwise
}  // namespace qtrain
