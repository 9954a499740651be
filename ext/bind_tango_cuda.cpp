// Binds the tango CUDA ops into qtrain._ext_cuda (called from module_cuda.cpp). Names,
// arguments, defaults and results mirror qtrain._ext (module.cpp), on CUDA tensors;
// quantized_gemm is CUDA-only (its reference is qtrain.ops.gemm.reference_quantized_gemm).
#include <torch/csrc/utils/pybind.h>

#include "cuda_module.h"
#include "tango_cuda.h"

namespace qtrain {
namespace cuda {

void register_tango(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("quantize_symmetric", &quantize_symmetric, py::arg("x"), py::arg("bits"),
        py::arg("stochastic") = false, py::arg("seed") = 0, py::arg("offset") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "Symmetric per-tensor quantization of a float32 CUDA tensor to `bits` (2..8) bits.\n"
        "Returns (q int8 of x's shape, scale float32 0-d), both on x's device; x ~ q * scale.\n"
        "Stochastic rounding draws u_i from counter_uniform(numel, seed, offset). Bit-identical\n"
        "to qtrain.quant.quantize_symmetric. Waits for the device once (NaN / Inf check).");
  m.def("counter_uniform", &counter_uniform, py::arg("n"), py::arg("seed") = 0,
        py::arg("offset") = 0, py::call_guard<py::gil_scoped_release>(),
        "n float32 uniforms in [0, 1) on the current CUDA device; element i depends only on\n"
        "(seed, offset + i).");
  m.def("qspmm", &qspmm, py::arg("indptr"), py::arg("indices"), py::arg("q"), py::arg("scale"),
        py::arg("weight") = py::none(), py::arg("eids") = py::none(),
        py::call_guard<py::gil_scoped_release>(),
        "Quantized SpMM over CSR rows on CUDA: out[r] = scale * sum_k q[indices[k]] (int8 [N, D]\n"
        "or [N, H, D], exact integer sum), or with weight float32 [E], [E, 1], [E, H], [E, H, 1]:\n"
        "scale * sum_k weight[eids[k], h] * q[indices[k], h] (float32, CSR order, as the CPU op).");
  m.def("qsddmm", &qsddmm, py::arg("op"), py::arg("q_lhs"), py::arg("scale_lhs"),
        py::arg("lhs_index"), py::arg("q_rhs"), py::arg("scale_rhs"), py::arg("rhs_index"),
        py::call_guard<py::gil_scoped_release>(),
        "Quantized SDDMM per edge on CUDA: op 'add' / 'sub' (dequantize, then add) or 'mul' /\n"
        "'dot' (exact integer product or DP4A dot times fl32(scale_lhs * scale_rhs)); float32\n"
        "[E, ...], dot [E, 1] or [E, H, 1].");
  m.def("int8_gemm", &int8_gemm, py::arg("qa"), py::arg("qb"), py::arg("scale"),
        py::arg("layout"), py::arg("bias") = py::none(), py::call_guard<py::gil_scoped_release>(),
        "float32 C = fl32(float(acc) * scale) (+ bias) with acc the exact integer product of the\n"
        "int8 CUDA matrices qa and qb on tensor cores (mma.sync s8): layout 'nn' A[M,K] @ B[K,N],\n"
        "'nt' A[M,K] @ B[N,K]^T, 'tn' A[K,M]^T @ B[K,N]. Bit-identical to\n"
        "qtrain.ops.gemm.reference_int8_gemm.");
  m.def("quantized_gemm", &quantized_gemm, py::arg("a"), py::arg("b"), py::arg("absmax_a"),
        py::arg("absmax_b"), py::arg("bits_a") = 8, py::arg("bits_b") = 8,
        py::arg("layout") = "nn", py::arg("bias") = py::none(), py::arg("stochastic") = false,
        py::arg("seed") = 0, py::arg("offset_a") = 0, py::arg("offset_b") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "Fused quantize + INT8 GEMM + dequantize on CUDA. a, b: float32 CUDA matrices stored as\n"
        "`layout` asks (as int8_gemm's qa, qb); absmax_a, absmax_b: float32 tensors of one value\n"
        "(on a's device, or on the CPU where they are checked to be finite and >= 0), the\n"
        "quantization ranges. Each operand is quantized to bits_a / bits_b bits exactly as\n"
        "quantize_symmetric would with that absmax (stochastic rounding at counters offset_a /\n"
        "offset_b + the element's flat index, one seed), a while it is loaded into the tile,\n"
        "then multiplied on int8 tensor cores; the epilogue writes C = fl32(float(acc) *\n"
        "fl32(scale_a * scale_b)) (+ bias), scale_x = fl32(absmax_x / qmax_x), and reduces\n"
        "absmax(|C|). Returns (C float32 [M, N], absmax of C float32 0-d on the device): the\n"
        "next layer's absmax_a without a pass over C and without waiting for the device.\n"
        "Bit-identical to qtrain.ops.gemm.reference_quantized_gemm.");
}

}  // namespace cuda
}  // namespace qtrain
