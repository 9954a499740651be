// quantize_symmetric on CUDA (front: ops/quantize_symmetric.cpp; reference
// qtrain/quant/quantize.py, CPU twin cpu/quantize_symmetric_kernel.cpp).
//
// Two kernels on one stream, no host round trip between them: absmax (a bit-pattern
// max, float4 loads, one atomicMax per block) into a device word, then quantization,
// which derives pre / inv / scale from that word itself. Stochastic rounding draws
// u_i from the counter-based generator (common/rng.h) at counter offset + i: the keys
// and the block key of the counter's high word stay in registers, so a draw is two
// 32-bit hashes. Each element is a pure function of (x_i, absmax, i), so the result
// is bit-identical to the reference for any launch shape. The host waits once, after
// both launches, to refuse NaN / Inf (ValueError) as the CPU op does.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <bool VEC>
__global__ void __launch_bounds__(kThreads) absmax_kernel(const float* __restrict__ x, int64_t n,
                                                          uint32_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t m = 0;
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 v = __ldg(x4 + i);
      m = max(max(m, abs_bits(v.x)), max(abs_bits(v.y), max(abs_bits(v.z), abs_bits(v.w))));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) m = max(m, abs_bits(__ldg(x + i)));
  m = block_max(m);
  if (threadIdx.x == 0 && m != 0u) atomicMax(out, m);
}

// VEC: 4 elements per step (float4 in, one 32-bit word out); x and q 16 / 4-byte aligned.
template <bool VEC, bool STOCH>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const float* __restrict__ x, int8_t* __restrict__ q, int64_t n,
                    const float* __restrict__ absmax_p, int qmax, rng::Keys keys, uint64_t offset,
                    float* __restrict__ scale_out) {
  const float absmax = *absmax_p;
  const QuantParams p = quant_params(absmax, qmax);
  if (scale_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    *scale_out = __fdiv_rn(absmax, static_cast<float>(qmax));
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t done = 0;
  if constexpr (VEC) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    uint32_t* q4 = reinterpret_cast<uint32_t*>(q);
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 v = __ldg(x4 + i);
      if constexpr (STOCH) uniform4(keys, offset + static_cast<uint64_t>(4 * i), u);
      q4[i] = pack4(quantize_one<STOCH>(v.x, p, u[0]), quantize_one<STOCH>(v.y, p, u[1]),
                    quantize_one<STOCH>(v.z, p, u[2]), quantize_one<STOCH>(v.w, p, u[3]));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    float ui = 0.0f;
    if constexpr (STOCH) ui = rng::uniform(keys, offset + static_cast<uint64_t>(i));
    q[i] = static_cast<int8_t>(quantize_one<STOCH>(__ldg(x + i), p, ui));
  }
}

}  // namespace

void launch_quantize_given(const float* x, int8_t* q, int64_t n, const float* absmax, int qmax,
                           bool stochastic, uint64_t seed, uint64_t offset, float* scale_out,
                           cudaStream_t stream) {
  if (n == 0) return;
  const rng::Keys keys = rng::keys_from_seed(seed);
  const bool vec = is_aligned(x, 16) && is_aligned(q, 4);
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kThreads);
  if (vec && stochastic) {
    quantize_kernel<true, true><<<grid, kThreads, 0, stream>>>(x, q, n, absmax, qmax, keys,
                                                               offset, scale_out);
  } else if (vec) {
    quantize_kernel<true, false><<<grid, kThreads, 0, stream>>>(x, q, n, absmax, qmax, keys,
                                                                offset, scale_out);
  } else if (stochastic) {
    quantize_kernel<false, true><<<grid, kThreads, 0, stream>>>(x, q, n, absmax, qmax, keys,
                                                                offset, scale_out);
  } else {
    quantize_kernel<false, false><<<grid, kThreads, 0, stream>>>(x, q, n, absmax, qmax, keys,
                                                                 offset, scale_out);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

namespace {

std::tuple<at::Tensor, at::Tensor> quantize_symmetric(const at::Tensor& x_in, int64_t bits,
                                                      bool stochastic, int64_t seed,
                                                      int64_t offset) {
  const int64_t n = x_in.numel();
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  if (n == 0) return {q, at::zeros({}, x.options())};

  const int qmax = (1 << (bits - 1)) - 1;
  cudaStream_t stream = current_stream();
  at::Tensor absmax_bits = at::zeros({1}, x.options().dtype(at::kInt));
  at::Tensor scale = at::empty({}, x.options());
  uint32_t* mb = reinterpret_cast<uint32_t*>(absmax_bits.mutable_data_ptr<int32_t>());
  const float* xp = x.const_data_ptr<float>();
  const bool vec = is_aligned(xp, 16);
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kThreads);
  if (vec) {
    absmax_kernel<true><<<grid, kThreads, 0, stream>>>(xp, n, mb);
  } else {
    absmax_kernel<false><<<grid, kThreads, 0, stream>>>(xp, n, mb);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // the bits of a non-negative float are that float: the quantize kernel reads them as one
  launch_quantize_given(xp, q.mutable_data_ptr<int8_t>(), n, reinterpret_cast<const float*>(mb),
                        qmax, stochastic, static_cast<uint64_t>(seed),
                        static_cast<uint64_t>(offset), scale.mutable_data_ptr<float>(), stream);
  const uint32_t m = read_back(mb, stream);
  TORCH_CHECK_VALUE(m < 0x7f800000u,
                    "qtrain::quantize_symmetric: x contains NaN or Inf; quantization needs "
                    "finite values");
  return {q, scale};
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_symmetric", &qtrain::cuda::quantize_symmetric);
}
