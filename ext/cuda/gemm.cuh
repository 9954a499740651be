// What the CUDA GEMM ops share (int8_gemm_kernel.cu, quantized_gemm_kernel.cu, and
// int8_segment_gemm_kernel.cu, which runs run_gemm once per segment): INT8
// GEMM on tensor cores with the dequantization (and bias) fused into the epilogue, and
// its quantizing variant; the references are qtrain/ops/gemm.py (reference_int8_gemm,
// reference_quantized_gemm), the CPU twins cpu/int8_gemm_kernel.cpp and
// cpu/quantized_gemm_kernel.cpp. Everything here is a template or inline, so each
// kernel file instantiates only what it launches.
//
//   "nn": C[M,N] = A[M,K] @ B[K,N]   "nt": A[M,K] @ B[N,K]^T   "tn": A[K,M]^T @ B[K,N]
//   C = fl32(float(acc) * f) (+ bias[n])        acc = sum_k a*b, exact integers
//   f = fl32(fl32(scale * row_scale[m]) * col_scale[n])   (int8_gemm's optional vectors; an
//       absent one is 1, so f = scale without either: __fmul_rn, never contracted)
//
// Tiling: a block of 256 threads (8 warps, 2 x 4) computes a 64 x 256 tile of C in
// k-steps of 32, one mma.sync.m16n8k32.s8 per 16 x 8 sub-tile and k-step (each
// warp 32 x 64: 2 x 8 sub-tiles, 64 int32 accumulators per thread). BN = 256 covers
// the hidden sizes GNN layers use (N <= 256) in one column block, so A, the tall
// operand (M = nodes), is read and quantized exactly once. Both operands are staged
// in shared memory as [row][k] int8 rows (row = m for A, n for B) with a 48-byte row
// stride, which makes the 32-bit fragment loads of a warp conflict-free; the next
// k-step is loaded from global memory into registers while the current one is
// multiplied (two shared buffers, one barrier per k-step).
//
// Operands stored k-contiguous (A in "nn"/"nt", B in "nt") are loaded 4 k at a time
// (one 32-bit word, or a float4 for float A); row-contiguous ones (A in "tn", B in
// "nn"/"tn") 4 rows x 4 k at a time and transposed in registers (__byte_perm).
//
// quantized_gemm: A is float32 and quantized in that load, after the global read
// and before the shared store, with pre / inv derived on the device from the given
// absmax (quant_params) and stochastic draws at counter offset_a + flat index of the
// element in A, exactly the rule of quantize_symmetric. B, the small operand that
// every block reads, is quantized once up front (launch_quantize_given, in
// quantized_gemm_kernel.cu) instead of once per block. The epilogue also reduces absmax
// of C (bit-pattern max, one atomicMax per block): the next layer's scale input, without
// another pass.
//
// Exactness: int32 accumulation is exact while |acc| < 2^31, i.e. K-chunks of at
// most 65536 (|a*b| <= 2^14). Longer K, and small outputs with a long K (the "tn"
// product dW = X^T dY), split K across blocks (grid.z): each block adds its int32
// partial into an int64 workspace with atomicAdd (integer adds: order-free, so
// deterministic), and a second kernel applies the float epilogue.
//
// int8_gemm_int32 (cuda/int8_gemm_int32_kernel.cu; reference qtrain/ops/integer.py
// reference_int_gemm) sets Epilogue::out_i32 instead of out: the epilogue stores the int32
// accumulators as they are (exact, |acc| <= 2^30 per K-chunk), and the split-K finalize
// stores the int64 sum saturated to int32.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/string_view.h>

#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/integer.cuh"

