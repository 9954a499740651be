// pybind11 bindings of the activation-compression CUDA ops (compress_cuda.cu) into
// qtrain._ext_cuda: the names, arguments, defaults and results of qtrain._ext's
// (module.cpp), on CUDA tensors.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

#include "cuda_module.h"

namespace qtrain {
namespace cuda {
namespace compress {

// defined in compress_cuda.cu
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, int64_t bits,
                                                             bool stochastic, uint64_t seed,
                                                             int64_t offset);
at::Tensor dequantize_rows(const at::Tensor& packed, const at::Tensor& zero,
                           const at::Tensor& range, int64_t bits, int64_t width);
std::tuple<at::Tensor, at::Tensor, at::Tensor> project_quantize_rows(
    const at::Tensor& x, int64_t k, int64_t bits, bool stochastic, uint64_t seed, int64_t offset,
    int64_t projection_offset);
at::Tensor dequantize_unproject_rows(const at::Tensor& packed, const at::Tensor& zero,
                                     const at::Tensor& range, int64_t bits, int64_t k, int64_t d,
                                     uint64_t seed, int64_t projection_offset);
at::Tensor pack_bits(const at::Tensor& values, int64_t bits);
at::Tensor unpack_bits(const at::Tensor& packed, int64_t bits, int64_t n);
at::Tensor masked_scale(const at::Tensor& grad, const at::Tensor& packed, double scale);
at::Tensor rademacher(int64_t d, int64_t k, uint64_t seed, int64_t offset);

}  // namespace compress

void register_compress(pybind11::module_& m) {
  namespace py = pybind11;
  namespace c = qtrain::cuda::compress;
  m.def("quantize_rows", &c::quantize_rows, py::arg("x"), py::arg("bits"),
        py::arg("stochastic") = true, py::arg("seed") = 0, py::arg("offset") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "Per-row quantization of a float32 CUDA tensor x [rows, width] to `bits` (1, 2, 4, 8)\n"
        "bits, packed densely: (packed uint8 [ceil(rows*width*bits/8)], zero bfloat16 [rows],\n"
        "range bfloat16 [rows]). Stochastic rounding draws u_i from counter_uniform at\n"
        "offset + i. Bit-identical to qtrain.quant.rowwise.quantize_rows.");
  m.def("dequantize_rows", &c::dequantize_rows, py::arg("packed"), py::arg("zero"),
        py::arg("range"), py::arg("bits"), py::arg("width"),
        py::call_guard<py::gil_scoped_release>(),
        "float32 [rows, width] from quantize_rows' output (CUDA tensors). Bit-identical to\n"
        "qtrain.quant.rowwise.dequantize_rows.");
  m.def("project_quantize_rows", &c::project_quantize_rows, py::arg("x"), py::arg("k"),
        py::arg("bits"), py::arg("stochastic") = true, py::arg("seed") = 0, py::arg("offset") = 0,
        py::arg("projection_offset") = 0, py::call_guard<py::gil_scoped_release>(),
        "quantize_rows of float32 x [rows, d] (CUDA) projected to k columns by the Rademacher\n"
        "matrix at projection_offset; the projection stays in shared memory. Bit-identical to\n"
        "quantize_rows(qtrain.quant.projection.project_rows(x, k, seed, projection_offset), ...).");
  m.def("dequantize_unproject_rows", &c::dequantize_unproject_rows, py::arg("packed"),
        py::arg("zero"), py::arg("range"), py::arg("bits"), py::arg("k"), py::arg("d"),
        py::arg("seed") = 0, py::arg("projection_offset") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "float32 [rows, d] from project_quantize_rows' output: dequantize_rows, then\n"
        "qtrain.quant.projection.unproject_rows by the same matrix, bit for bit.");
  m.def("pack_bits", &c::pack_bits, py::arg("values"), py::arg("bits"),
        py::call_guard<py::gil_scoped_release>(),
        "uint8 or bool CUDA values (any shape, taken flat, masked to `bits` bits) as one dense\n"
        "little-endian bit stream (uint8 [ceil(n*bits/8)]), as qtrain.quant.rowwise.pack_bits.");
  m.def("unpack_bits", &c::unpack_bits, py::arg("packed"), py::arg("bits"), py::arg("n"),
        py::call_guard<py::gil_scoped_release>(),
        "The first n values (uint8, flat) of a stream written by pack_bits (CUDA).");
  m.def("masked_scale", &c::masked_scale, py::arg("grad"), py::arg("packed"), py::arg("scale"),
        py::call_guard<py::gil_scoped_release>(),
        "float32 grad * fl32(scale) where bit i of the 1-bit stream packed is set, else +0\n"
        "(CUDA tensors). As qtrain.quant.rowwise.masked_scale.");
  m.def("rademacher", &c::rademacher, py::arg("d"), py::arg("k"), py::arg("seed") = 0,
        py::arg("offset") = 0, py::call_guard<py::gil_scoped_release>(),
        "float32 [d, k] normalized Rademacher matrix on the current CUDA device. Bit-identical\n"
        "to qtrain.quant.projection.rademacher.");
}

}  // namespace cuda
}  // namespace qtrain
