// keep_mask_rows on the CPU (front: ops/keep_mask_rows.cpp; reference qtrain/ops/masks.py
// reference_keep_mask): element (r, j) of a [rows, width] tensor is kept when
//
//   (hash at counter ids[r] * width + j  >> 8)  >=  threshold      (threshold in [0, 2^24])
//
// with the counter generator of common/rng.h, so the mask of a node's row is a
// pure function of (seed, its global id, the feature): a worker that holds
// rows of a partition draws exactly the rows a single process draws for the
// whole graph. The mask comes back packed, 1 bit per element in row-major
// order, little-endian within bytes (the layout of pack_bits(values, 1)).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/rng.h"
#include "cpu/isa.h"
#include "cpu/threads.h"

namespace qtrain {
namespace {

// keep[t] = 1 where the hash at counter lo0 + t (high word's key kh) clears the threshold
QT_ALWAYS_INLINE void keep_body(uint8_t* __restrict keep, int64_t n, uint32_t lo0, uint32_t k1,
                                uint32_t kh, uint32_t threshold) {
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t h = rng::bits_lo(k1, kh, lo0 + static_cast<uint32_t>(t));
    keep[t] = static_cast<uint8_t>((h >> 8) >= threshold);
  }
}

struct Kernels {
  void (*keep)(uint8_t*, int64_t, uint32_t, uint32_t, uint32_t, uint32_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR)                                                         \
  ATTR void keep_##NAME(uint8_t* keep, int64_t n, uint32_t lo0, uint32_t k1, uint32_t kh,     \
                        uint32_t threshold) {                                                 \
    keep_body(keep, n, lo0, k1, kh, threshold);                                               \
  }                                                                                           \
  const Kernels kernels_##NAME = {keep_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

constexpr int64_t kTile = 4096;              // mask values staged before packing (multiple of 8)
constexpr int64_t kGrain = int64_t{1} << 18;  // elements per thread at least

// Elements [begin, end) of the flattened mask (begin a multiple of 8) into packed bytes.
void keep_range(const Kernels& K, const int64_t* ids, int64_t width, const rng::Keys& keys,
                uint32_t threshold, int64_t begin, int64_t end, uint8_t* packed) {
  alignas(64) uint8_t buf[kTile];
  int64_t r = begin / width, j = begin % width;
  for (int64_t i = begin; i < end;) {
    const int64_t len = std::min({end - i, kTile, width - j});
    // counters of this row segment: ids[r] * width + j ... (may cross a 2^32 boundary)
    uint64_t c = static_cast<uint64_t>(ids[r]) * static_cast<uint64_t>(width) +
                 static_cast<uint64_t>(j);
    for (int64_t t = 0; t < len;) {
      const auto lo = static_cast<uint32_t>(c), hi = static_cast<uint32_t>(c >> 32);
      const int64_t n = std::min<int64_t>(len - t, static_cast<int64_t>((uint64_t{1} << 32) - lo));
      K.keep(buf + t, n, lo, keys.k1, rng::block_key(keys, hi), threshold);
      t += n;
      c += static_cast<uint64_t>(n);
    }
    // pack: value i sits at bit i % 8 of byte i / 8; segments need not start on a byte
    for (int64_t t = 0; t < len; ++t) {
      const int64_t e = i + t;
      uint8_t& byte = packed[e >> 3];
      if ((e & 7) == 0) byte = 0;
      byte = static_cast<uint8_t>(byte | (buf[t] << (e & 7)));
    }
    i += len;
    j += len;
    if (j == width) {
      j = 0;
      ++r;
    }
  }
}

at::Tensor keep_mask_rows(const at::Tensor& ids_in, int64_t width, int64_t threshold,
                          int64_t seed) {
  const int64_t rows = ids_in.numel();
  const at::Tensor ids = ids_in.contiguous();
  const int64_t* id = ids.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {  // counters ids * width + j must stay below 2^63
    TORCH_CHECK_VALUE(id[r] >= 0 && (width == 0 || id[r] < ((int64_t{1} << 62) / width)),
                      "qtrain::keep_mask_rows: ids must be in [0, 2^62 / width), got ", id[r],
                      " at ", r);
  }
  const int64_t n = rows * width;
  at::Tensor out = at::empty({(n + 7) / 8}, ids.options().dtype(at::kByte));
  if (n == 0) return out;
  auto* packed = static_cast<uint8_t*>(out.mutable_data_ptr());
  const Kernels& K = kernels();
  const rng::Keys keys = rng::keys_from_seed(static_cast<uint64_t>(seed));
  const auto thr = static_cast<uint32_t>(threshold);
  const int nt = plan_threads(n, kGrain);
  const int64_t bytes = (n + 7) / 8;
  // whole bytes per thread, so no two threads write one byte
  for_team_ranges(nt, bytes, [&](int, int64_t b0, int64_t b1) {
    keep_range(K, id, width, keys, thr, 8 * b0, std::min(n, 8 * b1), packed);
  });
  return out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("keep_mask_rows", &qtrain::keep_mask_rows); }