namespace qtrain {
namespace cuda {
namespace gemm {

constexpr int BM = 64;          // rows of C per block
constexpr int BN = 256;         // columns of C per block
constexpr int BK = 32;          // k per step (one m16n8k32 mma)
constexpr int KS = 48;          // shared row stride in bytes (32 + 16 padding: no bank conflicts)
constexpr int NT = 256;         // threads per block
constexpr int64_t kChunkK = 65536;  // k per int32 accumulation (|acc| <= 2^30)

enum Layout : int { kNN = 0, kNT = 1, kTN = 2 };

// A layout the front has checked ("nn", "nt" or "tn").
inline int layout_code(c10::string_view layout) {
  return layout == "nn" ? kNN : layout == "nt" ? kNT : kTN;
}

// M, K, N of the product of the stored operands a, b.
inline void gemm_dims(int lay, const at::Tensor& a, const at::Tensor& b, int64_t& M, int64_t& K,
                      int64_t& N) {
  M = lay == kTN ? a.size(1) : a.size(0);
  K = lay == kTN ? a.size(0) : a.size(1);
  N = lay == kNT ? b.size(0) : b.size(1);
}

// One operand as the kernel sees it: element (r, k) (r = m for A, n for B) at
// p[r * ld + k] when k-contiguous (KC), else at p[k * ld + r]; `rows` = M or N.
struct Operand {
  const void* p;
  int64_t ld;
  int64_t rows;
};

// Quantization of a float32 A in the tile load, and the epilogue's scale.
struct Epilogue {
  float scale;               // int8_gemm: fl32(scale_a * scale_b)
  const float* absmax_a;     // quantized_gemm: device absmax of A and B (scale computed here)
  const float* absmax_b;
  int qmax_a;
  int qmax_b;
  bool stochastic;
  rng::Keys keys;
  uint64_t offset_a;
  const float* bias;         // [N] or null
  const float* row_scale;    // int8_gemm: [M] or null (1)
  const float* col_scale;    // int8_gemm: [N] or null (1)
  float* out;                // [M, N], contiguous, 4-byte aligned (a slice of a larger output)
  int32_t* out_i32;          // int8_gemm_int32: exact int32 [M, N] (out unused), or null
  unsigned long long* ws;    // split-K int64 workspace [M, N], or null
  uint32_t* absmax_out;      // bit-pattern max of |C|, or null
};

__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 4x4 int8 transpose: word i of the result holds byte i of v[0..3] (low byte first).
__device__ __forceinline__ void transpose4(const uint32_t (&v)[4], uint32_t (&w)[4]) {
  const uint32_t t0 = __byte_perm(v[0], v[1], 0x5140);  // v0.b0 v1.b0 v0.b1 v1.b1
  const uint32_t t1 = __byte_perm(v[0], v[1], 0x7362);  // v0.b2 v1.b2 v0.b3 v1.b3
  const uint32_t t2 = __byte_perm(v[2], v[3], 0x5140);
  const uint32_t t3 = __byte_perm(v[2], v[3], 0x7362);
  w[0] = __byte_perm(t0, t2, 0x5410);
  w[1] = __byte_perm(t0, t2, 0x7632);
  w[2] = __byte_perm(t1, t3, 0x5410);
  w[3] = __byte_perm(t1, t3, 0x7632);
}

// Loads a ROWS x BK tile of one operand into registers, then (after the current
// k-step's mma) quantizes / transposes it into shared memory as [row][k] int8 rows.
// Units: KC: 1 row x 4 k; !KC: 4 rows x 4 k. Elements outside the matrix load as 0
// (which quantizes to 0 under both roundings: floor(0 + u) = 0 for u in [0, 1)).
template <typename T, bool KC, bool VEC, int ROWS>
struct TileLoader {
  static constexpr int kUnits = KC ? ROWS * (BK / 4) : (ROWS / 4) * (BK / 4);
  static constexpr int kPer = (kUnits + NT - 1) / NT;
  static constexpr int kVals = KC ? 4 : 16;  // elements per unit
  using Reg = typename std::conditional<std::is_same<T, float>::value, float, uint32_t>::type;
  // float: one value per element; int8: one 32-bit word per 4 elements
  static constexpr int kRegs = std::is_same<T, float>::value ? kVals : kVals / 4;
  Reg r[kPer][kRegs];

  __device__ __forceinline__ static void unit_pos(int u, int& row, int& kk) {
    if constexpr (KC) {
      row = u / (BK / 4);
      kk = 4 * (u % (BK / 4));
    } else {
      row = 4 * (u % (ROWS / 4));  // rows fastest: a warp reads along the contiguous rows
      kk = 4 * (u / (ROWS / 4));
    }
  }

