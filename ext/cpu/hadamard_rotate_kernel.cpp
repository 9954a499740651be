// hadamard_rotate on the CPU (front: ops/hadamard_rotate.cpp; reference
// qtrain/quant/granular.py hadamard_rotate).
//
// Each row of out [rows, P] is built a tile at a time: a tile of T = max(B, 256) values
// (a multiple of B; the row's last tile may be shorter, still a multiple of B, as P is)
// is x's values copied in and zeros past cols, then the fast Walsh-Hadamard transform of
// each of its blocks in place, while the tile is in L1. With W the variant's vector width
// (4 float32 lanes for the portable code, 8 for AVX2, 16 for AVX-512):
//
//   stages h < W (those below B): W consecutive values in one vector, the partner of lane
//     i (lane i ^ h) brought in by a shuffle, u + v kept in the lower lane of each pair
//     and u - v in the upper (the last values of a row, whole blocks of B < W, in scalar
//     code)
//   stages h = W .. B / 2: for every pair (k, k + h) of a block, (u, v) -> (u + v, u - v),
//     W pairs per vector operation
//   then every value times fl32(1 / sqrt(B)) (B > 1)
//
// The same float32 operations in the same order for every element whatever the ISA
// variant and the thread count (the rows are split into contiguous chunks, one per thread
// of a team sized for the element count), and the same as the CUDA kernel's: the result
// is the same bits everywhere.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/isa.h"
#include "cpu/mem.h"
#include "cpu/ranges.h"
#include "cpu/threads.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace {

constexpr int64_t kTile = 256;  // values per tile (at least; a block when B is larger)

// ---------------------------------------------------------------- kernel bodies

// W float32 lanes as a GCC generic vector: one source, which each ISA wrapper lowers to
// its own registers (W = 4: SSE2, 8: AVX2, 16: AVX-512), as cpu/lanes.h does. Only the
// IEEE adds and subtracts of the scalar code, so every W gives the same bits.
template <int W>
struct Vec {
  typedef float vf __attribute__((vector_size(4 * W)));
  typedef int32_t vi __attribute__((vector_size(4 * W)));
};

// Stage h = H (< W) on W consecutive values: lane i's partner is lane i ^ H; the lower
// lane of a pair keeps u + v, the upper u - v (u the lower lane's value, v the upper's).
template <int W, int H, size_t... I>
QT_ALWAYS_INLINE typename Vec<W>::vf lane_stage(typename Vec<W>::vf v,
                                                std::index_sequence<I...>) {
#if defined(__clang__)
  const typename Vec<W>::vf w = __builtin_shufflevector(v, v, (I ^ H)...);
  return __builtin_shufflevector(v + w, w - v, ((I & H) ? I + W : I)...);
#else
  using vi = typename Vec<W>::vi;
  const typename Vec<W>::vf w = __builtin_shuffle(v, vi{static_cast<int32_t>(I ^ H)...});
  return __builtin_shuffle(v + w, w - v, vi{static_cast<int32_t>((I & H) ? I + W : I)...});
#endif
}

// Stages h = 1 .. min(B, W) / 2 on W consecutive values (whole blocks, or parts of one).
template <int W>
QT_ALWAYS_INLINE typename Vec<W>::vf lane_stages(typename Vec<W>::vf v, int64_t block) {
  constexpr auto lanes = std::make_index_sequence<W>{};
  v = lane_stage<W, 1>(v, lanes);
  if (block > 2) v = lane_stage<W, 2>(v, lanes);
  if constexpr (W > 4) {
    if (block > 4) v = lane_stage<W, 4>(v, lanes);
  }
  if constexpr (W > 8) {
    if (block > 8) v = lane_stage<W, 8>(v, lanes);
  }
  return v;
}

