// C++ entry points of qtrain._ext. Kernel files implement them with light ATen
// headers only; module.cpp (the one heavy, pybind11-including file) binds them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace qtrain {

// Symmetric per-tensor quantization of a float32 CPU tensor to `bits` (2..8)
// bits: (q int8 of x's shape, scale float32 0-d), x ~ q * scale.
std::tuple<at::Tensor, at::Tensor> quantize_symmetric(const at::Tensor& x, int64_t bits,
                                                      bool stochastic, uint64_t seed,
                                                      int64_t offset);

// n float32 uniforms in [0, 1); element i depends only on (seed, offset + i).
at::Tensor counter_uniform(int64_t n, uint64_t seed, int64_t offset);

// Quantized SpMM over CSR rows (qtrain/ops/sparse.py): out[r] = scale * sum of
// q[indices[k]] (times weight[eids[k]] when weight is given); float32 out.
at::Tensor qspmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                 double scale, const std::optional<at::Tensor>& weight,
                 const std::optional<at::Tensor>& eids);

// Quantized SDDMM (op "add", "sub", "mul", "dot") on gathered row pairs; float32 out.
at::Tensor qsddmm(const std::string& op, const at::Tensor& q_lhs, double scale_lhs,
                  const at::Tensor& lhs_index, const at::Tensor& q_rhs, double scale_rhs,
                  const at::Tensor& rhs_index);

// float32 C = fl32(float(int32 acc) * scale) (+ bias[n]) of int8 operands, layout "nn"
// (A[M,K] @ B[K,N]), "nt" (A[M,K] @ B[N,K]^T) or "tn" (A[K,M]^T @ B[K,N]); bit-identical
// to qtrain.ops.gemm.reference_int8_gemm.
at::Tensor int8_gemm(const at::Tensor& qa, const at::Tensor& qb, double scale,
                     const std::string& layout, const std::optional<at::Tensor>& bias);

// Per-row activation compression (qtrain/quant/rowwise.py): float32 x [rows, width] to
// (packed uint8 [ceil(rows*width*bits/8)], zero bfloat16 [rows], range bfloat16 [rows]),
// bits in {1, 2, 4, 8}; stochastic rounding draws u_i at counter offset + i.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, int64_t bits,
                                                             bool stochastic, uint64_t seed,
                                                             int64_t offset);

// float32 [rows, width] back from quantize_rows (rows = zero.numel()).
at::Tensor dequantize_rows(const at::Tensor& packed, const at::Tensor& zero,
                           const at::Tensor& range, int64_t bits, int64_t width);

// Halo message segments (qtrain/dist/exchange.py): quantize_rows of the rows x[index]
// (all of x without an index) written into `out`, uint8 [packed bytes + 4 * rows]: the
// packed values, then the bfloat16 zeros, then the ranges.
void quantize_rows_into(const at::Tensor& x, const std::optional<at::Tensor>& index, int64_t bits,
                        bool stochastic, uint64_t seed, int64_t offset, at::Tensor out);

// The `rows` rows of such a segment dequantized into out[index] (out's rows in order
// without an index), or added onto them with `add`; index names each row at most once.
void dequantize_rows_into(const at::Tensor& segment, int64_t rows, int64_t bits, at::Tensor out,
                          const std::optional<at::Tensor>& index, bool add);

// quantize_rows of x [rows, d] projected to k columns by the Rademacher matrix at
// projection_offset (qtrain/quant/projection.py project_rows), in one pass over x.
std::tuple<at::Tensor, at::Tensor, at::Tensor> project_quantize_rows(
    const at::Tensor& x, int64_t k, int64_t bits, bool stochastic, uint64_t seed, int64_t offset,
    int64_t projection_offset);

// float32 [rows, d] from project_quantize_rows' output: dequantized, then unproject_rows.
at::Tensor dequantize_unproject_rows(const at::Tensor& packed, const at::Tensor& zero,
                                     const at::Tensor& range, int64_t bits, int64_t k, int64_t d,
                                     uint64_t seed, int64_t projection_offset);

// uint8 / bool values (any shape, taken flat; masked to `bits` bits) as a dense
// little-endian bit stream, and the first n values of such a stream back.
at::Tensor pack_bits(const at::Tensor& values, int64_t bits);
at::Tensor unpack_bits(const at::Tensor& packed, int64_t bits, int64_t n);
at::Tensor masked_scale(const at::Tensor& grad, const at::Tensor& packed, double scale);

// float32 [d, k] normalized Rademacher matrix (qtrain/quant/projection.py): entry i is
// -fl32(1/sqrt(k)) when the counter hash at offset + i has its top bit set, else +.
at::Tensor rademacher(int64_t d, int64_t k, uint64_t seed, int64_t offset);

// Dropout keep-mask of a [rows, width] tensor keyed by global row ids (int64 [rows]): element
// (r, j) kept when (hash(seed, ids[r] * width + j) >> 8) >= threshold; packed 1 bit per element.
at::Tensor keep_mask_rows(const at::Tensor& ids, int64_t width, int64_t threshold, uint64_t seed);

}  // namespace qtrain