  __device__ __forceinline__ void load(const Operand& op, int64_t r0, int64_t k0, int64_t K) {
    const T* p = static_cast<const T*>(op.p);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int u = threadIdx.x + i * NT;
      if (kUnits % NT != 0 && u >= kUnits) break;
      int row, kk;
      unit_pos(u, row, kk);
      const int64_t gr = r0 + row;
      const int64_t gk = k0 + kk;
      if constexpr (KC) {
        if constexpr (std::is_same<T, float>::value) {
          if (VEC) {
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (gr < op.rows && gk < K) v = __ldg(reinterpret_cast<const float4*>(p + gr * op.ld + gk));
            r[i][0] = v.x; r[i][1] = v.y; r[i][2] = v.z; r[i][3] = v.w;
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              r[i][j] = (gr < op.rows && gk + j < K) ? __ldg(p + gr * op.ld + gk + j) : 0.0f;
            }
          }
        } else {
          if (VEC) {
            r[i][0] = (gr < op.rows && gk < K)
                          ? __ldg(reinterpret_cast<const uint32_t*>(p + gr * op.ld + gk))
                          : 0u;
          } else {
            int32_t b[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              b[j] = (gr < op.rows && gk + j < K) ? static_cast<int32_t>(__ldg(p + gr * op.ld + gk + j)) : 0;
            }
            r[i][0] = pack4(b[0], b[1], b[2], b[3]);
          }
        }
      } else {
        // four k rows, each a vector of 4 consecutive operand rows
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool kin = gk + j < K;
          const T* src = p + (gk + j) * op.ld + gr;
          if constexpr (std::is_same<T, float>::value) {
            if (VEC) {
              float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
              if (kin && gr < op.rows) v = __ldg(reinterpret_cast<const float4*>(src));
              r[i][4 * j + 0] = v.x; r[i][4 * j + 1] = v.y; r[i][4 * j + 2] = v.z; r[i][4 * j + 3] = v.w;
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) r[i][4 * j + t] = (kin && gr + t < op.rows) ? __ldg(src + t) : 0.0f;
            }
          } else {
            if (VEC) {
              r[i][j] = (kin && gr < op.rows) ? __ldg(reinterpret_cast<const uint32_t*>(src)) : 0u;
            } else {
              int32_t b[4];
#pragma unroll
              for (int t = 0; t < 4; ++t) b[t] = (kin && gr + t < op.rows) ? static_cast<int32_t>(__ldg(src + t)) : 0;
              r[i][j] = pack4(b[0], b[1], b[2], b[3]);
            }
          }
        }
      }
    }
  }

  // Writes the registers as int8 [row][k] words into `smem` (ROWS rows of KS bytes).
  // For float T: quantizes with p; the counter of element (row, k) is offset + its
  // flat index in the operand (row * ld + k, or k * ld + row).
  __device__ __forceinline__ void store(uint8_t* smem, const Operand& op, int64_t r0, int64_t k0,
                                        const QuantParams& qp, bool stochastic,
                                        const rng::Keys& keys, uint64_t offset) const {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int u = threadIdx.x + i * NT;
      if (kUnits % NT != 0 && u >= kUnits) break;
      int row, kk;
      unit_pos(u, row, kk);
      if constexpr (KC) {
        uint32_t w;
        if constexpr (std::is_same<T, float>::value) {
          float uu[4] = {0.f, 0.f, 0.f, 0.f};
          int32_t q[4];
          if (stochastic) {
            uniform4(keys, offset + static_cast<uint64_t>((r0 + row) * op.ld + k0 + kk), uu);
#pragma unroll
            for (int j = 0; j < 4; ++j) q[j] = quantize_one<true>(r[i][j], qp, uu[j]);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) q[j] = quantize_one<false>(r[i][j], qp, 0.0f);
          }
          w = pack4(q[0], q[1], q[2], q[3]);
        } else {
          w = r[i][0];
        }
        *reinterpret_cast<uint32_t*>(smem + row * KS + kk) = w;
      } else {
        uint32_t v[4];  // v[j]: k = kk + j, bytes = rows row .. row + 3
        if constexpr (std::is_same<T, float>::value) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float uu[4] = {0.f, 0.f, 0.f, 0.f};
            int32_t q[4];
            if (stochastic) {
              uniform4(keys, offset + static_cast<uint64_t>((k0 + kk + j) * op.ld + r0 + row), uu);
#pragma unroll
              for (int t = 0; t < 4; ++t) q[t] = quantize_one<true>(r[i][4 * j + t], qp, uu[t]);
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) q[t] = quantize_one<false>(r[i][4 * j + t], qp, 0.0f);
            }
            v[j] = pack4(q[0], q[1], q[2], q[3]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] = r[i][j];
        }
        uint32_t w[4];
        transpose4(v, w);
