// How int8_block_gemm orders its float32 additions (ops/int8_block_gemm.cpp): the blocks of
// K are cut into block_gemm_groups(blocks, M, N) contiguous groups, group g holding blocks
// [blocks * g / G, blocks * (g + 1) / G); each group's terms are added in block order from
// 0, and the groups' sums in group order. A function of the shape alone, so the CPU kernel
// (whose threads take whole groups), the CUDA kernel and the reference
// (qtrain/ops/gemm.py block_gemm_groups) add the same values in the same order.
#pragma once

#include <algorithm>
#include <cstdint>

namespace qtrain {

// At most 16 groups (enough for the threads of one CPU), fewer when M x N is large enough
// that 16 float32 partials of it would pass 64 MiB; at least one, at most one per block.
inline int64_t block_gemm_groups(int64_t blocks, int64_t M, int64_t N) {
  constexpr int64_t kMaxGroups = 16;
  constexpr int64_t kPartialBytes = int64_t{64} << 20;
  const int64_t per = std::max<int64_t>(1, M * N * 4);
  const int64_t fit = std::max<int64_t>(1, kPartialBytes / per);
  return std::max<int64_t>(1, std::min({blocks, kMaxGroups, fit}));
}

}  // namespace qtrain
