// scatter_rows_add on the CPU (front: ops/scatter_rows_add.cpp; reference
// qtrain/ops/scatter.py reference_scatter_rows_add; CUDA twin cuda/scatter_rows_add_kernel.cu):
// the transposed product of a 0/1 CSR matrix over a block of its rows, added into out.
//
//   out[indices[k]] += x[r]        r = 0 .. R - 1, k = indptr[r] .. indptr[r + 1]
//
// Deterministic: every output row receives its additions in (r, k) order, one float32 add
// per element each (-ffp-contract=off; plain adds anyway), so the result is bit for bit a
// sequential loop's, whatever the thread count and the ISA variant. Each of the T OpenMP
// threads owns the output rows u with (u / 64) % T == t (64-row chunks dealt round robin:
// a hub's neighbours spread over the threads, and no two threads write one cache line) and
// walks ALL the entries of the range, adding x[r] only into the rows it owns; the
// destination row kPrefetch entries ahead is prefetched when the thread owns it. The row
// add is W-lane float vectors (Lanes<ISA>::vf) and a scalar tail for odd widths. Small
// inputs run on one thread (plan_threads).
//
// indptr may be a row range of a larger CSR (indptr[a : b + 1] with the whole indices): it is
// read as int64 (R + 1 entries, converted if int32) and only indices[indptr[0] .. indptr[R])
// is read, in its own dtype (never promoted: that would copy every entry of the whole CSR
// per call). Everything only the data shows is refused before any row is added, so out is
// left as it was: indptr[0] < 0, a decrease, indptr[R] > indices.numel() (checked in that
// order), then an index read outside [0, N) (the first such entry is named).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/csr_rows.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/threads.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace {

using csr_rows::kPrefetch;
using csr_rows::row_in_range;
using sparse::Lanes;

constexpr const char* kFn = "qtrain::scatter_rows_add";
constexpr int kOwnShift = 6;                  // output rows are owned in chunks of 2^6 = 64
constexpr int64_t kCheckChunk = int64_t{1} << 16;  // indices per task of the index check

// n % d for 32-bit n and d without a division (Lemire, Kaser and Kurz, "Faster remainder
// by direct computation", 2019): the owner test runs once per entry and thread.
struct FastMod {
  uint64_t m;
  uint64_t d;
  explicit FastMod(uint32_t div) : m(~uint64_t{0} / div + 1), d(div) {}
  QT_ALWAYS_INLINE uint32_t operator()(uint32_t n) const {
    return static_cast<uint32_t>((static_cast<unsigned __int128>(m * n) * d) >> 64);
  }
};

struct Args {
  const int64_t* indptr;  // R + 1 bounds, checked
  const void* indices;    // indices[first .. last), checked: entry k is at k - first
  const float* x;
  float* out;
  int64_t rows;   // R
  int64_t first;  // indptr[0]
  int64_t D;
};

// out row o += x row s, D floats: W-lane vectors, then a scalar tail.
template <int ISA>
QT_ALWAYS_INLINE void add_row(float* o, const float* s, int64_t D) {
  using vf = typename Lanes<ISA>::vf;
  constexpr int W = Lanes<ISA>::W;
  int64_t f = 0;
#pragma GCC unroll 4
  for (; f + W <= D; f += W) {
    vf a, b;
    std::memcpy(&a, o + f, sizeof a);
    std::memcpy(&b, s + f, sizeof b);
    a += b;
    std::memcpy(o + f, &a, sizeof a);
  }
  for (; f < D; ++f) o[f] += s[f];
}

// Thread t of T: every entry of the range, in (r, k) order, added where t owns the row.
template <int ISA, typename I>
QT_ALWAYS_INLINE void walk_body(const Args& a, int t, int T) {
  const I* ix = static_cast<const I*>(a.indices);
  const int64_t* ip = a.indptr;
  const int64_t D = a.D;
  const int64_t n = ip[a.rows] - a.first;  // entries of the range
  const FastMod mod(static_cast<uint32_t>(T));
  const uint32_t me = static_cast<uint32_t>(t);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* s = a.x + r * D;
    const int64_t e = ip[r + 1] - a.first;
    for (int64_t k = ip[r] - a.first; k < e; ++k) {
      if (k + kPrefetch < n) {
        const int64_t p = static_cast<int64_t>(ix[k + kPrefetch]);
        if (mod(static_cast<uint32_t>(p >> kOwnShift)) == me) {
          __builtin_prefetch(a.out + p * D, 1);
          __builtin_prefetch(a.out + p * D + D - 1, 1);
        }
      }
      const int64_t u = static_cast<int64_t>(ix[k]);
      if (mod(static_cast<uint32_t>(u >> kOwnShift)) != me) continue;
      add_row<ISA>(a.out + u * D, s, D);
    }
  }
}