#pragma unroll
        for (int t = 0; t < 4; ++t) *reinterpret_cast<uint32_t*>(smem + (row + t) * KS + kk) = w[t];
      }
    }
  }
};

template <typename TA, bool A_KC, bool B_KC, bool VEC>
__global__ void __launch_bounds__(NT, 2)
    gemm_kernel(Operand A, Operand B, int64_t K, int64_t k_chunk, Epilogue ep) {
  __shared__ __align__(16) uint8_t As[2][BM * KS];
  __shared__ __align__(16) uint8_t Bs[2][BN * KS];

  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int64_t kb = static_cast<int64_t>(blockIdx.z) * k_chunk;
  const int64_t ke = min(K, kb + k_chunk);
  const int64_t steps = ke > kb ? (ke - kb + BK - 1) / BK : 0;
  const int64_t M = A.rows;
  const int64_t N = B.rows;

  QuantParams qa{1.0f, 0.0f, 0.0f};
  if constexpr (std::is_same<TA, float>::value) qa = quant_params(*ep.absmax_a, ep.qmax_a);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;   // mma groupID
  const int t4 = lane & 3;   // mma threadID_in_group
  const int wm = warp >> 2;  // warp row (0..1): rows wm*32 .. +32
  const int wn = warp & 3;   // warp column (0..3): columns wn*64 .. +64
  // warps whose sub-tile lies wholly outside C skip the multiply (tails of M and N)
  const bool active = m0 + wm * 32 < M && n0 + wn * 64 < N;

  int32_t acc[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0;

  TileLoader<TA, A_KC, VEC, BM> la;
  TileLoader<int8_t, B_KC, VEC, BN> lb;
  if (steps > 0) {
    la.load(A, m0, kb, ke);
    lb.load(B, n0, kb, ke);
    la.store(As[0], A, m0, kb, qa, ep.stochastic, ep.keys, ep.offset_a);
    lb.store(Bs[0], B, n0, kb, qa, false, ep.keys, 0);
    __syncthreads();
  }
  for (int64_t s = 0; s < steps; ++s) {
    const int cur = static_cast<int>(s & 1);
    const int64_t kn = kb + (s + 1) * BK;
    const bool more = s + 1 < steps;
    if (more) {  // next k-step in flight while this one is multiplied
      la.load(A, m0, kn, ke);
      lb.load(B, n0, kn, ke);
    }
    if (active) {
      const uint8_t* as = As[cur];
      const uint8_t* bs = Bs[cur];
      uint32_t af[2][4];
      uint32_t bf[8][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm * 32 + mt * 16 + g;
        af[mt][0] = *reinterpret_cast<const uint32_t*>(as + r * KS + 4 * t4);
        af[mt][1] = *reinterpret_cast<const uint32_t*>(as + (r + 8) * KS + 4 * t4);
        af[mt][2] = *reinterpret_cast<const uint32_t*>(as + r * KS + 16 + 4 * t4);
        af[mt][3] = *reinterpret_cast<const uint32_t*>(as + (r + 8) * KS + 16 + 4 * t4);
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int c = wn * 64 + nt * 8 + g;
        bf[nt][0] = *reinterpret_cast<const uint32_t*>(bs + c * KS + 4 * t4);
        bf[nt][1] = *reinterpret_cast<const uint32_t*>(bs + c * KS + 16 + 4 * t4);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) mma_s8(acc[mt][nt], af[mt], bf[nt]);
    }
    if (more) {
      // the other buffer was last read in step s - 1, which every thread finished
      // before the barrier that ended it
      la.store(As[cur ^ 1], A, m0, kn, qa, ep.stochastic, ep.keys, ep.offset_a);
      lb.store(Bs[cur ^ 1], B, n0, kn, qa, false, ep.keys, 0);
    }
    __syncthreads();
  }

  // ---- epilogue: C fragment c0, c1 at (row g, cols 2 t4, 2 t4 + 1), c2, c3 at row g + 8
  uint32_t amax = 0;
  if (active) {
    float scale = ep.scale;
    if constexpr (std::is_same<TA, float>::value) {
      scale = __fmul_rn(__fdiv_rn(*ep.absmax_a, static_cast<float>(ep.qmax_a)),
                        __fdiv_rn(*ep.absmax_b, static_cast<float>(ep.qmax_b)));
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int64_t col = n0 + wn * 64 + nt * 8 + 2 * t4;
        if (col >= N) continue;
        const bool two = col + 1 < N;
        float b0 = 0.0f, b1 = 0.0f;
        if (ep.bias != nullptr && ep.ws == nullptr) {
          b0 = __ldg(ep.bias + col);
          if (two) b1 = __ldg(ep.bias + col + 1);
        }
        float cs0 = 1.0f, cs1 = 1.0f;
        if (ep.col_scale != nullptr && ep.ws == nullptr) {
          cs0 = __ldg(ep.col_scale + col);
          if (two) cs1 = __ldg(ep.col_scale + col + 1);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = m0 + wm * 32 + mt * 16 + g + 8 * h;
          if (row >= M) continue;
          const int32_t c0 = acc[mt][nt][2 * h];
          const int32_t c1 = acc[mt][nt][2 * h + 1];
          const int64_t at = row * N + col;
          if (ep.ws != nullptr) {
            atomicAdd(ep.ws + at, static_cast<unsigned long long>(static_cast<long long>(c0)));
            if (two) atomicAdd(ep.ws + at + 1, static_cast<unsigned long long>(static_cast<long long>(c1)));
            continue;
          }
          if (ep.out_i32 != nullptr) {  // int8_gemm_int32: the exact sums themselves
            if (two && (reinterpret_cast<uintptr_t>(ep.out_i32 + at) & 7u) == 0) {
              *reinterpret_cast<int2*>(ep.out_i32 + at) = make_int2(c0, c1);
            } else {
              ep.out_i32[at] = c0;
              if (two) ep.out_i32[at + 1] = c1;
            }
            continue;
          }
          // f = fl32(fl32(scale * row_scale[row]) * col_scale[col]); scale without vectors
          float s0 = scale;
          if (ep.row_scale != nullptr) s0 = __fmul_rn(s0, __ldg(ep.row_scale + row));
          float s1 = s0;
          if (ep.col_scale != nullptr) {
            s0 = __fmul_rn(s0, cs0);
            s1 = __fmul_rn(s1, cs1);
          }
          float f0 = __fmul_rn(__int2float_rn(c0), s0);
          float f1 = __fmul_rn(__int2float_rn(c1), s1);
          if (ep.bias != nullptr) {
            f0 = __fadd_rn(f0, b0);
            f1 = __fadd_rn(f1, b1);
          }
          // a pair store where it is 8-byte aligned: ep.out may be a slice of a larger
          // output at any float (int8_segment_gemm's segments)
          if (two && (reinterpret_cast<uintptr_t>(ep.out + at) & 7u) == 0) {
            *reinterpret_cast<float2*>(ep.out + at) = make_float2(f0, f1);
          } else {
            ep.out[at] = f0;
            if (two) ep.out[at + 1] = f1;
          }
          amax = max(amax, abs_bits(f0));
          if (two) amax = max(amax, abs_bits(f1));
        }
      }
    }
  }
  if (ep.absmax_out != nullptr && ep.ws == nullptr) {
    amax = block_max(amax);
    if (threadIdx.x == 0 && amax != 0u) atomicMax(ep.absmax_out, amax);
  }
}

