// What the quantized SDDMM's CUDA kernels share (qsddmm_kernel.cu: int8 rows;
// qsddmm4_kernel.cu: 4-bit rows packed two per byte): the arguments, an edge's rows with
// their range check, the row scales, one output element's float32 operations (the
// reference's, as explicit round-to-nearest intrinsics) and the host-side setup.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

#include "common/sparse_operands.h"
#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace sddmm {

constexpr int kThreads = 256;

using sparse_operands::kAdd;
using sparse_operands::kDot;
using sparse_operands::kMul;
using sparse_operands::kSub;

// T: the rows' bytes (int8_t, or uint8_t for packed rows).
template <typename T>
struct Args {
  const void* li;
  const void* ri;
  const T* ql;
  const T* qr;
  float* out;
  int64_t E;
  int64_t n_l;
  int64_t n_r;
  int64_t F;   // H * D values per row
  int64_t H;
  int64_t D;
  int64_t Ds;  // bytes a head takes: D (int8), ceil(D / 2) (packed); a row takes H * Ds
  float sl;
  float sr;
  float both;        // fl32(sl * sr)
  const float* rsl;  // row scales of q_l (null: none), Hl per row
  const float* rsr;  // row scales of q_r (null: none), Hr per row
  int64_t Hl;
  int64_t Hr;
  bool vec;  // aligned wide gathers (and float4 stores for int8 add / sub / mul)
  int* flag;
};

// The arguments of a prepared call (sparse_operands::sddmm) whose rows are T; `flag` is a
// device int the kernels set when an index is out of range.
template <typename T>
Args<T> make_args(const sparse_operands::Sddmm& s, double scale_lhs, double scale_rhs,
                  int* flag) {
  Args<T> a{};
  a.li = s.li.const_data_ptr();
  a.ri = s.ri.const_data_ptr();
  a.ql = static_cast<const T*>(s.ql.const_data_ptr());
  a.qr = static_cast<const T*>(s.qr.const_data_ptr());
  a.out = s.out.mutable_data_ptr<float>();
  a.E = s.E;
  a.n_l = s.ql.size(0);
  a.n_r = s.qr.size(0);
  a.F = s.H * s.D;
  a.H = s.H;
  a.D = s.D;
  a.Ds = s.Ds;
  a.sl = static_cast<float>(scale_lhs);
  a.sr = static_cast<float>(scale_rhs);
  a.both = a.sl * a.sr;  // host float32 multiply, as the CPU op
  a.rsl = s.rsl.defined() ? s.rsl.const_data_ptr<float>() : nullptr;
  a.rsr = s.rsr.defined() ? s.rsr.const_data_ptr<float>() : nullptr;
  a.Hl = s.Hl;
  a.Hr = s.Hr;
  a.flag = flag;
  return a;
}

// Blocks for `groups` groups of G lanes, kThreads lanes a block.
inline unsigned blocks_for(const char* fn, int64_t groups, int G) {
  const int64_t blocks = (groups * G + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(blocks <= int64_t{0x7fffffff}, fn, ": too many edges (", groups,
                    " groups)");
  return static_cast<unsigned>(blocks);
}

// Calls launch(std::integral_constant<int, G>) with G lanes per group: the power of two up to
// a warp that gives each lane one of `chunks` chunks of a group's work.
template <typename Launch>
void with_group_lanes(int64_t chunks, Launch&& launch) {
  if (chunks <= 1) return launch(std::integral_constant<int, 1>{});
  if (chunks <= 2) return launch(std::integral_constant<int, 2>{});
  if (chunks <= 4) return launch(std::integral_constant<int, 4>{});
  if (chunks <= 8) return launch(std::integral_constant<int, 8>{});
  if (chunks <= 16) return launch(std::integral_constant<int, 16>{});
  return launch(std::integral_constant<int, 32>{});
}

// Raises (op fn, operands named lhs / rhs) if a kernel set the flag.
template <typename T>
void check_flag(const char* fn, const char* lhs, const char* rhs, const Args<T>& a,
                cudaStream_t stream) {
  const int bad = read_back(a.flag, stream);
  TORCH_CHECK_VALUE(bad == 0, fn, ": an entry of lhs_index is outside [0, ", a.n_l,
                    ") (rows of ", lhs, ") or of rhs_index outside [0, ", a.n_r, ") (rows of ",
                    rhs, ")");
}

#if defined(__CUDACC__)

template <typename I, typename T>
__device__ __forceinline__ bool edge_rows(const Args<T>& a, int64_t e, int64_t& i, int64_t& j) {
  i = static_cast<int64_t>(static_cast<const I*>(a.li)[e]);
  j = static_cast<int64_t>(static_cast<const I*>(a.ri)[e]);
  return static_cast<uint64_t>(i) < static_cast<uint64_t>(a.n_l) &&
         static_cast<uint64_t>(j) < static_cast<uint64_t>(a.n_r);
}

// One side's scale for row `row`, head h: s, or fl32(s * rs[row, h]) with row scales.
__device__ __forceinline__ float side_scale(float s, const float* rs, int64_t Hs, int64_t row,
                                            int64_t h) {
  return rs == nullptr ? s : __fmul_rn(s, __ldg(rs + row * Hs + (Hs > 1 ? h : 0)));
}

template <int OP>
__device__ __forceinline__ float elem(int32_t x, int32_t y, float sl, float sr, float both) {
  if constexpr (OP == kAdd) {
    return __fadd_rn(__fmul_rn(static_cast<float>(x), sl), __fmul_rn(static_cast<float>(y), sr));
  } else if constexpr (OP == kSub) {
    return __fsub_rn(__fmul_rn(static_cast<float>(x), sl), __fmul_rn(static_cast<float>(y), sr));
  } else {
    return __fmul_rn(__int2float_rn(x * y), both);
  }
}

// Element f of edge (i, j), values x and y: with row scales its head's scales.
template <int OP, typename T>
__device__ __forceinline__ float elem_at(const Args<T>& a, int64_t i, int64_t j, int64_t f,
                                         int32_t x, int32_t y) {
  if (a.rsl == nullptr && a.rsr == nullptr) return elem<OP>(x, y, a.sl, a.sr, a.both);
  const int64_t h = a.D > 0 ? f / a.D : 0;
  const float sl = side_scale(a.sl, a.rsl, a.Hl, i, h);
  const float sr = side_scale(a.sr, a.rsr, a.Hr, j, h);
  return elem<OP>(x, y, sl, sr, __fmul_rn(sl, sr));
}

// The scale product of a dot's (edge, head): fl32(s_l * s_r) with its rows' scales.
template <typename T>
__device__ __forceinline__ float dot_scale(const Args<T>& a, int64_t i, int64_t j, int64_t h) {
  if (a.rsl == nullptr && a.rsr == nullptr) return a.both;
  return __fmul_rn(side_scale(a.sl, a.rsl, a.Hl, i, h), side_scale(a.sr, a.rsr, a.Hr, j, h));
}

#endif  // __CUDACC__

}  // namespace sddmm
}  // namespace cuda
}  // namespace qtrain
