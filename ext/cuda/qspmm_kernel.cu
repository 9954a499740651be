// qspmm on CUDA (front: ops/qspmm.cpp): quantized SpMM on a CSR graph (tango-sc23
// sec. 3.2-3.3); the definition is qtrain/ops/sparse.py (reference_qspmm), the CPU twin
// cpu/qspmm_kernel.cpp:
//
//   copy:      out[r] = fl32(float(sum_k q[indices[k]]) * scale)             exact integer sum
//   weighted:  acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))  float32, CSR order
//              out[r] = fl32(acc[r] * scale)
//
// Row-parallel: a group of G lanes (G = 1 .. 32, a power of two, from the row width)
// owns one output row and walks its entries in CSR order, each lane owning 4-feature
// chunks (one 32-bit int8 gather per entry and chunk, float4 stores), so the
// weighted sums are added in exactly the CPU kernel's order and agree with it bit
// for bit. Wide rows use the whole warp (G = 32) with up to 4 chunks per lane, and
// windows of 512 features beyond that. The group reads G entries' indices (and
// per-edge weights) with one coalesced load and hands them out with shuffles. The
// incidence form (edge-to-node sums) is the copy form over edge rows; per-head
// weights ([E, H]: the per-head split) pick the weight by the chunk's head.
//
// Copy sums accumulate in int32 (exact below degree 2^31 / 128); longer rows switch
// to int64. The front has checked dtypes, shapes and devices; what only the data
// shows (indptr not 0 .. nnz and non-decreasing, an index out of range) zeroes the
// affected rows and raises a device flag that the host reads back after the launch
// and turns into the CPU op's ValueError. Rows of width 0 and graphs without rows are
// checked too (their launches write nothing).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/sparse_operands.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxDegreeInt32 = (int64_t{1} << 31) / 128 - 1;
constexpr int kBadIndptr = 1;
constexpr int kBadIndex = 2;
constexpr int kBadEid = 4;

struct SpmmArgs {
  const void* indptr;
  const void* indices;
  const void* eids;  // null: entry k uses weight row k
  const int8_t* q;
  const float* w;    // null: copy form
  float* out;
  int64_t rows;
  int64_t nnz;
  int64_t n_in;  // rows of q
  int64_t n_w;   // rows of w
  int64_t F;     // H * D
  int64_t D;
  int64_t Hw;    // weights per edge: 1 or H
  float scale;
  bool vec;      // F % 4 == 0, D % 4 == 0, q 4-byte aligned: 32-bit gathers, float4 stores
  int* flag;
};

// 4 int8 features [f, f + 4) of a row (zeros past F).
__device__ __forceinline__ void load_chunk(const int8_t* row, int64_t f, int64_t F, bool vec,
                                           int32_t (&v)[4]) {
  if (vec) {
    const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(row + f));
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = sbyte(w, j);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = f + j < F ? static_cast<int32_t>(__ldg(row + f + j)) : 0;
  }
}

