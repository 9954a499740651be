// What the qtrain._ext_cuda module is assembled from: each *_cuda.cpp host file
// registers its ops with one function, and module_cuda.cpp calls them all. The
// ops keep the names, arguments and results of their qtrain._ext (CPU)
// counterparts and take CUDA tensors, so qtrain/ops picks a backend per call
// without a second calling convention.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace qtrain {
namespace cuda {

// bind_tango_cuda.cpp: quantize_symmetric, counter_uniform, int8_gemm, quantized_gemm, qspmm, qsddmm
void register_tango(pybind11::module_& m);

// bind_compress_cuda.cpp: quantize_rows, dequantize_rows, project_quantize_rows,
// dequantize_unproject_rows, pack_bits, unpack_bits, masked_scale, rademacher
void register_compress(pybind11::module_& m);

}  // namespace cuda
}  // namespace qtrain