// Stages h < W of every block of t[0, n), n a multiple of B: W values at a time, and the
// last n % W values (whole blocks of B < W) in scalar code.
template <int W>
QT_ALWAYS_INLINE void narrow_stages(float* __restrict t, int64_t n, int64_t block) {
  using vf = typename Vec<W>::vf;
  if (block == 1) return;
  const int64_t whole = n / W * W;
  for (int64_t k = 0; k < whole; k += W) {
    vf v;
    std::memcpy(&v, t + k, sizeof v);
    v = lane_stages<W>(v, block);
    std::memcpy(t + k, &v, sizeof v);
  }
  for (int64_t h = 1; h < block && whole < n; h *= 2) {
    for (int64_t s = whole; s < n; s += 2 * h) {
      for (int64_t j = s; j < s + h; ++j) {
        const float u = t[j], v = t[j + h];
        t[j] = u + v;
        t[j + h] = u - v;
      }
    }
  }
}

// Stages h = W .. B / 2 of every block of t[0, n): pairs of W-value vectors.
template <int W>
QT_ALWAYS_INLINE void wide_stages(float* __restrict t, int64_t n, int64_t block) {
  using vf = typename Vec<W>::vf;
  for (int64_t h = W; h < block; h *= 2) {
    for (int64_t s = 0; s < n; s += 2 * h) {
      for (int64_t j = s; j < s + h; j += W) {
        vf u, v;
        std::memcpy(&u, t + j, sizeof u);
        std::memcpy(&v, t + j + h, sizeof v);
        const vf lo = u + v, hi = u - v;
        std::memcpy(t + j, &lo, sizeof lo);
        std::memcpy(t + j + h, &hi, sizeof hi);
      }
    }
  }
}

// Rows [r0, r1) of x [.., cols] into out [.., padded], W lanes a vector.
template <int W>
QT_ALWAYS_INLINE void rotate_rows_body(const float* __restrict x, float* __restrict out,
                                       int64_t r0, int64_t r1, int64_t cols, int64_t padded,
                                       int64_t block, float scale) {
  const int64_t tile = std::max(block, kTile);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols;
    float* orow = out + r * padded;
    for (int64_t c0 = 0; c0 < padded; c0 += tile) {
      const int64_t n = std::min(tile, padded - c0);
      float* t = orow + c0;
      const int64_t have = std::clamp<int64_t>(cols - c0, 0, n);
      if (have > 0) std::memcpy(t, xr + c0, static_cast<size_t>(have) * sizeof(float));
      for (int64_t j = have; j < n; ++j) t[j] = 0.0f;
      narrow_stages<W>(t, n, block);
      wide_stages<W>(t, n, block);
      if (block > 1) {
        for (int64_t j = 0; j < n; ++j) t[j] = t[j] * scale;
      }
    }
  }
}

// ---------------------------------------------------------------- ISA variants

using RowsFn = void (*)(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, float);

struct Kernels {
  RowsFn rows;
};

#define QT_DEFINE_VARIANT(NAME, ATTR, W)                                                      \
  ATTR void rotate_rows_##NAME(const float* x, float* out, int64_t r0, int64_t r1,            \
                               int64_t cols, int64_t padded, int64_t block, float scale) {    \
    rotate_rows_body<W>(x, out, r0, r1, cols, padded, block, scale);                          \
  }                                                                                           \
  const Kernels kernels_##NAME = {rotate_rows_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, 4)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, 8)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, 16)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// ---------------------------------------------------------------- op

at::Tensor hadamard_rotate(const at::Tensor& x_in, int64_t block) {
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t padded = (cols + block - 1) / block * block;
  at::Tensor out = at::empty({rows, padded}, x.options());
  const int64_t n = rows * padded;
  if (n == 0) return out;

  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  advise_huge_pages(op, static_cast<size_t>(n) * sizeof(float));
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  const RowsFn body = kernels().rows;

  const int nt = static_cast<int>(std::min<int64_t>(plan_threads(n, ranges::kGrain), rows));
  for_team_ranges(nt, rows, [&](int, int64_t r0, int64_t r1) {
    body(xp, op, r0, r1, cols, padded, block, scale);
  });
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("hadamard_rotate", &qtrain::hadamard_rotate); }
