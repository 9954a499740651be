// What the CPU kernels of the row codecs share (quantize_rows, dequantize_rows, their
// *_into message forms, the fused projections, pack_bits / unpack_bits): the codec, the
// bit packing, the row blocks threads take, and the ISA-variant table of kernel bodies
// (defined once, in rowwise_variants.cpp). The references are qtrain/quant/rowwise.py
// and qtrain/quant/projection.py; results equal them bit for bit for any thread count
// and ISA variant:
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
//
// Argument checks are not here: each op's front (ext/ops/) makes them for every device.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/checks.h"
#include "common/rng.h"
#include "cpu/isa.h"
#include "cpu/mem.h"
#include "cpu/ranges.h"
#include "cpu/threads.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the row codecs pack bit streams through little-endian integer stores"
#endif

namespace qtrain {
namespace rowwise {

using checks::packed_bytes;
using checks::segment_bytes;
using ranges::for_counter_segments;

// ---------------------------------------------------------------- the kernel table

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

// A row's sums on each side of a threshold t (quantize_rows_means): values >= t and the
// rest (NaN among them), in float64.
struct SideSums {
  double high;
  double low;
  int64_t high_count;
};

// The kernel bodies of one ISA variant (rowwise_variants.cpp).
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
  double (*row_sum)(const float*, int64_t);              // float64, kSumLanes accumulators
  SideSums (*side_sums)(const float*, int64_t, float);   // the same accumulators per side
  void (*at_least)(const float*, uint8_t*, int64_t, float);  // q[i] = x[i] >= t
};


// The table of the variant in use (QT_SELECT_VARIANT; rowwise_variants.cpp).
const Kernels& kernels();

// signed_product's mask rows are padded to a multiple of this (and so of every 2 * L).
constexpr int64_t kSignTile = 32;

// ---------------------------------------------------------------- helpers

// Elements per thread at least (one thread compresses ~1M floats in about 1 ms).
constexpr int64_t kGrain = int64_t{1} << 18;
// Values staged between quantizing and packing (and unpacking and
// dequantizing): a multiple of 8, small enough for L1.
constexpr int64_t kTile = 4096;

inline int bits_index(int64_t bits) { return bits == 1 ? 0 : bits == 2 ? 1 : 2; }

// Pack the first n (<= 8) values of in (zero-padded) and write only the
// packed_bytes(n) bytes that exist: the stream's last, partial group.
inline void pack_tail(const Kernels& K, const uint8_t* in, int64_t n, uint8_t* out,
                      int64_t bits) {
  if (n <= 0) return;
  uint8_t vals[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t bytes[8];
  std::memcpy(vals, in, static_cast<size_t>(n));
  K.pack[bits_index(bits)](vals, bytes, 1);
  std::memcpy(out, bytes, static_cast<size_t>(packed_bytes(n, bits)));
}

// Unpack the stream's last, partial group (n <= 8 values) reading only its bytes.
inline void unpack_tail(const Kernels& K, const uint8_t* in, int64_t n, uint8_t* out,
                        int64_t bits) {
  if (n <= 0) return;
  uint8_t bytes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t vals[8];
  std::memcpy(bytes, in, static_cast<size_t>(packed_bytes(n, bits)));
  K.unpack[bits_index(bits)](bytes, vals, 1);
  std::memcpy(out, vals, static_cast<size_t>(n));
}

// Thread t of T: rows [b, e), boundaries on multiples of `align` rows.
inline std::pair<int64_t, int64_t> split_rows(int64_t rows, int64_t align, int t, int T) {
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

// float from bits and back
inline float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline uint32_t as_bits(float f) {
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
                     bool transposed);  // rowwise_variants.cpp

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


// ---------------------------------------------------------------- op plumbing

// (packed, zero, range) of a quantize_rows output for rows x width values, allocated.
struct QuantizedRows {
  at::Tensor packed, zero, range;
};

inline QuantizedRows allocate_quantized(const at::TensorOptions& opts, int64_t rows,
                                        int64_t width, int64_t bits) {
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
inline QuantizeArgs quantize_args(uint8_t* packed, uint8_t* zero, uint8_t* range, int64_t width,
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

inline QuantizeArgs quantize_args(QuantizedRows& q, int64_t width, int64_t bits, bool stochastic,
                                  uint64_t seed, int64_t offset) {
  return quantize_args(static_cast<uint8_t*>(q.packed.mutable_data_ptr()),
                       static_cast<uint8_t*>(q.zero.mutable_data_ptr()),
                       static_cast<uint8_t*>(q.range.mutable_data_ptr()), width, bits, stochastic,
                       seed, offset);
}

// Arguments of dequantize_block reading (packed, zero, range) of rows x `width` values
// (checked by the op's front); the contiguous copies, if any were needed, stay alive
// with it.
struct QuantizedInput {
  at::Tensor packed, zero, range;
  DequantizeArgs args;
};

inline QuantizedInput quantized_input(const at::Tensor& packed, const at::Tensor& zero,
                                      const at::Tensor& range, int64_t bits, int64_t width) {
  QuantizedInput q{packed.contiguous(), zero.contiguous(), range.contiguous(), {}};
  q.args.K = &kernels();
  q.args.packed = static_cast<const uint8_t*>(q.packed.const_data_ptr());
  q.args.zero = static_cast<const uint8_t*>(q.zero.const_data_ptr());
  q.args.range = static_cast<const uint8_t*>(q.range.const_data_ptr());
  q.args.width = width;
  q.args.bits = bits;
  return q;
}

// The contiguous int64 row index of a message (its type checked by the op's front),
// every entry in [0, limit) (IndexError naming the first that is not) and, with
// `unique`, no row twice (ValueError: threads write the rows it names). Found in one
// pass over the index, before any thread starts.
inline at::Tensor checked_row_index(const char* fn, const at::Tensor& index_in, int64_t limit,
                                    bool unique) {
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

}  // namespace rowwise
}  // namespace qtrain
