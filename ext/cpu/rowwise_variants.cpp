// Activation compression for the exact plugin (exact-iclr22) on the CPU: per-row
// quantization with bit packing, its inverse, bit packing alone, the
// Rademacher projection matrix, and projection fused with quantization (and
// dequantization with the inverse projection). The references are
// qtrain/quant/rowwise.py and qtrain/quant/projection.py; results equal them
// bit for bit for any thread count and ISA variant:
//
//   B = 2^bits - 1; zero = bf16_floor(min h); range = bf16_ceil(fl32(max h - zero))
//   inv = fl32(B / range) (0 if range == 0);  v = fl32(fl32(h - zero) * inv)
//   nearest:    q = clamp(rint(v), 0, B)                 (ties to even)
//   stochastic: q = clamp(floor(fl32(v + u_i)), 0, B)    u_i = counter uniform at offset + i
//   dequantized: fl32(fl32(float(q) * fl32(range / B)) + zero)
//
// The values of the flattened [rows, width] tensor form one dense
// little-endian bit stream (element i at bit i*bits), so rows do not start on
// byte boundaries. Threads get blocks of whole rows whose first element is a
// multiple of 8 (row boundaries at multiples of 8 / gcd(width, 8) rows), so
// every block starts on a byte boundary and no two threads write one byte.
// Inside a block each row is read once from memory for its min/max (an
// integer min/max over order-preserving keys of the float bits: exact,
// order-free, and it finds NaN), then again from L1/L2 to quantize into a
// small staging buffer that is packed 8 values (= `bits` bytes) at a time.
//
// x should be finite. As in the reference, a row holding +-Inf quantizes to
// level 0 with range = inf, and a row holding a NaN to level 0 with zero =
// range = NaN: both dequantize to NaN rows, so a diverged run stays visible
// instead of failing here. Signed zeros: the min/max keys order -0 below +0,
// so a row whose minimum is a zero stores zero = -0 if it holds a -0 (torch's
// amin may return either zero there); integers and dequantized values agree.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_isa.h"
#include "cpu_mem.h"
#include "cpu_threads.h"
#include "qtrain_ops.h"
#include "qtrain_rng.h"


#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "compress_cpu.cpp packs bit streams through little-endian integer stores"
#endif

namespace qtrain {
namespace {

// ---------------------------------------------------------------- kernel bodies

// A signed integer with the order of the float whose bits are b (-0 < +0;
// NaNs below -inf or above +inf by their sign).
QT_ALWAYS_INLINE int32_t order_key(uint32_t b) {
  const int32_t s = static_cast<int32_t>(b);
  return s ^ ((s >> 31) & 0x7fffffff);
}
constexpr int32_t kKeyNegInf = static_cast<int32_t>(0x807fffffu);  // order_key(-inf)
constexpr int32_t kKeyPosInf = 0x7f800000;                         // order_key(+inf)
constexpr uint32_t kQuietNaN = 0x7fc00000u;

struct RowKeys {
  int32_t lo;
  int32_t hi;
};

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
constexpr int64_t kSignTile = 32;  // n_pad is a multiple of it (and so of every 2 * L)
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

// ---------------------------------------------------------------- ISA variants

using PackFn = void (*)(const uint8_t*, uint8_t*, int64_t);

struct Kernels {
  RowKeys (*row_keys)(const float*, int64_t);
  void (*nearest)(const float*, uint8_t*, int64_t, float, float, float);
  void (*stochastic)(const float*, uint8_t*, int64_t, float, float, float, uint32_t, uint32_t,
                     uint32_t);
  void (*dequant)(const uint8_t*, float*, int64_t, float, float);
  PackFn pack[3];    // bits 1, 2, 4
  PackFn unpack[3];  // bits 1, 2, 4
  void (*signs)(float*, int64_t, uint32_t, uint32_t, uint32_t, uint32_t);
  void (*signed_product)(const float*, int64_t, int64_t, int64_t, const uint32_t*, int64_t, float,
                         float*, int64_t, int64_t);
};

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
  const Kernels kernels_##NAME = {row_keys_##NAME,                                             \
                                  nearest_##NAME,                                              \
                                  stochastic_##NAME,                                           \
                                  dequant_##NAME,                                              \
                                  {pack1_##NAME, pack2_##NAME, pack4_##NAME},                  \
                                  {unpack1_##NAME, unpack2_##NAME, unpack4_##NAME},            \
                                  signs_##NAME,                                                \
                                  signed_product_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, 4)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, 8)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, 16)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- helpers

// Elements per thread at least (one thread compresses ~1M floats in about 1 ms).
constexpr int64_t kGrain = int64_t{1} << 18;
// Values staged between quantizing and packing (and unpacking and
// dequantizing): a multiple of 8, small enough for L1.
constexpr int64_t kTile = 4096;

int bits_index(int64_t bits) { return bits == 1 ? 0 : bits == 2 ? 1 : 2; }

void check_bits(const char* fn, int64_t bits) {
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 4 || bits == 8, fn,
                    ": bits must be one of 1, 2, 4, 8, got ", bits);
}

void check_counter_range(const char* fn, int64_t n, int64_t offset) {
  TORCH_CHECK_VALUE(offset >= 0, fn, ": offset must be >= 0, got ", offset);
  TORCH_CHECK_VALUE(n <= std::numeric_limits<int64_t>::max() - offset, fn,
                    ": offset + numel must stay below 2^63, got offset ", offset, " and numel ",
                    n);
}

// Bytes that n values of `bits` bits take packed (n < 2^60 checked by the callers).
int64_t packed_bytes(int64_t n, int64_t bits) { return (n * bits + 7) / 8; }