// Split-K epilogue: C = fl32(float(ws) * f) (+ bias), f as gemm_kernel's epilogue, absmax
// of C; or, with out_i32, C = saturate_int32(ws).
template <bool QUANTIZED>
__global__ void __launch_bounds__(NT)
    finalize_kernel(const long long* __restrict__ ws, int64_t M, int64_t N, Epilogue ep) {
  float scale = ep.scale;
  if constexpr (QUANTIZED) {
    scale = __fmul_rn(__fdiv_rn(*ep.absmax_a, static_cast<float>(ep.qmax_a)),
                      __fdiv_rn(*ep.absmax_b, static_cast<float>(ep.qmax_b)));
  }
  const int64_t total = M * N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t amax = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    if (ep.out_i32 != nullptr) {
      ep.out_i32[i] = saturate_int32(ws[i]);
      continue;
    }
    float s = scale;
    if (ep.row_scale != nullptr) s = __fmul_rn(s, __ldg(ep.row_scale + i / N));
    if (ep.col_scale != nullptr) s = __fmul_rn(s, __ldg(ep.col_scale + i % N));
    float f = __fmul_rn(__ll2float_rn(ws[i]), s);
    if (ep.bias != nullptr) f = __fadd_rn(f, __ldg(ep.bias + i % N));
    ep.out[i] = f;
    amax = max(amax, abs_bits(f));
  }
  if (ep.absmax_out != nullptr) {
    amax = block_max(amax);
    if (threadIdx.x == 0 && amax != 0u) atomicMax(ep.absmax_out, amax);
  }
}

