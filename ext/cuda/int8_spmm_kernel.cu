// int8_spmm on CUDA (front: ops/int8_spmm.cpp; reference qtrain/ops/integer.py
// reference_int_spmm, CPU twin cpu/int8_spmm_kernel.cpp): GCINT's sparse product, int8 edge
// values times int8 rows, exact int32 sums:
//
//   out[r] = saturate_int32(sum_k values[k] * q[indices[k]])     k = indptr[r] .. indptr[r+1]
//
// Row-parallel, as qspmm's copy form (cuda/qspmm_kernel.cu): a group of G lanes (G = 1 .. 32,
// a power of two, from the row width D) owns one output row and walks its entries, each lane
// owning 4-feature chunks (one 32-bit int8 gather per entry and chunk where D % 4 == 0, int4
// stores); wide rows use the whole warp with up to 4 chunks per lane, and windows of 512
// features beyond that. The group reads G entries' indices and values with one coalesced
// load each and hands them out with shuffles; entries of value 0 are skipped (they add 0).
//
// Exactness: |values[k] * q[..]| <= 2^14, so int32 sums are exact for rows of at most 131071
// entries; longer rows accumulate in int64 and saturate to [-2^31, 2^31 - 1] at the store.
// Integer sums are order-free, so the result is the reference's for any launch shape.
//
// indptr and indices may mix int32 and int64 (both promoted to int64 then, as
// common/sparse_operands.h does). What only the data shows (indptr[0] != 0, indptr[-1] != the
// number of entries, a decrease, an index outside q's rows) zeroes the affected rows and
// raises bits of a device flag (with the first decreasing position beside it) that the host
// reads back after the launch (read_back) and turns into the CPU kernel's ValueError, checked
// in the CPU kernel's order. Rows of width 0 and graphs without rows are checked too (their
// launches write nothing).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/integer.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr const char* kFn = "qtrain::int8_spmm";
constexpr int kThreads = 256;
constexpr int64_t kMaxDegreeInt32 = 131071;  // (2^31 - 1) / 2^14 entries: exact in int32
constexpr int kBadFirst = 1;  // indptr[0] != 0
constexpr int kBadLast = 2;   // indptr[rows] != nnz
constexpr int kBadOrder = 4;  // a row's entries not within 0 .. nnz, in order
constexpr int kBadIndex = 8;  // an index outside [0, N)

struct Int8SpmmArgs {
  const void* indptr;
  const void* indices;
  const int8_t* values;
  const int8_t* q;
  int32_t* out;
  int64_t rows;
  int64_t nnz;
  int64_t n_in;  // rows of q
  int64_t D;
  bool vec;      // D % 4 == 0, q 4-byte and out 16-byte aligned: 32-bit gathers, int4 stores
  unsigned long long* flag;  // [2]: the error bits, and rows - r for the first r with
                             // indptr[r + 1] < indptr[r] (0: none)
};

// 4 int8 features [f, f + 4) of a row (zeros past D).
__device__ __forceinline__ void load_chunk(const int8_t* row, int64_t f, int64_t D, bool vec,
                                           int32_t (&v)[4]) {
  if (vec) {
    const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(row + f));
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = sbyte(w, j);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = f + j < D ? static_cast<int32_t>(__ldg(row + f + j)) : 0;
  }
}