void check_count(const char* fn, int64_t n) {
  TORCH_CHECK_VALUE(n >= 0 && n <= (int64_t{1} << 60), fn,
                    ": element count must be in [0, 2^60], got ", n);
}

// Pack the first n (<= 8) values of in (zero-padded) and write only the
// packed_bytes(n) bytes that exist: the stream's last, partial group.
void pack_tail(const Kernels& K, const uint8_t* in, int64_t n, uint8_t* out, int64_t bits) {
  if (n <= 0) return;
  uint8_t vals[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t bytes[8];
  std::memcpy(vals, in, static_cast<size_t>(n));
  K.pack[bits_index(bits)](vals, bytes, 1);
  std::memcpy(out, bytes, static_cast<size_t>(packed_bytes(n, bits)));
}

// Unpack the stream's last, partial group (n <= 8 values) reading only its bytes.
void unpack_tail(const Kernels& K, const uint8_t* in, int64_t n, uint8_t* out, int64_t bits) {
  if (n <= 0) return;
  uint8_t bytes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t vals[8];
  std::memcpy(bytes, in, static_cast<size_t>(packed_bytes(n, bits)));
  K.unpack[bits_index(bits)](bytes, vals, 1);
  std::memcpy(out, vals, static_cast<size_t>(n));
}

// Thread t of T: rows [b, e), boundaries on multiples of `align` rows.
std::pair<int64_t, int64_t> split_rows(int64_t rows, int64_t align, int t, int T) {
  int64_t chunk = (rows + T - 1) / T;
  chunk = (chunk + align - 1) / align * align;
  const int64_t b = std::min(rows, chunk * t);
  return {b, std::min(rows, b + chunk)};
}

// Run body(thread, row_begin, row_end) over the rows of a [rows, width]
// stream, each block starting on a byte boundary of the packed stream.
// `row_work` is the elements a row costs (default: width) for sizing the team.
template <typename F>
void parallel_rows(int64_t rows, int64_t width, const F& body, int64_t row_work = -1) {
  int64_t g = 8;
  for (int64_t w = width % 8; w != 0;) {  // gcd(width, 8)
    const int64_t r = g % w;
    g = w;
    w = r;
  }
  const int64_t align = 8 / g;
  const int64_t blocks = (rows + align - 1) / align;
  int nt = plan_threads(rows * (row_work < 0 ? width : row_work), kGrain);
  nt = static_cast<int>(std::min<int64_t>(nt, std::max<int64_t>(blocks, 1)));
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num();
      const auto r = split_rows(rows, align, t, omp_get_num_threads());
      if (r.first < r.second) body(t, r.first, r.second);
    }
    return;
  }
#endif
  (void)nt;
  body(0, int64_t{0}, rows);
}

// Run body(begin, end) over [0, n) in contiguous ranges, boundaries on multiples of 64.
template <typename F>
void parallel_ranges(int64_t n, const F& body) {
  const int nt = plan_threads(n, kGrain);
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    {
      const int T = omp_get_num_threads();
      int64_t chunk = (n + T - 1) / T;
      chunk = (chunk + 63) & ~int64_t{63};
      const int64_t b = std::min(n, chunk * omp_get_thread_num());
      const int64_t e = std::min(n, b + chunk);
      if (b < e) body(b, e);
    }
    return;
  }
#endif
  (void)nt;
  body(int64_t{0}, n);
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

// float from bits and back
float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
uint32_t as_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

struct QuantizeArgs {
  const Kernels* K;
  int64_t width;
  int64_t bits;
  bool stochastic;
  rng::Keys keys;
  uint64_t offset;
  uint8_t* packed;
  // bfloat16 bits per row; byte pointers, as a message segment may place them at an odd
  // byte (store_u16 / load_u16 copy through memcpy, which compiles to plain moves)
  uint8_t* zero;
  uint8_t* range;
};

QT_ALWAYS_INLINE void store_u16(uint8_t* base, int64_t i, uint16_t v) {
  std::memcpy(base + 2 * i, &v, sizeof v);
}

QT_ALWAYS_INLINE uint16_t load_u16(const uint8_t* base, int64_t i) {
  uint16_t v;
  std::memcpy(&v, base + 2 * i, sizeof v);
  return v;
}

// The row kernels ask for the cache lines of the row kRowsAhead rows on while they work
// on this one. Rows named by an index lie scattered (a message's rows are sorted, but
// with gaps), which the hardware prefetcher does not follow: gathering 85k rows of 256
// through a sorted index took 23-26 ms without this and 16 ms with it (bits 4, one
// thread). For rows in order the difference was within the machine's noise.
constexpr int64_t kRowsAhead = 2;

template <bool Write>
QT_ALWAYS_INLINE void prefetch_row(const float* row, int64_t width) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < width * static_cast<int64_t>(sizeof(float)); b += 64) {
    __builtin_prefetch(p + b, Write ? 1 : 0);
  }
}

// Where quantize_block reads row r: a row of the input itself ...
struct InputRows {
  const float* x;
  int64_t width;
  const float* operator()(int64_t r) const { return x + r * width; }
  void prefetch(int64_t r) const { prefetch_row<false>(x + r * width, width); }
};

// ... or the row of x that index[r] names (a message gathered while it is quantized) ...
struct IndexedInputRows {
  const float* x;
  int64_t width;
  const int64_t* index;
  const float* operator()(int64_t r) const { return x + index[r] * width; }
  void prefetch(int64_t r) const { prefetch_row<false>(x + index[r] * width, width); }
};

