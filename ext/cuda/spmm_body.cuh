// The body of the CUDA quantized SpMM, shared by qspmm (int8 rows, cuda/qspmm_kernel.cu) and
// qspmm4 (4-bit values packed two per byte, cuda/qspmm4_kernel.cu): one body, templated on
// how a chunk of a row's values is read (Row: Int8Rows or Int4Rows), so both ops sum the
// same values in the same order and qspmm4 is bit for bit qspmm of the unpacked rows. The
// CPU twin is cpu/spmm_body.h.
//
//   copy:      out[r] = fl32(float(sum_k q[indices[k]]) * scale)             exact integer sum
//   weighted:  acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))  float32, CSR order
//              out[r] = fl32(acc[r] * scale)
//   row_scale: w[eids[k], h] above is fl32(w[eids[k], h] * row_scale[indices[k], h]) (w
//              taken as 1 without weight), read as the entry is gathered
//
// Work is handed out by the merge path (common/merge_path.h, qtrain/ops/partition.py):
// units of P items (rows' ends plus entries), one unit to a group of G lanes (G = 1 .. 32,
// a power of two, from the row width), so a hub row of a power-law graph is split across
// groups instead of serializing one. In its unit a group walks each row's piece in CSR
// order, each lane owning 4-feature chunks (one gather per entry and chunk: 32 bits of
// int8 values, 16 bits of packed ones; float4 stores); a row begun and ended in the unit
// is scaled and stored, the last piece of a split row is stored raw (scale 1) in its
// output row and the piece of the row in progress at the unit's end in the unit's carry
// row. A second kernel adds each split row's pieces in unit order and scales them. That
// is the CPU kernel's order, so the two agree bit for bit. Wide rows use the whole warp
// (G = 32) with up to 4 chunks per lane, and windows of 512 features beyond that. The
// group reads G entries' indices (and per-edge weights) with one coalesced load and hands
// them out with shuffles. The incidence form (edge-to-node sums) is the copy form over
// edge rows; per-head weights ([E, H]: the per-head split) pick the weight by the chunk's
// head.
//
// Copy sums accumulate in int32 within a piece (at most P <= 2^16 entries: exact, and
// exact as float32) and in int64 across pieces. The front has checked dtypes, shapes and
// devices; what only the data shows (indptr not 0 .. nnz and non-decreasing: a check
// kernel over every row; an index out of range: found as the pieces are read) raises a
// device flag that the host reads back after the launches and turns into the CPU op's
// ValueError. The kernels clamp what they read from indptr and the partition, so
// invalid data is refused without an access out of bounds.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/merge_path.h"
#include "common/sparse_operands.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace spmm_body {
namespace {

constexpr int kThreads = 256;
constexpr int kBadIndptr = 1;
constexpr int kBadIndex = 2;
constexpr int kBadEid = 4;

struct SpmmArgs {
  const void* indptr;
  const void* indices;
  const void* eids;  // null: entry k uses weight row k
  const uint8_t* q;  // int8 rows, or 4-bit values packed two per byte (Row says which)
  const float* w;    // null: copy form, or only row scales (rs)
  const float* rs;   // row_scale (null when absent)
  float* out;
  float* carry;  // [units, F]: the piece of the row in progress at a unit's end
  const int64_t* row_start;  // the merge-path partition (common/merge_path.h)
  const int64_t* entry_start;
  int64_t units;
  int64_t per_unit;
  int64_t rows;
  int64_t nnz;
  int64_t n_in;  // rows of q
  int64_t n_w;   // rows of w
  int64_t F;       // H * D output lanes per row
  int64_t D;
  int64_t stride;  // bytes per row of q
  int64_t Ds;      // bytes per head of q's rows
  int64_t Hw;    // weights per edge: 1 or H
  int64_t Hr;    // row scales per input row: 1 or H
  float scale;
  bool vec;      // whole aligned 4-value chunks (Row::vec_ok): one gather each, float4 stores
  int* flag;
  const char* fn;  // the op, for host-side errors
};

// How a row's values are read: Row::load_chunk(a, row, f, v) gives the 4 values [f, f + 4)
// of the row at `row` (zeros past F), Row::vec_ok whether every chunk can be one aligned
// gather.

// int8 rows (qspmm): value f at byte f; a chunk is one 32-bit gather.
struct Int8Rows {
  static bool vec_ok(const SpmmArgs& a, bool per_head) {
    return a.F % 4 == 0 && (!per_head || a.D % 4 == 0) && is_aligned(a.q, 4);
  }
  __device__ static __forceinline__ void load_chunk(const SpmmArgs& a, const uint8_t* row,
                                                    int64_t f, int32_t (&v)[4]) {
    const int8_t* r = reinterpret_cast<const int8_t*>(row);
    if (a.vec) {
      const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(r + f));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = sbyte(w, j);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = f + j < a.F ? static_cast<int32_t>(__ldg(r + f + j)) : 0;
    }
  }
};

