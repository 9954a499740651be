// Memory hints shared by the CPU kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace qtrain {

// Outputs of the row-wise kernels are large (nodes x hidden) and freshly allocated
// (torch's CPU allocator does not cache), so writing them costs one page fault per
// 4 KiB; with transparent huge pages ("madvise" mode) it is one per 2 MiB. The hint
// covers only the 2 MiB-aligned interior of the buffer, changes no data, and is
// harmless if the kernel refuses it.
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (bytes < 4 * kHuge) return;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace qtrain
