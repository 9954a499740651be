// How the elementwise CPU kernels (quantize_symmetric, fill_counter_uniform) split a
// flat range over threads and over the counter stream's 2^32 blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/threads.h"

namespace qtrain {
namespace ranges {

// Elements per thread at least. One thread quantizes 1M floats in about half a
// millisecond, so smaller tensors (GAT's [N, heads, 1] attention terms) are not
// worth a parallel region that a busy second core can stall.
constexpr int64_t kGrain = int64_t{1} << 20;

// Contiguous range of thread t of T, boundaries on 64-element multiples.
inline std::pair<int64_t, int64_t> split(int64_t n, int t, int T) {
  int64_t chunk = (n + T - 1) / T;
  chunk = (chunk + 63) & ~int64_t{63};
  const int64_t b = std::min(n, chunk * t);
  return {b, std::min(n, b + chunk)};
}

// Run body(thread, begin, end) over [0, n) on up to plan_threads(n, kGrain) OpenMP threads.
template <typename F>
void parallel(int64_t n, const F& body) {
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

}  // namespace ranges
}  // namespace qtrain