// 4-bit values packed two per byte (qspmm4): value j of head h in byte h * Ds + j / 2, the
// low nibble for an even j. With an even width the heads' bytes follow each other (value
// f in byte f / 2) and a chunk is one 16-bit gather; otherwise each value is found alone.
struct Int4Rows {
  static bool vec_ok(const SpmmArgs& a, bool per_head) {
    return a.F % 4 == 0 && a.D % 2 == 0 && (!per_head || a.D % 4 == 0) && is_aligned(a.q, 2);
  }
  // nibble `which` (0: low, 1: high, ...) of w, sign-extended
  __device__ static __forceinline__ int32_t nibble(uint32_t w, int which) {
    return static_cast<int32_t>(w << (28 - 4 * which)) >> 28;
  }
  __device__ static __forceinline__ void load_chunk(const SpmmArgs& a, const uint8_t* row,
                                                    int64_t f, int32_t (&v)[4]) {
    if (a.vec) {
      const uint32_t w = __ldg(reinterpret_cast<const unsigned short*>(row + f / 2));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = nibble(w, j);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = 0;
        if (f + j < a.F) {
          const int64_t h = a.D == a.F ? 0 : (f + j) / a.D;
          const int64_t t = f + j - h * a.D;
          v[j] = nibble(__ldg(row + h * a.Ds + t / 2), static_cast<int>(t & 1));
        }
      }
    }
  }
};

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

// The weighted form's weight of entry (eid, src) for head h: w[eid, h] (1 without weight)
// times row_scale[src, h] (when given), each per head where it has heads, in float32.
__device__ __forceinline__ float entry_weight(const SpmmArgs& a, int64_t eid, int64_t src,
                                              int64_t h) {
  float wk = a.w != nullptr ? __ldg(a.w + eid * a.Hw + (a.Hw > 1 ? h : 0)) : 1.0f;
  if (a.rs != nullptr) wk = __fmul_rn(wk, __ldg(a.rs + src * a.Hr + (a.Hr > 1 ? h : 0)));
  return wk;
}

// Features [f0, f0 + G * 4 * NCH) of a piece: entries b .. e in CSR order, scaled by
// `scale` into o. Returns the error bits seen (nothing is stored when they are not 0).
template <class Row, typename I, int G, int NCH, bool WEIGHTED, typename Acc>
__device__ __forceinline__ int row_window(const SpmmArgs& a, int64_t b, int64_t e, int64_t f0,
                                          int lane, unsigned gmask, float scale, float* o) {
  const I* ix = static_cast<const I*>(a.indices);
  const I* ex = static_cast<const I*>(a.eids);
  Acc acc[NCH][4];
#pragma unroll
  for (int c = 0; c < NCH; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[c][j] = Acc(0);
  int bad = 0;
  const bool per_head = a.Hw > 1 || a.Hr > 1;
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
        if (!per_head && my_idx >= 0) {
          my_w = entry_weight(a, static_cast<int64_t>(my_eid), static_cast<int64_t>(my_idx), 0);
        }
      }
    }
    const int nb = e - k0 < G ? static_cast<int>(e - k0) : G;