struct Kernels {
  void (*walk_i32)(const Args&, int, int);
  void (*walk_i64)(const Args&, int, int);
};

#define QT_DEFINE_VARIANT(NAME, ATTR, ISA)                                 \
  ATTR QT_FLATTEN void walk_i32_##NAME(const Args& a, int t, int T) {      \
    walk_body<ISA, int32_t>(a, t, T);                                      \
  }                                                                        \
  ATTR QT_FLATTEN void walk_i64_##NAME(const Args& a, int t, int T) {      \
    walk_body<ISA, int64_t>(a, t, T);                                      \
  }                                                                        \
  const Kernels kernels_##NAME = {walk_i32_##NAME, walk_i64_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, isa::kDefault)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, isa::kAvx2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, isa::kAvx512)
#endif

const Kernels& kernels() { return QT_SELECT_VARIANT(kernels_); }

// indptr[0] >= 0, non-decreasing, indptr[R] <= nnz: in this order, before any thread starts.
void check_indptr_range(const int64_t* ip, int64_t rows, int64_t nnz) {
  TORCH_CHECK_VALUE(ip[0] >= 0, kFn, ": indptr[0] must be >= 0, got ", ip[0]);
  int64_t bad = -1;
  for (int64_t r = 0; r < rows; ++r) {
    if (ip[r + 1] < ip[r]) {
      bad = r;
      break;
    }
  }
  TORCH_CHECK_VALUE(bad < 0, kFn, ": indptr must be non-decreasing, but indptr[", bad + 1,
                    "] < indptr[", bad, "]");
  TORCH_CHECK_VALUE(ip[rows] <= nnz, kFn,
                    ": indptr[-1] must be at most the number of entries of indices (", nnz,
                    "), got ", ip[rows]);
}

// Every entry ix[0 .. n) lies in [0, rows); the first that does not is named.
template <typename I>
void check_indices(const I* ix, int64_t n, int64_t first, int64_t rows) {
  const int64_t chunks = (n + kCheckChunk - 1) / kCheckChunk;
  const int nt = plan_threads(n, int64_t{1} << 18);
  bool ok = true;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) reduction(&& : ok) schedule(static) if (nt > 1)
#endif
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kCheckChunk;
    ok = row_in_range(ix, b, std::min(n, b + kCheckChunk), rows) && ok;
  }
  (void)nt;
  if (ok) return;
  int64_t k = 0;
  while (static_cast<uint64_t>(static_cast<int64_t>(ix[k])) < static_cast<uint64_t>(rows)) ++k;
  TORCH_CHECK_VALUE(false, kFn, ": indices[", first + k, "] = ", static_cast<int64_t>(ix[k]),
                    " is outside [0, ", rows, ") (the rows of out)");
}

void scatter_rows_add(const at::Tensor& out, const at::Tensor& indptr_in,
                      const at::Tensor& indices_in, const at::Tensor& x_in) {
  const at::Tensor indptr = indptr_in.to(at::kLong).contiguous();
  const int64_t rows = indptr.numel() - 1;
  const int64_t nnz = indices_in.numel();
  const int64_t* ip = indptr.const_data_ptr<int64_t>();
  check_indptr_range(ip, rows, nnz);
  const int64_t first = ip[0];
  const int64_t n = ip[rows] - first;
  // the entries the range reads, in their own dtype: a view unless indices is strided
  const at::Tensor indices = indices_in.narrow(0, first, n).contiguous();
  const bool wide = indices.scalar_type() == at::kLong;
  const int64_t N = out.size(0);
  if (wide) {
    check_indices(indices.const_data_ptr<int64_t>(), n, first, N);
  } else {
    check_indices(indices.const_data_ptr<int32_t>(), n, first, N);
  }
  const int64_t D = out.size(1);
  if (n == 0 || D == 0) return;

  const at::Tensor x = x_in.contiguous();
  Args a{};
  a.indptr = ip;
  a.indices = indices.const_data_ptr();
  a.x = x.const_data_ptr<float>();
  a.out = out.mutable_data_ptr<float>();
  a.rows = rows;
  a.first = first;
  a.D = D;

  const Kernels& K = kernels();
  const auto run = wide ? K.walk_i64 : K.walk_i32;
  // no more threads than 64-row chunks (a thread without one would only read); chunk numbers
  // must fit FastMod's 32 bits (out of 2^38 rows or more: one thread)
  const int64_t owned = ((N - 1) >> kOwnShift) + 1;
  int nt = plan_threads(n * D, int64_t{1} << 16);
  nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, owned)));
  if (owned > (int64_t{1} << 32)) nt = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
  run(a, omp_get_thread_num(), omp_get_num_threads());  // the team's real size owns the rows
#else
  (void)nt;
  run(a, 0, 1);
#endif
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("scatter_rows_add", &qtrain::scatter_rows_add); }
