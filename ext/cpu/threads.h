// OpenMP team sizes shared by the CPU kernels.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace qtrain {

// Threads for `work` units when each thread should get at least `grain` of them:
// a parallel region costs microseconds when the machine is quiet and up to a
// scheduler time slice when it is not (a busy core delays the whole team), so
// small inputs run on one thread. torch's thread setting caps the team.
inline int plan_threads(int64_t work, int64_t grain) {
  const int64_t want = (work + grain - 1) / grain;
  const int64_t have = std::max(1, at::get_num_threads());
  return static_cast<int>(std::max<int64_t>(1, std::min(want, have)));
}

}  // namespace qtrain
