// qsddmm4 on CUDA (front: ops/qsddmm4.cpp): qsddmm over rows of 4-bit values packed two per
// byte, bit for bit qsddmm(op, unpack_int4(packed_lhs, width), ..., unpack_int4(packed_rhs,
// width), ...) (reference: qtrain/ops/sparse.py reference_qsddmm4; CPU twin
// cpu/qsddmm4_kernel.cpp). Value t of head h of a row is nibble t & 1 of byte h * Ds + t / 2
// (Ds = ceil(width / 2) bytes a head; past an odd width the high nibble is not read).
//
// add / sub / mul: a group of G lanes per edge, a value per lane at a time, with the
// elementwise float32 operations of qsddmm (cuda/sddmm_common.cuh). dot: a group of G lanes
// per (edge, head); with aligned even-width heads each lane reads 8 values as one 32-bit
// word and multiplies them with DP4A (each nibble moved to the top of its byte, so a byte
// holds 16 times the value: two DP4As give 256 times the word's 8 products, exact), the
// group reducing with xor shuffles. Integer sums are exact in any order, so every launch
// shape gives the same bits. An index out of range zeroes the edge's output and raises a
// device flag that the host turns into the CPU op's ValueError.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <type_traits>

#include "common/sparse_operands.h"
#include "cuda/common.cuh"
#include "cuda/sddmm_common.cuh"

