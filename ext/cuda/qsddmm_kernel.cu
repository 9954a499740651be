// qsddmm on CUDA (front: ops/qsddmm.cpp): quantized SDDMM (tango-sc23 sec. 3.3); the
// definition is qtrain/ops/sparse.py (reference_qsddmm), the CPU twin
// cpu/qsddmm_kernel.cpp. For edge e, i = lhs_index[e], j = rhs_index[e]:
//
//   add / sub: out[e] = fl32(q_l[i] * s_l) +/- fl32(q_r[j] * s_r)    dequantized on the fly
//   mul:       out[e] = fl32(float(q_l[i] * q_r[j]) * fl32(s_l * s_r))
//   dot:       out[e, h, 0] = fl32(float(sum_d q_l[i,h,d] * q_r[j,h,d]) * fl32(s_l * s_r))
//
// With row scales s_l is fl32(scale_lhs * row_scale_lhs[i, h]) (s_r the same on the right),
// read per edge and head (per element for add / sub / mul, whose chunks may cross heads).
//
// Every output is exact integer arithmetic or the reference's elementwise float32
// operations, so the result is bit-identical for any launch shape.
//
// add / sub / mul: a group of G lanes (a power of two up to a warp, from the row
// width) per edge, each lane gathering 4 int8 features of both rows with one 32-bit
// load each and storing a float4. dot: a group of G lanes per (edge, head), each
// lane multiplying 4 int8 pairs at a time with DP4A (__dp4a: exact int32 dot of four
// signed bytes) and the group reducing with xor shuffles; int32 is exact while
// D < 2^17, longer heads sum in int64. Narrow rows (GAT's per-head scalars) get
// G = 1 or 2: a thread per edge. The front has checked dtypes, shapes and devices;
// an index out of range, which only the data shows, zeroes the edge's row and raises
// a device flag that the host reads back and turns into the CPU op's ValueError.
// Edges whose output is empty (width 0) are checked too.
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
using sddmm::elem;
using sddmm::elem_at;
using sddmm::kAdd;
using sddmm::kDot;
using sddmm::kMul;
using sddmm::kSub;
using sddmm::kThreads;

using SddmmArgs = sddmm::Args<int8_t>;

template <typename I, int G, int OP>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(SddmmArgs a) {
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
  const int8_t* x = a.ql + i * a.F;
  const int8_t* y = a.qr + j * a.F;
  if (a.rsl != nullptr || a.rsr != nullptr) {
    for (int64_t f = lane; f < a.F; f += G) {
      o[f] = elem_at<OP>(a, i, j, f, static_cast<int32_t>(__ldg(x + f)),
                         static_cast<int32_t>(__ldg(y + f)));
    }
    return;
  }
  if (a.vec) {
    for (int64_t f = 4 * lane; f < a.F; f += 4 * G) {
      const uint32_t wx = __ldg(reinterpret_cast<const uint32_t*>(x + f));
      const uint32_t wy = __ldg(reinterpret_cast<const uint32_t*>(y + f));
      float r[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) r[t] = elem<OP>(sbyte(wx, t), sbyte(wy, t), a.sl, a.sr, a.both);
      *reinterpret_cast<float4*>(o + f) = make_float4(r[0], r[1], r[2], r[3]);
    }
  } else {
    for (int64_t f = lane; f < a.F; f += G) {
      o[f] = elem<OP>(static_cast<int32_t>(__ldg(x + f)), static_cast<int32_t>(__ldg(y + f)),
                      a.sl, a.sr, a.both);
    }
  }
}

// One (edge, head) pair per group of G lanes.
template <typename I, int G, bool WIDE>
__global__ void __launch_bounds__(kThreads) dot_kernel(SddmmArgs a) {
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
  const int8_t* x = a.ql + i * a.F + h * a.D;
  const int8_t* y = a.qr + j * a.F + h * a.D;
  using Acc = typename std::conditional<WIDE, long long, int32_t>::type;
  Acc s = 0;
  if (a.vec) {
    for (int64_t d = 4 * lane; d < a.D; d += 4 * G) {
      const int wx = static_cast<int>(__ldg(reinterpret_cast<const uint32_t*>(x + d)));
      const int wy = static_cast<int>(__ldg(reinterpret_cast<const uint32_t*>(y + d)));
      if constexpr (WIDE) {
        s += __dp4a(wx, wy, 0);
      } else {
        s = __dp4a(wx, wy, s);
      }
    }
  } else {
    for (int64_t d = lane; d < a.D; d += G) {
      s += static_cast<int32_t>(__ldg(x + d)) * static_cast<int32_t>(__ldg(y + d));
    }
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
void launch_g(int op, const SddmmArgs& a, cudaStream_t stream) {
  if (op == kDot) {
    const unsigned grid = sddmm::blocks_for("qtrain::qsddmm", a.E * a.H, G);
    if (a.D >= (int64_t{1} << 17)) {
      dot_kernel<I, G, true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      dot_kernel<I, G, false><<<grid, kThreads, 0, stream>>>(a);
    }
  } else {
    const unsigned grid = sddmm::blocks_for("qtrain::qsddmm", a.E, G);
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

// Lanes per group: one per 4-element chunk of what a group covers (the row for
// add / sub / mul, one head for dot), a power of two up to 32.
template <typename I>
void launch(int op, const SddmmArgs& a, cudaStream_t stream) {
  // an empty output (rows of width 0; dot: no heads) has nothing to compute, but its
  // indices are checked all the same: the elementwise kernel over width 0 does that,
  // writing nothing
  if ((op == kDot ? a.H : a.F) == 0) return launch_g<I, 1>(kAdd, a, stream);
  const int64_t width = op == kDot ? a.D : a.F;
  sddmm::with_group_lanes((width + 3) / 4, [&](auto lanes) {
    launch_g<I, decltype(lanes)::value>(op, a, stream);
  });
}

at::Tensor qsddmm(c10::string_view op_name, const at::Tensor& q_lhs_in, double scale_lhs,
                  const at::Tensor& lhs_index_in, const at::Tensor& q_rhs_in, double scale_rhs,
                  const at::Tensor& rhs_index_in, const std::optional<at::Tensor>& row_scale_lhs,
                  const std::optional<at::Tensor>& row_scale_rhs) {
  constexpr const char* fn = "qtrain::qsddmm";
  const c10::cuda::CUDAGuard guard(q_lhs_in.device());
  const sparse_operands::Sddmm s = sparse_operands::sddmm(
      op_name, q_lhs_in, lhs_index_in, q_rhs_in, rhs_index_in, row_scale_lhs, row_scale_rhs);
  if (s.E == 0) return s.out;

  at::Tensor flag = at::zeros({1}, s.ql.options().dtype(at::kInt));
  SddmmArgs a = sddmm::make_args<int8_t>(s, scale_lhs, scale_rhs, flag.mutable_data_ptr<int>());
  const int64_t width = s.op == kDot ? a.D : a.F;
  a.vec = width % 4 == 0 && a.F % 4 == 0 && is_aligned(a.ql, 4) && is_aligned(a.qr, 4) &&
          is_aligned(a.out, 16);
  cudaStream_t stream = current_stream();
  if (s.wide) {
    launch<int64_t>(s.op, a, stream);
  } else {
    launch<int32_t>(s.op, a, stream);
  }
  sddmm::check_flag(fn, "q_lhs", "q_rhs", a, stream);
  return s.out;
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) { m.impl("qsddmm", &qtrain::cuda::qsddmm); }