// Sign bits of the [d, k] Rademacher matrix (entry (i, j) at counter offset + i*k + j)
// laid out for signed_product: one row per input column (d rows of k outputs for the
// projection, or k rows of d for its inverse: `transposed`), each padded with zeros
// to n_pad, a multiple of kSignTile.
struct SignMasks {
  std::vector<uint32_t> bits;
  int64_t n_pad;
  float mag;  // fl32(1 / sqrt(k)), as projection.rademacher_scale
};

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

// Rows projected in groups of kStageRows into a per-thread stage.
constexpr int64_t kStageRows = 64;

// ... or a row of x [rows, d] projected to k columns, computed kStageRows rows at a time
// (rows are asked for in order, up to `end`).
class ProjectedRows {
 public:
  ProjectedRows(const Kernels& K, const float* x, int64_t d, int64_t k, const SignMasks& m,
                int64_t end)
      : K_(K), x_(x), d_(d), k_(k), m_(m), end_(end), stage_(static_cast<size_t>(kStageRows * k)) {}

  const float* operator()(int64_t r) {
    if (r >= stop_) {
      start_ = r;
      stop_ = std::min(r + kStageRows, end_);
      K_.signed_product(x_ + r * d_, d_, stop_ - start_, d_, m_.bits.data(), m_.n_pad, m_.mag,
                        stage_.data(), k_, k_);
    }
    return stage_.data() + (r - start_) * k_;
  }
  void prefetch(int64_t) const {}  // computed, not read

 private:
  const Kernels& K_;
  const float* x_;
  int64_t d_, k_;
  const SignMasks& m_;
  int64_t end_, start_ = 0, stop_ = 0;
  std::vector<float> stage_;
};

// One quantizing thread's rows [r0, r1) of the values rows(r); r0 * width is a multiple of 8.
template <typename Rows>
void quantize_block(const QuantizeArgs& a, int64_t r0, int64_t r1, Rows& rows) {
  const Kernels& K = *a.K;
  const int64_t width = a.width;
  const auto top = static_cast<float>((1 << a.bits) - 1);
  alignas(64) uint8_t buf[kTile + 8];
  int64_t fill = 0;
  uint8_t* out = a.packed + r0 * width / 8 * a.bits;
  const PackFn pack = a.bits == 8 ? nullptr : K.pack[bits_index(a.bits)];
  for (int64_t r = r0; r < r1; ++r) {
    if (r + kRowsAhead < r1) rows.prefetch(r + kRowsAhead);
    const float* xr = rows(r);
    const RowKeys k = K.row_keys(xr, width);
    // A row holding a NaN gets zero = range = NaN (torch's amin / amax propagate
    // it), so inv = 0, every value NaN -> level 0, and the row dequantizes to NaN,
    // as in the reference. +-Inf rows need no case: range = inf, inv = 0, level 0.
    const bool nan = k.lo < kKeyNegInf || k.hi > kKeyPosInf;
    uint32_t min_bits = static_cast<uint32_t>(order_key(static_cast<uint32_t>(k.lo)));
    uint32_t max_bits = static_cast<uint32_t>(order_key(static_cast<uint32_t>(k.hi)));
    if (nan) min_bits = max_bits = kQuietNaN;
    // zero = bf16_floor(min): truncate, and below zero step the magnitude up
    uint32_t zb = min_bits & 0xffff0000u;
    if (zb != min_bits && (min_bits >> 31) != 0) zb += 0x10000u;
    const float zero = as_float(zb);
    // range = bf16_ceil(fl32(max - zero)), max - zero >= 0
    const float diff = as_float(max_bits) - zero;
    const uint32_t db = as_bits(diff);
    uint32_t rb = db & 0xffff0000u;
    if (rb != db) rb += 0x10000u;
    const float range = as_float(rb);
    const float inv = range > 0.0f ? top / range : 0.0f;
    store_u16(a.zero, r, static_cast<uint16_t>(zb >> 16));
    store_u16(a.range, r, static_cast<uint16_t>(rb >> 16));

    for (int64_t j = 0; j < width;) {
      uint8_t* dst;
      int64_t len;
      if (pack == nullptr) {  // 8 bits: the stream is the values themselves
        dst = a.packed + r * width + j;
        len = width - j;
      } else {
        dst = buf + fill;
        len = std::min(width - j, kTile - fill);
      }
      if (!a.stochastic) {
        K.nearest(xr + j, dst, len, zero, inv, top);
      } else {
        const int64_t first = r * width + j;
        for_counter_segments(a.offset, first, first + len,
                             [&](int64_t i, int64_t n, uint32_t lo, uint32_t hi) {
                               K.stochastic(xr + (i - r * width), dst + (i - first), n, zero, inv,
                                            top, lo, a.keys.k1, rng::block_key(a.keys, hi));
                             });
      }
      j += len;
      if (pack != nullptr) {
        fill += len;
        if (fill == kTile) {
          pack(buf, out, kTile / 8);
          out += kTile / 8 * a.bits;
          fill = 0;
        }
      }
    }
  }
  if (pack != nullptr && fill > 0) {
    const int64_t groups = fill / 8;
    pack(buf, out, groups);
    pack_tail(K, buf + 8 * groups, fill - 8 * groups, out + groups * a.bits, a.bits);
  }
}

struct DequantizeArgs {
  const Kernels* K;
  const uint8_t* packed;
  const uint8_t* zero;  // bfloat16 bits per row, read with load_u16
  const uint8_t* range;
  int64_t width;
  int64_t bits;
};

// Where dequantize_block writes row r (row(r), then done(r) once it is complete):
// straight into the output ...
struct OutputRows {
  float* out;
  int64_t width;
  float* row(int64_t r) const { return out + r * width; }
  void done(int64_t) const {}
  void prefetch(int64_t r) const { prefetch_row<true>(out + r * width, width); }
};

