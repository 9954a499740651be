// Counter-based random numbers shared by every qtrain kernel (CPU and CUDA).
//
// Element i of a stream is a pure function of (seed, counter = offset + i), so
// results do not depend on thread count, block size or launch order, and the
// pure-PyTorch reference (qtrain/quant/rng.py) reproduces them bit for bit.
//
//   hash32(x)  = "lowbias32" (C. Wellons): x ^= x>>16; x *= 0x21f0aaad;
//                x ^= x>>15; x *= 0x735a2d97; x ^= x>>15   (all mod 2^32)
//   seed (u64) -> s_lo, s_hi;  k1 = hash32(s_lo ^ hash32(s_hi ^ 0x9e3779b9))
//                              k2 = hash32(k1 ^ 0x85ebca6b)
//   counter (u64) -> lo, hi;   h  = hash32(hash32(lo ^ k1) ^ hash32(hi ^ k2))
//   uniform = (h >> 8) / 2^24  in [0, 1), 24 random bits, exact in float32
//
// The key enters both rounds, so two seeds never give streams that are plain
// permutations of each other's counters; hi changes only every 2^32 elements,
// so kernels hoist hash32(hi ^ k2) out of their inner loops.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QT_HD __host__ __device__ __forceinline__
#else
#define QT_HD inline
#endif

namespace qtrain {
namespace rng {

QT_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

struct Keys {
  uint32_t k1;
  uint32_t k2;
};

QT_HD Keys keys_from_seed(uint64_t seed) {
  const uint32_t s_lo = static_cast<uint32_t>(seed);
  const uint32_t s_hi = static_cast<uint32_t>(seed >> 32);
  Keys k;
  k.k1 = hash32(s_lo ^ hash32(s_hi ^ 0x9e3779b9u));
  k.k2 = hash32(k.k1 ^ 0x85ebca6bu);
  return k;
}

// Per-2^32-block key: constant while the counter's high word is constant.
QT_HD uint32_t block_key(const Keys& k, uint32_t hi) { return hash32(hi ^ k.k2); }

QT_HD uint32_t bits_lo(uint32_t k1, uint32_t kh, uint32_t lo) {
  return hash32(hash32(lo ^ k1) ^ kh);
}

// 24-bit uniform in [0, 1); int32 conversion so vector units use signed cvt.
QT_HD float to_unit(uint32_t h) {
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * 5.9604644775390625e-08f;  // 2^-24
}

QT_HD float uniform(const Keys& k, uint64_t counter) {
  const uint32_t lo = static_cast<uint32_t>(counter);
  const uint32_t hi = static_cast<uint32_t>(counter >> 32);
  return to_unit(bits_lo(k.k1, block_key(k, hi), lo));
}

}  // namespace rng
}  // namespace qtrain