#pragma unroll 4
    for (int j = 0; j < nb; ++j) {
      const int64_t idx = static_cast<int64_t>(__shfl_sync(gmask, my_idx, j, G));
      if (idx < 0) continue;  // the same entry for the whole group: all lanes skip it
      const uint8_t* src = a.q + idx * a.stride;
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
        Row::load_chunk(a, src, f, v);
        if constexpr (WEIGHTED) {
          if (per_head) {
            if (a.vec) {  // D % 4 == 0: the chunk lies in one head
              const float wh = entry_weight(a, eid, idx, f / a.D);
#pragma unroll
              for (int t = 0; t < 4; ++t) acc[c][t] = __fadd_rn(acc[c][t], __fmul_rn(wh, static_cast<float>(v[t])));
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) {
                if (f + t < a.F) {
                  const float wh = entry_weight(a, eid, idx, (f + t) / a.D);
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
        y[t] = __fmul_rn(acc[c][t], scale);
      } else {
        y[t] = __fmul_rn(__int2float_rn(static_cast<int>(acc[c][t])), scale);
      }
    }
    store_chunk(o, f, a.F, a.vec, y);
  }
  return 0;
}

// A piece (entries b .. e of one row) over every feature window. A row of width 0 still
// walks one window, which checks its indices.
template <class Row, typename I, int G, int NCH, bool WEIGHTED>
__device__ __forceinline__ int piece(const SpmmArgs& a, int64_t b, int64_t e, int lane,
                                     unsigned gmask, float scale, float* o) {
  using Acc = typename std::conditional<WEIGHTED, float, int32_t>::type;
  constexpr int64_t window = int64_t{4} * G * NCH;
  int bad = 0;
  for (int64_t f0 = 0; (f0 < a.F || f0 == 0) && bad == 0; f0 += window) {
    bad = row_window<Row, I, G, NCH, WEIGHTED, Acc>(a, b, e, f0, lane, gmask, scale, o);
  }
  return bad;
}

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Unit u of the merge path: the rows that end in it and the piece of the row in progress
// at its end (see the file's comment).
template <class Row, typename I, int G, int NCH, bool WEIGHTED>
__global__ void __launch_bounds__(kThreads) spmm_units_kernel(SpmmArgs a) {
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  if (u >= a.units) return;  // groups are aligned in the warp: a group leaves together
  const int lane = static_cast<int>(threadIdx.x % G);
  const unsigned gmask =
      G == 32 ? 0xffffffffu : ((1u << G) - 1u) << ((threadIdx.x & 31) / G * G);
  const I* ip = static_cast<const I*>(a.indptr);
  const int64_t rs = clamp64(a.row_start[u], 0, a.rows);
  const int64_t re = clamp64(a.row_start[u + 1], rs, a.rows);
  const int64_t es = clamp64(a.entry_start[u], 0, a.nnz);
  const int64_t ee = clamp64(a.entry_start[u + 1], es, a.nnz);
  int bad = 0;
  for (int64_t r = rs; r < re; ++r) {
    const int64_t b = static_cast<int64_t>(ip[r]);
    const bool whole = b >= es;
    const int64_t lo = whole ? clamp64(b, es, ee) : es;
    const int64_t hi = clamp64(static_cast<int64_t>(ip[r + 1]), lo, ee);
    bad |= piece<Row, I, G, NCH, WEIGHTED>(a, lo, hi, lane, gmask, whole ? a.scale : 1.0f,
                                           a.out + r * a.F);
  }
  if (re < a.rows) {
    const int64_t lo = clamp64(static_cast<int64_t>(ip[re]), es, ee);
    if (lo < ee) {
      bad |= piece<Row, I, G, NCH, WEIGHTED>(a, lo, ee, lane, gmask, 1.0f, a.carry + u * a.F);
    }
  }
  if (bad != 0 && lane == 0) atomicOr(a.flag, bad);
}

// The row split across units first .. u (its first item in unit first, its end in u): its
// pieces added in unit order (float32 adds; exact int64 sums of the copy form's
// float32 integers), then scaled. One warp per unit, lanes over the features.
template <typename I, bool WEIGHTED>
__global__ void __launch_bounds__(kThreads) fix_split_rows_kernel(SpmmArgs a) {
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  if (u == 0 || u >= a.units) return;  // unit 0 begins every row it touches
  const I* ip = static_cast<const I*>(a.indptr);
  const int64_t r = clamp64(a.row_start[u], 0, a.rows);
  const int64_t es = clamp64(a.entry_start[u], 0, a.nnz);
  if (r >= clamp64(a.row_start[u + 1], r, a.rows) || static_cast<int64_t>(ip[r]) >= es) return;
  const int64_t first = clamp64((static_cast<int64_t>(ip[r]) + r) / a.per_unit, 0, u);
  const bool last_piece = es < static_cast<int64_t>(ip[r + 1]);
  float* o = a.out + r * a.F;
  for (int64_t f = threadIdx.x % 32; f < a.F; f += 32) {
    if constexpr (WEIGHTED) {
      float acc = 0.0f;
      for (int64_t v = first; v < u; ++v) acc = __fadd_rn(acc, a.carry[v * a.F + f]);
      if (last_piece) acc = __fadd_rn(acc, o[f]);
      o[f] = __fmul_rn(acc, a.scale);
    } else {
      long long acc = 0;
      for (int64_t v = first; v < u; ++v) acc += __float2ll_rn(a.carry[v * a.F + f]);
      if (last_piece) acc += __float2ll_rn(o[f]);
      o[f] = __fmul_rn(__ll2float_rn(acc), a.scale);
    }
  }
}

// indptr must start at 0, never decrease and end at nnz (a graph without rows: [0], no
// entries). One thread per row.
template <typename I>
__global__ void check_indptr_kernel(const I* __restrict__ indptr, int64_t rows, int64_t nnz,
                                    int* __restrict__ flag) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r > rows) return;
  const int64_t v = static_cast<int64_t>(indptr[r]);
  const bool ok = (r > 0 || v == 0) && (r < rows || v == nnz) &&
                  (r == rows || (v >= 0 && static_cast<int64_t>(indptr[r + 1]) >= v));
  if (!ok) atomicOr(flag, kBadIndptr);
}