__device__ __forceinline__ void store_chunk(int32_t* o, int64_t f, int64_t D, bool vec,
                                            const int32_t (&y)[4]) {
  if (vec) {
    *reinterpret_cast<int4*>(o + f) = make_int4(y[0], y[1], y[2], y[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (f + j < D) o[f + j] = y[j];
  }
}

// Features [f0, f0 + G * 4 * NCH) of row r: entries b .. e. Acc: int32_t (exact up to
// kMaxDegreeInt32 entries) or long long. Returns the error bits seen (the caller zeroes the
// row when they are not 0).
template <typename I, int G, int NCH, typename Acc>
__device__ __forceinline__ int row_window(const Int8SpmmArgs& a, int64_t b, int64_t e,
                                          int64_t f0, int lane, unsigned gmask, int32_t* o) {
  const I* ix = static_cast<const I*>(a.indices);
  Acc acc[NCH][4];
#pragma unroll
  for (int c = 0; c < NCH; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[c][j] = Acc(0);
  int bad = 0;
  for (int64_t k0 = b; k0 < e; k0 += G) {
    // one coalesced read of G entries, shared out below with shuffles
    const int64_t k = k0 + lane;
    I my_idx = 0;
    int32_t my_val = 0;
    // an entry out of range is skipped (index -1: nothing is read for it, not even from an
    // empty q); the flag makes the caller zero the row
    if (k < e) {
      my_idx = ix[k];
      if (static_cast<uint64_t>(static_cast<int64_t>(my_idx)) >= static_cast<uint64_t>(a.n_in)) {
        bad |= kBadIndex;
        my_idx = static_cast<I>(-1);
      } else {
        my_val = static_cast<int32_t>(__ldg(a.values + k));
      }
    }
    const int nb = e - k0 < G ? static_cast<int>(e - k0) : G;
#pragma unroll 4
    for (int j = 0; j < nb; ++j) {
      const int64_t idx = static_cast<int64_t>(__shfl_sync(gmask, my_idx, j, G));
      const int32_t val = __shfl_sync(gmask, my_val, j, G);
      if (idx < 0 || val == 0) continue;  // the same entry for the whole group: all lanes skip
      const int8_t* src = a.q + idx * a.D;
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        const int64_t f = f0 + 4 * (lane + c * G);
        if (f >= a.D) continue;
        int32_t v[4];
        load_chunk(src, f, a.D, a.vec, v);
#pragma unroll
        for (int t = 0; t < 4; ++t) acc[c][t] += static_cast<Acc>(v[t]) * static_cast<Acc>(val);
      }
    }
  }
  // the whole group agrees on whether the row is valid
  bad = static_cast<int>(__reduce_or_sync(gmask, static_cast<unsigned>(bad)));
  if (bad != 0) return bad;
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    const int64_t f = f0 + 4 * (lane + c * G);
    if (f >= a.D) continue;
    int32_t y[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if constexpr (sizeof(Acc) == 8) {
        y[t] = saturate_int32(static_cast<long long>(acc[c][t]));
      } else {
        y[t] = static_cast<int32_t>(acc[c][t]);
      }
    }
    store_chunk(o, f, a.D, a.vec, y);
  }
  return 0;
}

template <typename I, int G, int NCH>
__global__ void __launch_bounds__(kThreads) int8_spmm_kernel(Int8SpmmArgs a) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  if (r >= a.rows) return;  // groups are aligned in the warp: a group leaves together
  const int lane = static_cast<int>(threadIdx.x % G);
  const unsigned gmask =
      G == 32 ? 0xffffffffu : ((1u << G) - 1u) << ((threadIdx.x & 31) / G * G);
  const I* ip = static_cast<const I*>(a.indptr);
  const int64_t b = static_cast<int64_t>(ip[r]);
  const int64_t e = static_cast<int64_t>(ip[r + 1]);
  int32_t* o = a.out + r * a.D;
  int bad = 0;
  if (r == 0 && b != 0) bad |= kBadFirst;
  if (r == a.rows - 1 && e != a.nnz) bad |= kBadLast;
  if (b < 0 || e < b || e > a.nnz) bad |= kBadOrder;
  if (e < b && lane == 0) atomicMax(a.flag + 1, static_cast<unsigned long long>(a.rows - r));
  if (bad == 0) {
    constexpr int64_t window = int64_t{4} * G * NCH;
    // a row of width 0 still walks one window, which checks its indices
    for (int64_t f0 = 0; (f0 < a.D || f0 == 0) && bad == 0; f0 += window) {
      if (e - b > kMaxDegreeInt32) {
        bad = row_window<I, G, NCH, long long>(a, b, e, f0, lane, gmask, o);
      } else {
        bad = row_window<I, G, NCH, int32_t>(a, b, e, f0, lane, gmask, o);
      }
    }
  }
  if (bad != 0) {
    for (int64_t f = lane; f < a.D; f += G) o[f] = 0;
    if (lane == 0) atomicOr(a.flag, static_cast<unsigned long long>(bad));
  }
}

// A graph without rows: indptr ([x]) is valid only as [0] with no entries.
template <typename I>
__global__ void no_rows_kernel(const I* __restrict__ indptr, int64_t nnz,
                               unsigned long long* __restrict__ flag) {
  const int64_t first = static_cast<int64_t>(indptr[0]);
  *flag = static_cast<unsigned long long>((first != 0 ? kBadFirst : 0) |
                                          (first != nnz ? kBadLast : 0));
}

