// OpenMP team sizes shared by the CPU kernels.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

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

// body(t, begin, end) for each thread t of a team of up to nt over [0, n), cut at n * t / T
// with T the team's real size (OpenMP may start fewer threads than asked); a thread whose
// range is empty is not called. Nothing in body may throw (it runs in a parallel region).
template <typename F>
void for_team_ranges(int nt, int64_t n, const F& body) {
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#ifdef _OPENMP
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
#else
    const int t = 0, team = 1;
#endif
    const int64_t begin = n * t / team, end = n * (t + 1) / team;
    if (end > begin) body(t, begin, end);
  }
}

}  // namespace qtrain