// ... or into the row of out that index[r] names (row r without an index: a message
// scattered as it is decoded), or, with `add`, through a per-thread stage row added onto
// that row ...
class IndexedOutputRows {
 public:
  IndexedOutputRows(float* out, int64_t width, const int64_t* index, bool add)
      : out_(out), width_(width), index_(index), add_(add),
        stage_(add ? static_cast<size_t>(width) : 0) {}

  float* row(int64_t r) { return add_ ? stage_.data() : target(r); }
  void done(int64_t r) {
    if (!add_) return;
    float* __restrict o = target(r);
    const float* __restrict s = stage_.data();
    for (int64_t j = 0; j < width_; ++j) o[j] += s[j];
  }
  void prefetch(int64_t r) const {
    if (index_ != nullptr) prefetch_row<true>(target(r), width_);
  }

 private:
  float* target(int64_t r) const { return out_ + (index_ ? index_[r] : r) * width_; }

  float* out_;
  int64_t width_;
  const int64_t* index_;
  bool add_;
  std::vector<float> stage_;
};

// ... or into a stage of kStageRows rows of k values that is projected back to d
// columns of out when it is full or the block ends (rows come in order, up to `end`).
class UnprojectedRows {
 public:
  UnprojectedRows(const Kernels& K, float* out, int64_t d, int64_t k, const SignMasks& m,
                  int64_t begin, int64_t end)
      : K_(K), out_(out), d_(d), k_(k), m_(m), end_(end), start_(begin), stop_(begin),
        stage_(static_cast<size_t>(kStageRows * k)) {}

  float* row(int64_t r) {
    if (r >= stop_) {
      start_ = r;
      stop_ = std::min(r + kStageRows, end_);
    }
    return stage_.data() + (r - start_) * k_;
  }
  void done(int64_t r) {
    if (r + 1 == stop_) {
      K_.signed_product(stage_.data(), k_, stop_ - start_, k_, m_.bits.data(), m_.n_pad, m_.mag,
                        out_ + start_ * d_, d_, d_);
    }
  }
  void prefetch(int64_t) const {}

 private:
  const Kernels& K_;
  float* out_;
  int64_t d_, k_;
  const SignMasks& m_;
  int64_t end_, start_, stop_;
  std::vector<float> stage_;
};

// One dequantizing thread's rows [r0, r1); r0 * width is a multiple of 8.
template <typename Sink>
void dequantize_block(const DequantizeArgs& a, int64_t r0, int64_t r1, Sink& sink) {
  const Kernels& K = *a.K;
  const int64_t width = a.width;
  const auto levels = static_cast<float>((1 << a.bits) - 1);
  alignas(64) uint8_t buf[kTile + 8];
  int64_t pos = 0, avail = 0;
  int64_t left = (r1 - r0) * width;  // values not yet unpacked
  const uint8_t* in = a.packed + r0 * width / 8 * a.bits;
  const PackFn unpack = a.bits == 8 ? nullptr : K.unpack[bits_index(a.bits)];
  for (int64_t r = r0; r < r1; ++r) {
    const float zero = as_float(static_cast<uint32_t>(load_u16(a.zero, r)) << 16);
    const float step = as_float(static_cast<uint32_t>(load_u16(a.range, r)) << 16) / levels;
    if (r + kRowsAhead < r1) sink.prefetch(r + kRowsAhead);
    float* orow = sink.row(r);
    if (unpack == nullptr) {
      K.dequant(a.packed + r * width, orow, width, step, zero);
      sink.done(r);
      continue;
    }
    for (int64_t j = 0; j < width;) {
      if (pos == avail) {
        const int64_t n = std::min(kTile, left);
        const int64_t groups = n / 8;
        unpack(in, buf, groups);
        unpack_tail(K, in + groups * a.bits, n - 8 * groups, buf + 8 * groups, a.bits);
        in += groups * a.bits;  // a partial group is the stream's end
        left -= n;
        pos = 0;
        avail = n;
      }
      const int64_t len = std::min(width - j, avail - pos);
      K.dequant(buf + pos, orow + j, len, step, zero);
      pos += len;
      j += len;
    }
    sink.done(r);
  }
}

}  // namespace

// ---------------------------------------------------------------- ops

namespace {

void check_rows_input(const char* fn, const at::Tensor& x) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.dim() == 2, fn,
                   ": x must be a 2-d float32 tensor [rows, width], got ", x.scalar_type(), " ",
                   x.sizes());
  TORCH_CHECK_VALUE(x.device().is_cpu(), fn, ": x must be a CPU tensor, got device ", x.device());
  TORCH_CHECK_VALUE(x.layout() == at::kStrided, fn, ": x must be a dense (strided) tensor");
}

// (packed, zero, range) of a quantize_rows output for rows x width values, allocated.
struct QuantizedRows {
  at::Tensor packed, zero, range;
};

QuantizedRows allocate_quantized(const at::TensorOptions& opts, int64_t rows, int64_t width,
                                 int64_t bits) {
  const auto bf16 = opts.dtype(at::kBFloat16);
  if (rows == 0 || width == 0) {
    return {at::zeros({0}, opts.dtype(at::kByte)), at::zeros({rows}, bf16),
            at::zeros({rows}, bf16)};
  }
  QuantizedRows q{at::empty({packed_bytes(rows * width, bits)}, opts.dtype(at::kByte)),
                  at::empty({rows}, bf16), at::empty({rows}, bf16)};
  advise_huge_pages(q.packed.mutable_data_ptr(), static_cast<size_t>(q.packed.numel()));
  return q;
}