template <typename TA, bool A_KC, bool B_KC>
void launch_layout(const Operand& A, const Operand& B, int64_t K, int64_t k_chunk, dim3 grid,
                   bool vec, const Epilogue& ep, cudaStream_t stream) {
  if (vec) {
    gemm_kernel<TA, A_KC, B_KC, true><<<grid, NT, 0, stream>>>(A, B, K, k_chunk, ep);
  } else {
    gemm_kernel<TA, A_KC, B_KC, false><<<grid, NT, 0, stream>>>(A, B, K, k_chunk, ep);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Runs the product: A (int8 or float32 to quantize), B int8; fills ep.out (or ep.out_i32).
// Launch limits are the only checks here (the op fronts made the rest): N at most
// 65535 column blocks (the grid's y size), M at most 2^31 - 1 row blocks.
template <typename TA>
void run_gemm(const char* fn, int lay, const at::Tensor& a, const at::Tensor& qb, int64_t M,
              int64_t K, int64_t N, Epilogue ep, cudaStream_t stream,
              const at::TensorOptions& opts) {
  Operand A{a.const_data_ptr(), lay == kTN ? M : K, M};
  Operand B{qb.const_data_ptr(), lay == kNT ? K : N, N};
  const size_t a_align = std::is_same<TA, float>::value ? 16 : 4;
  const bool vec = A.ld % 4 == 0 && B.ld % 4 == 0 && is_aligned(A.p, a_align) &&
                   is_aligned(B.p, 4);

  const int64_t mt = (M + BM - 1) / BM;
  const int64_t nt = (N + BN - 1) / BN;
  TORCH_CHECK_VALUE(nt <= 65535, fn, ": N = ", N, " is too large for the CUDA kernel (at most ",
                    int64_t{65535} * BN, ")");
  TORCH_CHECK_VALUE(mt <= int64_t{0x7fffffff}, fn, ": M = ", M,
                    " is too large for the CUDA kernel");
  // split K when one int32 chunk cannot hold it, or when the output has too few
  // tiles to fill the GPU and K is long enough to share
  int64_t splits = (K + kChunkK - 1) / kChunkK;
  const int64_t sms = sm_count();
  if (mt * nt < 2 * sms && K >= 4096) {
    splits = std::max(splits, std::min((2 * sms + mt * nt - 1) / (mt * nt), K / 1024));
  }
  splits = std::max<int64_t>(splits, 1);
  int64_t k_chunk = (K + splits - 1) / splits;
  k_chunk = std::max<int64_t>(BK, (k_chunk + BK - 1) / BK * BK);
  splits = std::max<int64_t>(1, (K + k_chunk - 1) / k_chunk);
  at::Tensor ws;
  if (splits > 1) {
    ws = at::zeros({M, N}, opts.dtype(at::kLong));
    ep.ws = reinterpret_cast<unsigned long long*>(ws.mutable_data_ptr<int64_t>());
  }
  const dim3 grid(static_cast<unsigned>(mt), static_cast<unsigned>(nt),
                  static_cast<unsigned>(splits));
  if (lay == kNN) {
    launch_layout<TA, true, false>(A, B, K, k_chunk, grid, vec, ep, stream);
  } else if (lay == kNT) {
    launch_layout<TA, true, true>(A, B, K, k_chunk, grid, vec, ep, stream);
  } else {
    launch_layout<TA, false, false>(A, B, K, k_chunk, grid, vec, ep, stream);
  }
  if (splits > 1) {
    finalize_kernel<std::is_same<TA, float>::value><<<grid_for(M * N, NT), NT, 0, stream>>>(
        reinterpret_cast<const long long*>(ep.ws), M, N, ep);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace gemm
}  // namespace cuda
}  // namespace qtrain