__device__ __forceinline__ void store_chunk(float* o, int64_t f, int64_t F, bool vec,
                                            const float (&y)[4]) {
  if (vec) {
    *reinterpret_cast<float4*>(o + f) = make_float4(y[0], y[1], y[2], y[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (f + j < F) o[f + j] = y[j];
  }
}

// Features [f0, f0 + G * 4 * NCH) of row r: entries b .. e in CSR order. Returns the
// error bits seen (the caller zeroes the row when they are not 0).
template <typename I, int G, int NCH, bool WEIGHTED, typename Acc>
__device__ __forceinline__ int row_window(const SpmmArgs& a, int64_t b, int64_t e, int64_t f0,
                                          int lane, unsigned gmask, float* o) {
  const I* ix = static_cast<const I*>(a.indices);
  const I* ex = static_cast<const I*>(a.eids);
  Acc acc[NCH][4];
#pragma unroll
  for (int c = 0; c < NCH; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[c][j] = Acc(0);
  int bad = 0;
  const bool per_head = a.Hw > 1;
  for (int64_t k0 = b; k0 < e; k0 += G) {
    // one coalesced read of G entries, shared out below with shuffles
    const int64_t k = k0 + lane;
    I my_idx = 0;
    I my_eid = 0;
    float my_w = 0.0f;
    // an entry out of range is skipped (index -1: nothing is read for it, not even
    // from an empty q or weight); the flag makes the caller zero the row
    if (k < e) {
      my_idx = ix[k];
      if (static_cast<uint64_t>(static_cast<int64_t>(my_idx)) >= static_cast<uint64_t>(a.n_in)) {
        bad |= kBadIndex;
        my_idx = static_cast<I>(-1);
      }
      if constexpr (WEIGHTED) {
        my_eid = ex != nullptr ? ex[k] : static_cast<I>(k);
        if (ex != nullptr &&
            static_cast<uint64_t>(static_cast<int64_t>(my_eid)) >= static_cast<uint64_t>(a.n_w)) {
          bad |= kBadEid;
          my_idx = static_cast<I>(-1);
        }
        if (!per_head && my_idx >= 0) my_w = __ldg(a.w + static_cast<int64_t>(my_eid));
      }
    }
    const int nb = e - k0 < G ? static_cast<int>(e - k0) : G;
#pragma unroll 4
    for (int j = 0; j < nb; ++j) {
      const int64_t idx = static_cast<int64_t>(__shfl_sync(gmask, my_idx, j, G));
      if (idx < 0) continue;  // the same entry for the whole group: all lanes skip it
      const int8_t* src = a.q + idx * a.F;
      float wk = 0.0f;
      int64_t eid = 0;
      if constexpr (WEIGHTED) {
        if (per_head) {
          eid = static_cast<int64_t>(__shfl_sync(gmask, my_eid, j, G));
        } else {
          wk = __shfl_sync(gmask, my_w, j, G);
        }
      }
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        const int64_t f = f0 + 4 * (lane + c * G);
        if (f >= a.F) continue;
        int32_t v[4];
        load_chunk(src, f, a.F, a.vec, v);
        if constexpr (WEIGHTED) {
          if (per_head) {
            if (a.vec) {  // D % 4 == 0: the chunk lies in one head
              const float wh = __ldg(a.w + eid * a.Hw + f / a.D);
#pragma unroll
              for (int t = 0; t < 4; ++t) acc[c][t] = __fadd_rn(acc[c][t], __fmul_rn(wh, static_cast<float>(v[t])));
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) {
                if (f + t < a.F) {
                  const float wh = __ldg(a.w + eid * a.Hw + (f + t) / a.D);
                  acc[c][t] = __fadd_rn(acc[c][t], __fmul_rn(wh, static_cast<float>(v[t])));
                }
              }
            }
          } else {
#pragma unroll
            for (int t = 0; t < 4; ++t) acc[c][t] = __fadd_rn(acc[c][t], __fmul_rn(wk, static_cast<float>(v[t])));
          }
        } else {
#pragma unroll
          for (int t = 0; t < 4; ++t) acc[c][t] += static_cast<Acc>(v[t]);
        }
      }
    }
  }
  // the whole group agrees on whether the row is valid
  bad = static_cast<int>(__reduce_or_sync(gmask, static_cast<unsigned>(bad)));
  if (bad != 0) return bad;
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    const int64_t f = f0 + 4 * (lane + c * G);
    if (f >= a.F) continue;
    float y[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if constexpr (WEIGHTED) {
        y[t] = __fmul_rn(acc[c][t], a.scale);
      } else if constexpr (sizeof(Acc) == 8) {
        y[t] = __fmul_rn(__ll2float_rn(static_cast<long long>(acc[c][t])), a.scale);
      } else {
        y[t] = __fmul_rn(__int2float_rn(static_cast<int>(acc[c][t])), a.scale);
      }
    }
    store_chunk(o, f, a.F, a.vec, y);
  }
  return 0;
}

template <typename I, int G, int NCH, bool WEIGHTED>
__global__ void __launch_bounds__(kThreads) spmm_kernel(SpmmArgs a) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  if (r >= a.rows) return;  // groups are aligned in the warp: a group leaves together
  const int lane = static_cast<int>(threadIdx.x % G);
  const unsigned gmask =
      G == 32 ? 0xffffffffu : ((1u << G) - 1u) << ((threadIdx.x & 31) / G * G);
  const I* ip = static_cast<const I*>(a.indptr);
  const int64_t b = static_cast<int64_t>(ip[r]);
  const int64_t e = static_cast<int64_t>(ip[r + 1]);
  float* o = a.out + r * a.F;
  int bad = 0;
  if (b < 0 || e < b || e > a.nnz || (r == 0 && b != 0) || (r == a.rows - 1 && e != a.nnz)) {
    bad = kBadIndptr;
  } else {
    constexpr int64_t window = int64_t{4} * G * NCH;
    // a row of width 0 still walks one window, which checks its indices
    for (int64_t f0 = 0; (f0 < a.F || f0 == 0) && bad == 0; f0 += window) {
      if (!WEIGHTED && e - b > kMaxDegreeInt32) {
        bad = row_window<I, G, NCH, WEIGHTED, int64_t>(a, b, e, f0, lane, gmask, o);
      } else {
        bad = row_window<I, G, NCH, WEIGHTED, typename std::conditional<WEIGHTED, float, int32_t>::type>(
            a, b, e, f0, lane, gmask, o);
      }
    }
  }
  if (bad != 0) {
    for (int64_t f = lane; f < a.F; f += G) o[f] = 0.0f;
    if (lane == 0) atomicOr(a.flag, bad);
  }
}