template <class Row, typename I, int G, int NCH>
void launch_g(const SpmmArgs& a, bool weighted, cudaStream_t stream) {
  const int64_t blocks = (a.units * G + kThreads - 1) / kThreads;
  const int64_t fix_blocks = (a.units * 32 + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(fix_blocks <= int64_t{0x7fffffff}, a.fn, ": too many units (", a.units, ")");
  const unsigned grid = static_cast<unsigned>(blocks);
  const unsigned fix_grid = static_cast<unsigned>(fix_blocks);
  if (weighted) {
    spmm_units_kernel<Row, I, G, NCH, true><<<grid, kThreads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    fix_split_rows_kernel<I, true><<<fix_grid, kThreads, 0, stream>>>(a);
  } else {
    spmm_units_kernel<Row, I, G, NCH, false><<<grid, kThreads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    fix_split_rows_kernel<I, false><<<fix_grid, kThreads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Checks indptr, then the units with a group size from the row width: one lane per
// 4-feature chunk up to a warp.
template <class Row, typename I>
void launch(const SpmmArgs& a, bool weighted, cudaStream_t stream) {
  const int64_t check_blocks = (a.rows + 1 + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(check_blocks <= int64_t{0x7fffffff}, a.fn, ": too many rows (", a.rows, ")");
  check_indptr_kernel<I><<<static_cast<unsigned>(check_blocks), kThreads, 0, stream>>>(
      static_cast<const I*>(a.indptr), a.rows, a.nnz, a.flag);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (a.rows == 0) return;
  const int64_t chunks = (a.F + 3) / 4;
  if (chunks <= 1) return launch_g<Row, I, 1, 1>(a, weighted, stream);
  if (chunks <= 2) return launch_g<Row, I, 2, 1>(a, weighted, stream);
  if (chunks <= 4) return launch_g<Row, I, 4, 1>(a, weighted, stream);
  if (chunks <= 8) return launch_g<Row, I, 8, 1>(a, weighted, stream);
  if (chunks <= 16) return launch_g<Row, I, 16, 1>(a, weighted, stream);
  if (chunks <= 32) return launch_g<Row, I, 32, 1>(a, weighted, stream);
  if (chunks <= 64) return launch_g<Row, I, 32, 2>(a, weighted, stream);
  return launch_g<Row, I, 32, 4>(a, weighted, stream);
}

// The op on prepared operands (s.q: int8 rows, or packed rows whose width s.D the front
// has checked); fn names the op and q_name its rows in errors.
template <class Row>
at::Tensor run(const char* fn, const char* q_name, const sparse_operands::Spmm& s,
               double scale) {
  const bool weighted = s.weighted, wide = s.wide, has_eids = s.eids.defined();
  const at::Tensor &indptr = s.indptr, &indices = s.indices, &eids = s.eids, &q = s.q, &w = s.w,
                   &out = s.out;
  const int64_t rows = s.rows, nnz = s.nnz, H = s.H, D = s.D, Hw = s.Hw;

  at::Tensor flag = at::zeros({1}, q.options().dtype(at::kInt));
  SpmmArgs a{};
  a.fn = fn;
  a.indptr = indptr.const_data_ptr();
  a.indices = indices.const_data_ptr();
  a.eids = has_eids ? eids.const_data_ptr() : nullptr;
  a.q = static_cast<const uint8_t*>(q.const_data_ptr());
  a.w = w.defined() && w.numel() > 0 ? w.const_data_ptr<float>() : nullptr;
  a.rs = s.rs.defined() ? s.rs.const_data_ptr<float>() : nullptr;
  a.out = out.mutable_data_ptr<float>();
  a.rows = rows;
  a.nnz = nnz;
  a.n_in = q.size(0);
  a.n_w = w.defined() ? w.size(0) : 0;
  a.F = H * D;
  a.D = D;
  a.Ds = q.size(-1);
  a.stride = H * a.Ds;
  a.Hw = Hw;
  a.Hr = s.Hr;
  a.scale = static_cast<float>(scale);
  a.flag = flag.mutable_data_ptr<int>();
  // the partition is built on the device from indptr (no sync); the kernels clamp it
  const merge_path::Partition part = merge_path::partition(indptr, nnz);
  const at::Tensor carry = at::empty({part.units, a.F}, out.options());
  a.carry = carry.mutable_data_ptr<float>();
  a.row_start = part.row_start.const_data_ptr<int64_t>();
  a.entry_start = part.entry_start.const_data_ptr<int64_t>();
  a.units = part.units;
  a.per_unit = part.per_unit;
  a.vec = Row::vec_ok(a, weighted && (Hw > 1 || s.Hr > 1)) && is_aligned(a.out, 16) &&
          is_aligned(a.carry, 16);
  cudaStream_t stream = current_stream();
  if (wide) {
    launch<Row, int64_t>(a, weighted, stream);
  } else {
    launch<Row, int32_t>(a, weighted, stream);
  }
  const int bad = read_back(a.flag, stream);
  TORCH_CHECK_VALUE((bad & kBadIndptr) == 0, fn,
                    ": indptr must start at 0, never decrease and end at the number of entries (",
                    nnz, ")");
  TORCH_CHECK_VALUE(bad == 0, fn, ": an entry of indices is outside [0, ", a.n_in, ") (rows of ",
                    q_name, ")", has_eids ? " or of eids outside [0, " : "",
                    has_eids ? std::to_string(a.n_w) : std::string(),
                    has_eids ? ") (rows of weight)" : "");
  return out;
}

}  // namespace
}  // namespace spmm_body
}  // namespace cuda
}  // namespace qtrain