// Arguments of quantize_block writing to `packed`, `zero` and `range` (any byte address).
QuantizeArgs quantize_args(uint8_t* packed, uint8_t* zero, uint8_t* range, int64_t width,
                           int64_t bits, bool stochastic, uint64_t seed, int64_t offset) {
  QuantizeArgs a;
  a.K = &kernels();
  a.width = width;
  a.bits = bits;
  a.stochastic = stochastic;
  a.keys = rng::keys_from_seed(seed);
  a.offset = static_cast<uint64_t>(offset);
  a.packed = packed;
  a.zero = zero;
  a.range = range;
  return a;
}

QuantizeArgs quantize_args(QuantizedRows& q, int64_t width, int64_t bits, bool stochastic,
                           uint64_t seed, int64_t offset) {
  return quantize_args(static_cast<uint8_t*>(q.packed.mutable_data_ptr()),
                       static_cast<uint8_t*>(q.zero.mutable_data_ptr()),
                       static_cast<uint8_t*>(q.range.mutable_data_ptr()), width, bits, stochastic,
                       seed, offset);
}

// Validated contiguous (packed, zero, range) of rows x width values; rows = zero.numel().
struct QuantizedInput {
  at::Tensor packed, zero, range;
  int64_t rows;
};

QuantizedInput check_quantized(const char* fn, const at::Tensor& packed_in,
                               const at::Tensor& zero_in, const at::Tensor& range_in,
                               int64_t bits, int64_t width) {
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(zero_in.scalar_type() == at::kBFloat16 &&
                       range_in.scalar_type() == at::kBFloat16 &&
                       zero_in.sizes() == range_in.sizes(),
                   fn, ": zero and range must be bfloat16 tensors of one shape [rows], got ",
                   zero_in.scalar_type(), " ", zero_in.sizes(), " and ", range_in.scalar_type(),
                   " ", range_in.sizes());
  TORCH_CHECK_TYPE(packed_in.scalar_type() == at::kByte && packed_in.dim() == 1, fn,
                   ": packed must be a 1-d uint8 tensor, got ", packed_in.scalar_type(), " ",
                   packed_in.sizes());
  TORCH_CHECK_VALUE(packed_in.device().is_cpu() && zero_in.device().is_cpu() &&
                        range_in.device().is_cpu(),
                    fn, ": packed, zero and range must be CPU tensors");
  TORCH_CHECK_VALUE(width >= 0, fn, ": width must be >= 0, got ", width);
  const int64_t rows = zero_in.numel();
  TORCH_CHECK_VALUE(width == 0 || rows <= (int64_t{1} << 60) / width, fn,
                    ": rows * width too large: ", rows, " x ", width);
  const int64_t n = rows * width;
  TORCH_CHECK_VALUE(packed_in.numel() >= packed_bytes(n, bits), fn, ": packed has ",
                    packed_in.numel(), " bytes, ", n, " values of ", bits, " bits need ",
                    packed_bytes(n, bits));
  return {packed_in.contiguous(), zero_in.contiguous(), range_in.contiguous(), rows};
}

DequantizeArgs dequantize_args(const QuantizedInput& q, int64_t bits, int64_t width) {
  DequantizeArgs a;
  a.K = &kernels();
  a.packed = static_cast<const uint8_t*>(q.packed.const_data_ptr());
  a.zero = static_cast<const uint8_t*>(q.zero.const_data_ptr());
  a.range = static_cast<const uint8_t*>(q.range.const_data_ptr());
  a.width = width;
  a.bits = bits;
  return a;
}