namespace qtrain {
namespace cuda {
namespace {

using sddmm::dot_scale;
using sddmm::edge_rows;
using sddmm::elem_at;
using sddmm::kAdd;
using sddmm::kDot;
using sddmm::kMul;
using sddmm::kSub;
using sddmm::kThreads;

using PackedArgs = sddmm::Args<uint8_t>;

constexpr const char* kFn = "qtrain::qsddmm4";

// Value t of the head at p, sign-extended.
__device__ __forceinline__ int32_t value_at(const uint8_t* p, int64_t t) {
  const uint32_t b = __ldg(p + t / 2);
  return static_cast<int32_t>(b << (28 - 4 * (t & 1))) >> 28;
}

// 256 times the sum of the 8 products of the nibbles of words wx and wy.
__device__ __forceinline__ int32_t dot8_times_256(uint32_t wx, uint32_t wy) {
  const int lo_x = static_cast<int>((wx << 4) & 0xF0F0F0F0u);
  const int lo_y = static_cast<int>((wy << 4) & 0xF0F0F0F0u);
  const int hi_x = static_cast<int>(wx & 0xF0F0F0F0u);
  const int hi_y = static_cast<int>(wy & 0xF0F0F0F0u);
  return __dp4a(lo_x, lo_y, __dp4a(hi_x, hi_y, 0));
}

template <typename I, int G, int OP>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(PackedArgs a) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  if (e >= a.E) return;
  const int lane = static_cast<int>(threadIdx.x % G);
  int64_t i, j;
  float* o = a.out + e * a.F;
  if (!edge_rows<I>(a, e, i, j)) {
    for (int64_t f = lane; f < a.F; f += G) o[f] = 0.0f;
    if (lane == 0) atomicOr(a.flag, 1);
    return;
  }
  const uint8_t* x = a.ql + i * a.H * a.Ds;
  const uint8_t* y = a.qr + j * a.H * a.Ds;
  for (int64_t f = lane; f < a.F; f += G) {
    const int64_t h = f / a.D;
    const int64_t t = f - h * a.D;
    o[f] = elem_at<OP>(a, i, j, f, value_at(x + h * a.Ds, t), value_at(y + h * a.Ds, t));
  }
}

// One (edge, head) pair per group of G lanes.
template <typename I, int G, bool WIDE>
__global__ void __launch_bounds__(kThreads) dot_kernel(PackedArgs a) {
  const int64_t p = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  if (p >= a.E * a.H) return;
  const int lane = static_cast<int>(threadIdx.x % G);
  const unsigned gmask =
      G == 32 ? 0xffffffffu : ((1u << G) - 1u) << ((threadIdx.x & 31) / G * G);
  const int64_t e = p / a.H;
  const int64_t h = p - e * a.H;
  int64_t i, j;
  if (!edge_rows<I>(a, e, i, j)) {
    if (lane == 0) {
      a.out[p] = 0.0f;
      atomicOr(a.flag, 1);
    }
    return;
  }
  const uint8_t* x = a.ql + (i * a.H + h) * a.Ds;
  const uint8_t* y = a.qr + (j * a.H + h) * a.Ds;
  using Acc = typename std::conditional<WIDE, long long, int32_t>::type;
  Acc s = 0;
  if (a.vec) {  // D a multiple of 8, heads 4-byte aligned
    for (int64_t b = 4 * lane; b < a.Ds; b += 4 * G) {
      const uint32_t wx = __ldg(reinterpret_cast<const uint32_t*>(x + b));
      const uint32_t wy = __ldg(reinterpret_cast<const uint32_t*>(y + b));
      s += dot8_times_256(wx, wy) >> 8;
    }
  } else {
    for (int64_t t = lane; t < a.D; t += G) s += value_at(x, t) * value_at(y, t);
  }
#pragma unroll
  for (int off = G / 2; off > 0; off /= 2) s += __shfl_xor_sync(gmask, s, off, G);
  if (lane == 0) {
    float f;
    if constexpr (WIDE) {
      f = __ll2float_rn(s);
    } else {
      f = __int2float_rn(s);
    }
    a.out[p] = __fmul_rn(f, dot_scale(a, i, j, h));
  }
}

template <typename I, int G>
void launch_g(int op, const PackedArgs& a, cudaStream_t stream) {
  if (op == kDot) {
    const unsigned grid = sddmm::blocks_for(kFn, a.E * a.H, G);
    if (a.D >= (int64_t{1} << 17)) {
      dot_kernel<I, G, true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      dot_kernel<I, G, false><<<grid, kThreads, 0, stream>>>(a);
    }
  } else {
    const unsigned grid = sddmm::blocks_for(kFn, a.E, G);
    if (op == kAdd) {
      elementwise_kernel<I, G, kAdd><<<grid, kThreads, 0, stream>>>(a);
    } else if (op == kSub) {
      elementwise_kernel<I, G, kSub><<<grid, kThreads, 0, stream>>>(a);
    } else {
      elementwise_kernel<I, G, kMul><<<grid, kThreads, 0, stream>>>(a);
    }
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Lanes per group: one per 8 values of a dot's head (one 32-bit word), one per value of an
// elementwise row, a power of two up to 32.
template <typename I>
void launch(int op, const PackedArgs& a, cudaStream_t stream) {
  // an empty output is still checked for its indices: the elementwise kernel over width 0
  if ((op == kDot ? a.H : a.F) == 0) return launch_g<I, 1>(kAdd, a, stream);
  const int64_t per_lane = op == kDot && a.vec ? 8 : 1;
  const int64_t chunks = ((op == kDot ? a.D : a.F) + per_lane - 1) / per_lane;
  sddmm::with_group_lanes(chunks, [&](auto lanes) {
    launch_g<I, decltype(lanes)::value>(op, a, stream);
  });
}

at::Tensor qsddmm4(c10::string_view op_name, const at::Tensor& packed_lhs, double scale_lhs,
                   const at::Tensor& lhs_index, const at::Tensor& packed_rhs, double scale_rhs,
                   const at::Tensor& rhs_index, int64_t width,
                   const std::optional<at::Tensor>& row_scale_lhs,
                   const std::optional<at::Tensor>& row_scale_rhs) {
  const c10::cuda::CUDAGuard guard(packed_lhs.device());
  const sparse_operands::Sddmm s =
      sparse_operands::sddmm(op_name, packed_lhs, lhs_index, packed_rhs, rhs_index,
                             row_scale_lhs, row_scale_rhs, width);
  if (s.E == 0) return s.out;

  at::Tensor flag = at::zeros({1}, s.ql.options().dtype(at::kInt));
  PackedArgs a =
      sddmm::make_args<uint8_t>(s, scale_lhs, scale_rhs, flag.mutable_data_ptr<int>());
  a.vec = a.D % 8 == 0 && is_aligned(a.ql, 4) && is_aligned(a.qr, 4);
  cudaStream_t stream = current_stream();
  if (s.wide) {
    launch<int64_t>(s.op, a, stream);
  } else {
    launch<int32_t>(s.op, a, stream);
  }
  sddmm::check_flag(kFn, "packed_lhs", "packed_rhs", a, stream);
  return s.out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("qsddmm4", &qtrain::cuda::qsddmm4); }