template <typename I, int G, int NCH>
void launch_g(const Int8SpmmArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows * G + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(blocks <= int64_t{0x7fffffff}, kFn, ": too many rows (", a.rows, ")");
  int8_spmm_kernel<I, G, NCH><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Group size from the row width: one lane per 4-feature chunk up to a warp.
template <typename I>
void launch(const Int8SpmmArgs& a, cudaStream_t stream) {
  if (a.rows == 0) {
    no_rows_kernel<I><<<1, 1, 0, stream>>>(static_cast<const I*>(a.indptr), a.nnz, a.flag);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int64_t chunks = (a.D + 3) / 4;
  if (chunks <= 1) return launch_g<I, 1, 1>(a, stream);
  if (chunks <= 2) return launch_g<I, 2, 1>(a, stream);
  if (chunks <= 4) return launch_g<I, 4, 1>(a, stream);
  if (chunks <= 8) return launch_g<I, 8, 1>(a, stream);
  if (chunks <= 16) return launch_g<I, 16, 1>(a, stream);
  if (chunks <= 32) return launch_g<I, 32, 1>(a, stream);
  if (chunks <= 64) return launch_g<I, 32, 2>(a, stream);
  return launch_g<I, 32, 4>(a, stream);
}

// Int8SpmmArgs::flag as the host reads it back.
struct Flags {
  unsigned long long bad;
  unsigned long long decrease;
};

// Runs the launch, then turns the flag into the CPU kernel's ValueError (its checks' order:
// indptr's first entry, its last, its order, then the indices). Only a failure reads more.
template <typename I>
void run(const Int8SpmmArgs& a, cudaStream_t stream) {
  launch<I>(a, stream);
  const Flags f = read_back(reinterpret_cast<const Flags*>(a.flag), stream);
  const int bad = static_cast<int>(f.bad);
  if (bad == 0) return;
  const I* ip = static_cast<const I*>(a.indptr);
  TORCH_CHECK_VALUE((bad & kBadFirst) == 0, kFn, ": indptr[0] must be 0, got ",
                    static_cast<int64_t>(read_back(ip, stream)));
  TORCH_CHECK_VALUE((bad & kBadLast) == 0, kFn, ": indptr[-1] must equal the number of entries (",
                    a.nnz, "), got ", static_cast<int64_t>(read_back(ip + a.rows, stream)));
  // with indptr[0] = 0 and indptr[-1] = nnz, an entry outside 0 .. nnz implies a decrease
  const int64_t r = a.rows - static_cast<int64_t>(f.decrease);
  TORCH_CHECK_VALUE((bad & kBadOrder) == 0, kFn, ": indptr must be non-decreasing, but indptr[",
                    r + 1, "] < indptr[", r, "]");
  TORCH_CHECK_VALUE(false, kFn, ": an entry of indices is outside [0, ", a.n_in,
                    ") (rows of q)");
}

at::Tensor int8_spmm(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                     const at::Tensor& values_in, const at::Tensor& q_in) {
  const c10::cuda::CUDAGuard guard(indptr_in.device());
  const bool wide = indptr_in.scalar_type() == at::kLong || indices_in.scalar_type() == at::kLong;
  const at::ScalarType it = wide ? at::kLong : at::kInt;
  const at::Tensor indptr = indptr_in.to(it).contiguous();
  const at::Tensor indices = indices_in.to(it).contiguous();
  const at::Tensor values = values_in.contiguous();
  const at::Tensor q = q_in.contiguous();
  const int64_t rows = indptr.numel() - 1;
  const int64_t D = q.size(1);
  at::Tensor out = at::empty({rows, D}, q.options().dtype(at::kInt));
  at::Tensor flag = at::zeros({2}, q.options().dtype(at::kLong));

  Int8SpmmArgs a{};
  a.indptr = indptr.const_data_ptr();
  a.indices = indices.const_data_ptr();
  a.values = values.const_data_ptr<int8_t>();
  a.q = q.const_data_ptr<int8_t>();
  a.out = out.mutable_data_ptr<int32_t>();
  a.rows = rows;
  a.nnz = indices.numel();
  a.n_in = q.size(0);
  a.D = D;
  a.vec = D % 4 == 0 && is_aligned(a.q, 4) && is_aligned(a.out, 16);
  a.flag = reinterpret_cast<unsigned long long*>(flag.mutable_data_ptr<int64_t>());
  cudaStream_t stream = current_stream();
  if (wide) {
    run<int64_t>(a, stream);
  } else {
    run<int32_t>(a, stream);
  }
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("int8_spmm", &qtrain::cuda::int8_spmm); }
