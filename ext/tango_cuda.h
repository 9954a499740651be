// C++ entry points of the tango ops in qtrain._ext_cuda. The .cu files implement
// them (kernels + argument checks + launches on the current stream); bind_tango_cuda.cpp
// binds them with the names, arguments and results of their qtrain._ext twins.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace qtrain {
namespace cuda {

// quantize_cuda.cu: as qtrain._ext.quantize_symmetric / counter_uniform, on CUDA tensors.
std::tuple<at::Tensor, at::Tensor> quantize_symmetric(const at::Tensor& x, int64_t bits,
                                                      bool stochastic, uint64_t seed,
                                                      int64_t offset);
at::Tensor counter_uniform(int64_t n, uint64_t seed, int64_t offset);

// gemm_cuda.cu: as qtrain._ext.int8_gemm, on CUDA tensors (int8 mma.sync tensor cores).
at::Tensor int8_gemm(const at::Tensor& qa, const at::Tensor& qb, double scale,
                     const std::string& layout, const std::optional<at::Tensor>& bias);

// gemm_cuda.cu: float32 a, b quantized with the given absmax values (0-d float32) as
// quantize_symmetric does, multiplied on int8 tensor cores, dequantized (+ bias);
// returns (c float32 [M, N], absmax of c float32 0-d). See bind_tango_cuda.cpp's docstring.
std::tuple<at::Tensor, at::Tensor> quantized_gemm(const at::Tensor& a, const at::Tensor& b,
                                                  const at::Tensor& absmax_a,
                                                  const at::Tensor& absmax_b, int64_t bits_a,
                                                  int64_t bits_b, const std::string& layout,
                                                  const std::optional<at::Tensor>& bias,
                                                  bool stochastic, uint64_t seed,
                                                  int64_t offset_a, int64_t offset_b);

// spmm_cuda.cu / sddmm_cuda.cu: as qtrain._ext.qspmm / qsddmm, on CUDA tensors.
at::Tensor qspmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                 double scale, const std::optional<at::Tensor>& weight,
                 const std::optional<at::Tensor>& eids);
at::Tensor qsddmm(const std::string& op, const at::Tensor& q_lhs, double scale_lhs,
                  const at::Tensor& lhs_index, const at::Tensor& q_rhs, double scale_rhs,
                  const at::Tensor& rhs_index);

}  // namespace cuda
}  // namespace qtrain