void check_projection(const char* fn, int64_t d, int64_t k, int64_t offset) {
  TORCH_CHECK_VALUE(d >= 0 && k >= 1, fn, ": need d >= 0 and k >= 1, got d=", d, ", k=", k);
  TORCH_CHECK_VALUE(d <= (int64_t{1} << 40) / k, fn, ": the projection matrix is too large: d=",
                    d, ", k=", k);
  check_counter_range(fn, d * k, offset);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in, int64_t bits,
                                                             bool stochastic, uint64_t seed,
                                                             int64_t offset) {
  constexpr const char* fn = "qtrain._ext.quantize_rows";
  check_bits(fn, bits);
  check_rows_input(fn, x_in);
  const int64_t rows = x_in.size(0), width = x_in.size(1);
  check_count(fn, x_in.numel());
  check_counter_range(fn, x_in.numel(), offset);
  QuantizedRows q = allocate_quantized(x_in.options(), rows, width, bits);
  if (rows == 0 || width == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const QuantizeArgs a = quantize_args(q, width, bits, stochastic, seed, offset);
  InputRows src{x.const_data_ptr<float>(), width};
  parallel_rows(rows, width, [&](int, int64_t r0, int64_t r1) { quantize_block(a, r0, r1, src); });
  return {q.packed, q.zero, q.range};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_quantize_rows(
    const at::Tensor& x_in, int64_t k, int64_t bits, bool stochastic, uint64_t seed,
    int64_t offset, int64_t projection_offset) {
  constexpr const char* fn = "qtrain._ext.project_quantize_rows";
  check_bits(fn, bits);
  check_rows_input(fn, x_in);
  const int64_t rows = x_in.size(0), d = x_in.size(1);
  check_projection(fn, d, k, projection_offset);
  TORCH_CHECK_VALUE(rows <= (int64_t{1} << 60) / k, fn, ": rows * k too large: ", rows, " x ", k);
  check_counter_range(fn, rows * k, offset);
  QuantizedRows q = allocate_quantized(x_in.options(), rows, k, bits);
  if (rows == 0) return {q.packed, q.zero, q.range};
  const at::Tensor x = x_in.contiguous();
  const float* xp = x.const_data_ptr<float>();
  const QuantizeArgs a = quantize_args(q, k, bits, stochastic, seed, offset);
  const SignMasks m = sign_masks(d, k, a.keys, static_cast<uint64_t>(projection_offset), false);
  parallel_rows(
      rows, k,
      [&](int, int64_t r0, int64_t r1) {
        ProjectedRows src(*a.K, xp, d, k, m, r1);
        quantize_block(a, r0, r1, src);
      },
      std::max<int64_t>(d, k));
  return {q.packed, q.zero, q.range};
}

at::Tensor dequantize_rows(const at::Tensor& packed_in, const at::Tensor& zero_in,
                           const at::Tensor& range_in, int64_t bits, int64_t width) {
  constexpr const char* fn = "qtrain._ext.dequantize_rows";
  const QuantizedInput q = check_quantized(fn, packed_in, zero_in, range_in, bits, width);
  at::Tensor out = at::empty({q.rows, width}, packed_in.options().dtype(at::kFloat));
  if (q.rows * width == 0) return out;
  const DequantizeArgs a = dequantize_args(q, bits, width);
  OutputRows sink{out.mutable_data_ptr<float>(), width};
  advise_huge_pages(sink.out, static_cast<size_t>(q.rows * width) * sizeof(float));
  parallel_rows(q.rows, width,
                [&](int, int64_t r0, int64_t r1) { dequantize_block(a, r0, r1, sink); });
  return out;
}

at::Tensor dequantize_unproject_rows(const at::Tensor& packed_in, const at::Tensor& zero_in,
                                     const at::Tensor& range_in, int64_t bits, int64_t k,
                                     int64_t d, uint64_t seed, int64_t projection_offset) {
  constexpr const char* fn = "qtrain._ext.dequantize_unproject_rows";
  check_projection(fn, d, k, projection_offset);
  const QuantizedInput q = check_quantized(fn, packed_in, zero_in, range_in, bits, k);
  TORCH_CHECK_VALUE(q.rows <= (int64_t{1} << 60) / std::max<int64_t>(d, 1), fn,
                    ": rows * d too large: ", q.rows, " x ", d);
  at::Tensor out = at::empty({q.rows, d}, packed_in.options().dtype(at::kFloat));
  if (q.rows * d == 0) return out;
  float* op = out.mutable_data_ptr<float>();
  advise_huge_pages(op, static_cast<size_t>(q.rows * d) * sizeof(float));
  const DequantizeArgs a = dequantize_args(q, bits, k);
  const SignMasks m =
      sign_masks(d, k, rng::keys_from_seed(seed), static_cast<uint64_t>(projection_offset), true);
  parallel_rows(
      q.rows, k,
      [&](int, int64_t r0, int64_t r1) {
        UnprojectedRows sink(*a.K, op, d, k, m, r0, r1);
        dequantize_block(a, r0, r1, sink);
      },
      d);
  return out;
}

namespace {

// bytes of a message segment: packed values, then bfloat16 zeros and ranges
int64_t segment_bytes(int64_t rows, int64_t width, int64_t bits) {
  return rows == 0 ? 0 : packed_bytes(rows * width, bits) + 4 * rows;
}

// A validated contiguous int64 row index of `rows` entries into a tensor of `limit` rows;
// with `unique`, no row twice (threads write the rows it names).
at::Tensor check_row_index(const char* fn, const at::Tensor& index_in, int64_t limit,
                           bool unique) {
  TORCH_CHECK_TYPE(index_in.scalar_type() == at::kLong && index_in.dim() == 1, fn,
                   ": index must be a 1-d int64 tensor, got ", index_in.scalar_type(), " ",
                   index_in.sizes());
  TORCH_CHECK_VALUE(index_in.device().is_cpu(), fn, ": index must be a CPU tensor");
  at::Tensor index = index_in.contiguous();
  const int64_t* ip = index.const_data_ptr<int64_t>();
  std::vector<uint8_t> seen(unique ? static_cast<size_t>(limit) : 0, 0);
  for (int64_t i = 0; i < index.numel(); ++i) {
    TORCH_CHECK_INDEX(ip[i] >= 0 && ip[i] < limit, fn, ": index[", i, "] = ", ip[i],
                      " is outside [0, ", limit, ")");
    if (unique) {
      TORCH_CHECK_VALUE(!seen[static_cast<size_t>(ip[i])], fn, ": index names row ", ip[i],
                        " twice; each row may be written once");
      seen[static_cast<size_t>(ip[i])] = 1;
    }
  }
  return index;
}

void check_segment(const char* fn, const at::Tensor& segment, int64_t expected) {
  TORCH_CHECK_TYPE(segment.scalar_type() == at::kByte && segment.dim() == 1, fn,
                   ": the segment must be a 1-d uint8 tensor, got ", segment.scalar_type(), " ",
                   segment.sizes());
  TORCH_CHECK_VALUE(segment.device().is_cpu() && segment.is_contiguous(), fn,
                    ": the segment must be a contiguous CPU tensor");
  TORCH_CHECK_VALUE(segment.numel() == expected, fn, ": the segment has ", segment.numel(),
                    " bytes, its rows need ", expected);
}

}  // namespace

void quantize_rows_into(const at::Tensor& x_in, const std::optional<at::Tensor>& index_in,
                        int64_t bits, bool stochastic, uint64_t seed, int64_t offset,
                        at::Tensor out) {
  constexpr const char* fn = "qtrain._ext.quantize_rows_into";
  check_bits(fn, bits);
  check_rows_input(fn, x_in);
  const int64_t width = x_in.size(1);
  const at::Tensor index =
      index_in.has_value() ? check_row_index(fn, *index_in, x_in.size(0), false) : at::Tensor();
  const int64_t rows = index.defined() ? index.numel() : x_in.size(0);
  TORCH_CHECK_VALUE(width == 0 || rows <= (int64_t{1} << 60) / width, fn,
                    ": rows * width too large: ", rows, " x ", width);
  check_count(fn, rows * width);
  check_counter_range(fn, rows * width, offset);
  check_segment(fn, out, segment_bytes(rows, width, bits));
  if (rows == 0) return;
  uint8_t* o = static_cast<uint8_t*>(out.mutable_data_ptr());
  const int64_t n_packed = packed_bytes(rows * width, bits);
  if (width == 0) {  // no values: each row's zero and range are those of an empty row
    std::memset(o, 0, static_cast<size_t>(4 * rows));
    return;
  }
  const at::Tensor x = x_in.contiguous();
  const QuantizeArgs a = quantize_args(o, o + n_packed, o + n_packed + 2 * rows, width, bits,
                                       stochastic, seed, offset);
  if (index.defined()) {
    IndexedInputRows src{x.const_data_ptr<float>(), width, index.const_data_ptr<int64_t>()};
    parallel_rows(rows, width,
                  [&](int, int64_t r0, int64_t r1) { quantize_block(a, r0, r1, src); });
  } else {
    InputRows src{x.const_data_ptr<float>(), width};
    parallel_rows(rows, width,
                  [&](int, int64_t r0, int64_t r1) { quantize_block(a, r0, r1, src); });
  }
}

void dequantize_rows_into(const at::Tensor& segment, int64_t rows, int64_t bits, at::Tensor out,
                          const std::optional<at::Tensor>& index_in, bool add) {
  constexpr const char* fn = "qtrain._ext.dequantize_rows_into";
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat && out.dim() == 2, fn,
                   ": out must be a 2-d float32 tensor [rows, width], got ", out.scalar_type(),
                   " ", out.sizes());
  TORCH_CHECK_VALUE(out.device().is_cpu() && out.is_contiguous(), fn,
                    ": out must be a contiguous CPU tensor");
  TORCH_CHECK_VALUE(rows >= 0, fn, ": rows must be >= 0, got ", rows);
  const int64_t width = out.size(1);
  at::Tensor index;
  if (index_in.has_value()) {
    index = check_row_index(fn, *index_in, out.size(0), true);
    TORCH_CHECK_VALUE(index.numel() == rows, fn, ": index has ", index.numel(),
                      " entries for ", rows, " rows");
  } else {
    TORCH_CHECK_VALUE(rows == out.size(0), fn, ": without an index the segment's ", rows,
                      " rows must fill out's ", out.size(0));
  }
  TORCH_CHECK_VALUE(width == 0 || rows <= (int64_t{1} << 60) / width, fn,
                    ": rows * width too large: ", rows, " x ", width);
  check_segment(fn, segment, segment_bytes(rows, width, bits));
  if (rows == 0 || width == 0) return;
  const uint8_t* in = static_cast<const uint8_t*>(segment.const_data_ptr());
  const int64_t n_packed = packed_bytes(rows * width, bits);
  const DequantizeArgs a{&kernels(), in, in + n_packed, in + n_packed + 2 * rows, width, bits};
  float* op = out.mutable_data_ptr<float>();
  if (!index.defined() && !add) {
    OutputRows sink{op, width};
    parallel_rows(rows, width,
                  [&](int, int64_t r0, int64_t r1) { dequantize_block(a, r0, r1, sink); });
    return;
  }
  const int64_t* ip = index.defined() ? index.const_data_ptr<int64_t>() : nullptr;
  parallel_rows(rows, width, [&](int, int64_t r0, int64_t r1) {
    IndexedOutputRows sink(op, width, ip, add);
    dequantize_block(a, r0, r1, sink);
  });
}

at::Tensor pack_bits(const at::Tensor& values_in, int64_t bits) {
  constexpr const char* fn = "qtrain._ext.pack_bits";
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(values_in.scalar_type() == at::kByte || values_in.scalar_type() == at::kBool,
                   fn, ": values must be uint8 or bool, got ", values_in.scalar_type());
  TORCH_CHECK_VALUE(values_in.device().is_cpu(), fn, ": values must be a CPU tensor");
  TORCH_CHECK_VALUE(values_in.layout() == at::kStrided, fn,
                    ": values must be a dense (strided) tensor");
  const int64_t n = values_in.numel();
  check_count(fn, n);
  const at::Tensor values = values_in.contiguous();
  const int64_t nbytes = packed_bytes(n, bits);
  at::Tensor out = at::empty({nbytes}, values.options().dtype(at::kByte));
  if (n == 0) return out;
  const auto* in = static_cast<const uint8_t*>(values.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  advise_huge_pages(op, static_cast<size_t>(nbytes));
  if (bits == 8) {
    parallel_ranges(n, [&](int64_t b, int64_t e) {
      std::memcpy(op + b, in + b, static_cast<size_t>(e - b));
    });
    return out;
  }
  const Kernels& K = kernels();
  const PackFn pack = K.pack[bits_index(bits)];
  const int64_t groups = n / 8;
  parallel_ranges(groups, [&](int64_t b, int64_t e) { pack(in + 8 * b, op + bits * b, e - b); });
  pack_tail(K, in + 8 * groups, n - 8 * groups, op + bits * groups, bits);
  return out;
}

at::Tensor unpack_bits(const at::Tensor& packed_in, int64_t bits, int64_t n) {
  constexpr const char* fn = "qtrain._ext.unpack_bits";
  check_bits(fn, bits);
  TORCH_CHECK_TYPE(packed_in.scalar_type() == at::kByte && packed_in.dim() == 1, fn,
                   ": packed must be a 1-d uint8 tensor, got ", packed_in.scalar_type(), " ",
                   packed_in.sizes());
  TORCH_CHECK_VALUE(packed_in.device().is_cpu(), fn, ": packed must be a CPU tensor");
  check_count(fn, n);
  TORCH_CHECK_VALUE(packed_in.numel() >= packed_bytes(n, bits), fn, ": packed has ",
                    packed_in.numel(), " bytes, ", n, " values of ", bits, " bits need ",
                    packed_bytes(n, bits));
  at::Tensor out = at::empty({n}, packed_in.options());
  if (n == 0) return out;
  const at::Tensor packed = packed_in.contiguous();
  const auto* in = static_cast<const uint8_t*>(packed.const_data_ptr());
  auto* op = static_cast<uint8_t*>(out.mutable_data_ptr());
  advise_huge_pages(op, static_cast<size_t>(n));
  if (bits == 8) {
    parallel_ranges(n, [&](int64_t b, int64_t e) {
      std::memcpy(op + b, in + b, static_cast<size_t>(e - b));
    });
    return out;
  }
  const Kernels& K = kernels();
  const PackFn unpack = K.unpack[bits_index(bits)];
  const int64_t groups = n / 8;
  parallel_ranges(groups,
                  [&](int64_t b, int64_t e) { unpack(in + bits * b, op + 8 * b, e - b); });
  unpack_tail(K, in + bits * groups, n - 8 * groups, op + 8 * groups, bits);
  return out;
}

at::Tensor rademacher(int64_t d, int64_t k, uint64_t seed, int64_t offset) {
  constexpr const char* fn = "qtrain._ext.rademacher";
  TORCH_CHECK_VALUE(d >= 0 && k >= 1, fn, ": need d >= 0 and k >= 1, got d=", d, ", k=", k);
  TORCH_CHECK_VALUE(d <= std::numeric_limits<int64_t>::max() / k, fn, ": d * k overflows: d=", d,
                    ", k=", k);
  const int64_t n = d * k;
  check_counter_range(fn, n, offset);
  at::Tensor out = at::empty({d, k}, at::TensorOptions().dtype(at::kFloat));
  if (n == 0) return out;
  float* op = out.mutable_data_ptr<float>();
  advise_huge_pages(op, static_cast<size_t>(n) * sizeof(float));
  // fl32(1 / sqrt(k)): both double operations are correctly rounded, as in Python
  const uint32_t mag_bits =
      as_bits(static_cast<float>(1.0 / std::sqrt(static_cast<double>(k))));
  const Kernels& K = kernels();
  const rng::Keys keys = rng::keys_from_seed(seed);
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    for_counter_segments(static_cast<uint64_t>(offset), b, e,
                         [&](int64_t i, int64_t len, uint32_t lo, uint32_t hi) {
                           K.signs(op + i, len, mag_bits, lo, keys.k1, rng::block_key(keys, hi));
                         });
  });
  return out;
}