// A graph without rows: indptr ([x]) is valid only as [0] with no entries.
template <typename I>
__global__ void no_rows_kernel(const I* __restrict__ indptr, int64_t nnz, int* __restrict__ flag) {
  if (static_cast<int64_t>(indptr[0]) != 0 || nnz != 0) *flag = kBadIndptr;
}

template <typename I, int G, int NCH>
void launch_g(const SpmmArgs& a, bool weighted, cudaStream_t stream) {
  const int64_t blocks = (a.rows * G + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(blocks <= int64_t{0x7fffffff}, "qtrain::qspmm: too many rows (", a.rows,
                    ")");
  const unsigned grid = static_cast<unsigned>(blocks);
  if (weighted) {
    spmm_kernel<I, G, NCH, true><<<grid, kThreads, 0, stream>>>(a);
  } else {
    spmm_kernel<I, G, NCH, false><<<grid, kThreads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Group size from the row width: one lane per 4-feature chunk up to a warp.
template <typename I>
void launch(const SpmmArgs& a, bool weighted, cudaStream_t stream) {
  if (a.rows == 0) {
    no_rows_kernel<I><<<1, 1, 0, stream>>>(static_cast<const I*>(a.indptr), a.nnz, a.flag);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int64_t chunks = (a.F + 3) / 4;
  if (chunks <= 1) return launch_g<I, 1, 1>(a, weighted, stream);
  if (chunks <= 2) return launch_g<I, 2, 1>(a, weighted, stream);
  if (chunks <= 4) return launch_g<I, 4, 1>(a, weighted, stream);
  if (chunks <= 8) return launch_g<I, 8, 1>(a, weighted, stream);
  if (chunks <= 16) return launch_g<I, 16, 1>(a, weighted, stream);
  if (chunks <= 32) return launch_g<I, 32, 1>(a, weighted, stream);
  if (chunks <= 64) return launch_g<I, 32, 2>(a, weighted, stream);
  return launch_g<I, 32, 4>(a, weighted, stream);
}

at::Tensor qspmm(const at::Tensor& indptr_in, const at::Tensor& indices_in, const at::Tensor& q_in,
                 double scale, const std::optional<at::Tensor>& weight_in,
                 const std::optional<at::Tensor>& eids_in) {
  constexpr const char* fn = "qtrain::qspmm";
  const c10::cuda::CUDAGuard guard(indptr_in.device());
  const sparse_operands::Spmm s =
      sparse_operands::spmm(indptr_in, indices_in, q_in, weight_in, eids_in);
  const bool weighted = s.weighted, wide = s.wide, has_eids = s.eids.defined();
  const at::Tensor &indptr = s.indptr, &indices = s.indices, &eids = s.eids, &q = s.q, &w = s.w,
                   &out = s.out;
  const int64_t rows = s.rows, nnz = s.nnz, H = s.H, D = s.D, Hw = s.Hw;

  at::Tensor flag = at::zeros({1}, q.options().dtype(at::kInt));
  SpmmArgs a{};
  a.indptr = indptr.const_data_ptr();
  a.indices = indices.const_data_ptr();
  a.eids = has_eids ? eids.const_data_ptr() : nullptr;
  a.q = q.const_data_ptr<int8_t>();
  a.w = weighted ? w.const_data_ptr<float>() : nullptr;
  a.out = out.mutable_data_ptr<float>();
  a.rows = rows;
  a.nnz = nnz;
  a.n_in = q.size(0);
  a.n_w = weighted ? w.size(0) : 0;
  a.F = H * D;
  a.D = D;
  a.Hw = Hw;
  a.scale = static_cast<float>(scale);
  a.vec = a.F % 4 == 0 && (Hw == 1 || D % 4 == 0) && is_aligned(a.q, 4) && is_aligned(a.out, 16);
  a.flag = flag.mutable_data_ptr<int>();
  cudaStream_t stream = current_stream();
  if (wide) {
    launch<int64_t>(a, weighted, stream);
  } else {
    launch<int32_t>(a, weighted, stream);
  }
  const int bad = read_back(a.flag, stream);
  TORCH_CHECK_VALUE((bad & kBadIndptr) == 0, fn,
                    ": indptr must start at 0, never decrease and end at the number of entries (",
                    nnz, ")");
  TORCH_CHECK_VALUE(bad == 0, fn, ": an entry of indices is outside [0, ", a.n_in,
                    ") (rows of q)", has_eids ? " or of eids outside [0, " : "",
                    has_eids ? std::to_string(a.n_w) : std::string(),
                    has_eids ? ") (rows of weight)" : "");
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("qspmm", &qtrain::cuda::qspmm); }