// out[i] = grad[i] * scale where bit i of the 1-bit stream `packed` is set, else +0:
// the backward of ReLU (scale 1) and of inverted dropout (scale 1 / (1 - p)) read
// straight from the packed mask, one pass and one allocation (torch's bool-mask
// where / masked_fill take 2-3x longer than a multiply on this CPU).
at::Tensor masked_scale(const at::Tensor& grad_in, const at::Tensor& packed_in, double scale) {
  constexpr const char* fn = "qtrain._ext.masked_scale";
  TORCH_CHECK_TYPE(grad_in.scalar_type() == at::kFloat, fn, ": grad must be float32, got ",
                   grad_in.scalar_type());
  TORCH_CHECK_TYPE(packed_in.scalar_type() == at::kByte && packed_in.dim() == 1, fn,
                   ": packed must be a 1-d uint8 tensor, got ", packed_in.scalar_type(), " ",
                   packed_in.sizes());
  TORCH_CHECK_VALUE(grad_in.device().is_cpu() && packed_in.device().is_cpu(), fn,
                    ": grad and packed must be CPU tensors");
  const int64_t n = grad_in.numel();
  TORCH_CHECK_VALUE(packed_in.numel() >= packed_bytes(n, 1), fn, ": packed has ",
                    packed_in.numel(), " bytes, ", n, " mask bits need ", packed_bytes(n, 1));
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor packed = packed_in.contiguous();
  at::Tensor out = at::empty(grad.sizes(), grad.options());
  if (n == 0) return out;
  const auto* g = static_cast<const float*>(grad.const_data_ptr());
  const auto* m = static_cast<const uint8_t*>(packed.const_data_ptr());
  auto* o = static_cast<float*>(out.mutable_data_ptr());
  advise_huge_pages(o, static_cast<size_t>(n) * sizeof(float));
  const float s = static_cast<float>(scale);
  const int64_t bytes = n / 8;
  parallel_ranges(bytes, [&](int64_t b, int64_t e) {
    for (int64_t byte = b; byte < e; ++byte) {
      const uint32_t bits = m[byte];
      const float* gi = g + 8 * byte;
      float* oi = o + 8 * byte;
      for (int j = 0; j < 8; ++j) {  // branch-free: keep the product's bits or clear them (+0)
        const uint32_t keep = 0u - ((bits >> j) & 1u);
        oi[j] = as_float(as_bits(gi[j] * s) & keep);
      }
    }
  });
  for (int64_t i = 8 * bytes; i < n; ++i) o[i] = ((m[i / 8] >> (i % 8)) & 1u) ? g[i] * s : 0.0f;
  return out;
}

}  // namespace qtrain
