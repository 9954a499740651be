// The qtrain._ext module: CPU kernels plus a description of the build.
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 + the at::Tensor caster, without all of torch/extension.h

#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

#include "cpu_isa.h"
#include "qtrain_ops.h"

namespace {

std::string compiler_version() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#elif defined(_MSC_VER)
  return "msvc " + std::to_string(_MSC_VER);
#else
  return "unknown";
#endif
}

pybind11::dict info() {
  namespace py = pybind11;
  using namespace qtrain;
  py::dict d;
  d["isa"] = isa::name(isa::variant());
  d["isa_best"] = isa::name(isa::best());
  d["isa_supported"] = isa::supported();
  d["isa_compiled"] = isa::compiled();
  d["threads"] = at::get_num_threads();
#ifdef _OPENMP
  d["openmp"] = static_cast<int>(_OPENMP);
  d["omp_max_threads"] = omp_get_max_threads();
#else
  d["openmp"] = py::none();
  d["omp_max_threads"] = 1;
#endif
  d["compiler"] = compiler_version();
#if defined(TORCH_VERSION_MAJOR) && defined(TORCH_VERSION_MINOR) && defined(TORCH_VERSION_PATCH)
  d["torch_built_against"] = std::to_string(TORCH_VERSION_MAJOR) + "." +
                             std::to_string(TORCH_VERSION_MINOR) + "." +
                             std::to_string(TORCH_VERSION_PATCH);
#else
  d["torch_built_against"] = py::none();
#endif
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  // torch must be initialised (its Python types registered) before tensors cross the boundary.
  py::module_::import("torch");
  m.doc() = "qtrain CPU kernels (OpenMP, runtime ISA dispatch). See qtrain.backends.status().";
  m.def("quantize_symmetric", &qtrain::quantize_symmetric, py::arg("x"), py::arg("bits"),
        py::arg("stochastic") = false, py::arg("seed") = 0, py::arg("offset") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "Symmetric per-tensor quantization of a float32 CPU tensor to `bits` (2..8) bits.\n"
        "Returns (q int8 of x's shape, scale float32 0-d); x ~ q * scale. Stochastic\n"
        "rounding draws u_i from counter_uniform(numel, seed, offset). Bit-identical to\n"
        "qtrain.quant.quantize_symmetric for any thread count.");
  m.def("keep_mask_rows", &qtrain::keep_mask_rows, py::arg("ids"), py::arg("width"),
        py::arg("threshold"), py::arg("seed") = 0, py::call_guard<py::gil_scoped_release>(),
        "Dropout keep-mask of a [rows, width] tensor keyed by global row ids (int64 [rows]):\n"
        "element (r, j) is kept when (hash(seed, ids[r] * width + j) >> 8) >= threshold\n"
        "(0..2^24). Packed 1 bit per element, row-major, little-endian (pack_bits layout).");
  m.def("counter_uniform", &qtrain::counter_uniform, py::arg("n"), py::arg("seed") = 0,
        py::arg("offset") = 0, py::call_guard<py::gil_scoped_release>(),
        "n float32 uniforms in [0, 1); element i depends only on (seed, offset + i).");
  m.def("qspmm", &qtrain::qspmm, py::arg("indptr"), py::arg("indices"), py::arg("q"),
        py::arg("scale"), py::arg("weight") = py::none(), py::arg("eids") = py::none(),
        py::call_guard<py::gil_scoped_release>(),
        "Quantized SpMM over CSR rows: out[r] = scale * sum_k q[indices[k]] (int8 [N, D] or\n"
        "[N, H, D], exact int32 sum), or with weight float32 [E], [E, 1], [E, H], [E, H, 1]:\n"
        "scale * sum_k weight[eids[k], h] * q[indices[k], h] (float32, CSR order). Rows are\n"
        "computed whole by one thread, so results do not depend on the thread count.");
  m.def("qsddmm", &qtrain::qsddmm, py::arg("op"), py::arg("q_lhs"), py::arg("scale_lhs"),
        py::arg("lhs_index"), py::arg("q_rhs"), py::arg("scale_rhs"), py::arg("rhs_index"),
        py::call_guard<py::gil_scoped_release>(),
        "Quantized SDDMM per edge e on rows q_lhs[lhs_index[e]], q_rhs[rhs_index[e]]: op 'add' /\n"
        "'sub' (dequantize, then add) or 'mul' / 'dot' (exact integer product or dot times\n"
        "fl32(scale_lhs * scale_rhs)); float32 [E, ...], dot [E, 1] or [E, H, 1].");
  m.def("int8_gemm", &qtrain::int8_gemm, py::arg("qa"), py::arg("qb"), py::arg("scale"),
        py::arg("layout"), py::arg("bias") = py::none(), py::call_guard<py::gil_scoped_release>(),
        "float32 C = fl32(float(acc) * scale) (+ bias) with acc the exact integer product of the\n"
        "int8 matrices qa and qb: layout 'nn' A[M,K] @ B[K,N], 'nt' A[M,K] @ B[N,K]^T, 'tn'\n"
        "A[K,M]^T @ B[K,N]. scale is fl32(scale_a * scale_b); bias (N,) float is added after\n"
        "the multiply. Bit-identical to qtrain.ops.gemm.reference_int8_gemm for any thread\n"
        "count and ISA (avx512vnni: vpdpbusd; avx512f/avx2: vpmaddwd on zmm/ymm; default: portable).");
  m.def("quantize_rows", &qtrain::quantize_rows, py::arg("x"), py::arg("bits"),
        py::arg("stochastic") = true, py::arg("seed") = 0, py::arg("offset") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "Per-row quantization of float32 x [rows, width] to `bits` (1, 2, 4, 8) bits, packed\n"
        "densely: (packed uint8 [ceil(rows*width*bits/8)], zero bfloat16 [rows], range\n"
        "bfloat16 [rows]). Stochastic rounding draws u_i from counter_uniform at offset + i\n"
        "(i the flat index); x must be finite. Bit-identical to\n"
        "qtrain.quant.rowwise.quantize_rows for any thread count and ISA.");
  m.def("dequantize_rows", &qtrain::dequantize_rows, py::arg("packed"), py::arg("zero"),
        py::arg("range"), py::arg("bits"), py::arg("width"),
        py::call_guard<py::gil_scoped_release>(),
        "float32 [rows, width] from quantize_rows' output: q * fl32(range / (2^bits - 1)) +\n"
        "zero per row. Bit-identical to qtrain.quant.rowwise.dequantize_rows.");
  m.def("quantize_rows_into", &qtrain::quantize_rows_into, py::arg("x"), py::arg("index"),
        py::arg("bits"), py::arg("stochastic"), py::arg("seed"), py::arg("offset"),
        py::arg("out"), py::call_guard<py::gil_scoped_release>(),
        "quantize_rows(x[index], ...) written into the uint8 segment `out` (packed values,\n"
        "then bfloat16 zeros, then ranges) without the gathered rows; index None: all of x.\n"
        "Bit-identical to qtrain.quant.rowwise.quantize_rows of the gathered rows.");
  m.def("dequantize_rows_into", &qtrain::dequantize_rows_into, py::arg("segment"),
        py::arg("rows"), py::arg("bits"), py::arg("out"), py::arg("index"), py::arg("add"),
        py::call_guard<py::gil_scoped_release>(),
        "The rows of a quantize_rows_into segment dequantized into out[index] (add: added\n"
        "onto them); index None: out's rows in order. Bit-identical to dequantize_rows.");
  m.def("project_quantize_rows", &qtrain::project_quantize_rows, py::arg("x"), py::arg("k"),
        py::arg("bits"), py::arg("stochastic") = true, py::arg("seed") = 0, py::arg("offset") = 0,
        py::arg("projection_offset") = 0, py::call_guard<py::gil_scoped_release>(),
        "quantize_rows of float32 x [rows, d] projected to k columns by the Rademacher matrix\n"
        "at projection_offset, computed row block by row block without the projected tensor.\n"
        "Bit-identical to quantize_rows(qtrain.quant.projection.project_rows(x, k, seed,\n"
        "projection_offset), bits, rounding, seed, offset) for any thread count and ISA.");
  m.def("dequantize_unproject_rows", &qtrain::dequantize_unproject_rows, py::arg("packed"),
        py::arg("zero"), py::arg("range"), py::arg("bits"), py::arg("k"), py::arg("d"),
        py::arg("seed") = 0, py::arg("projection_offset") = 0,
        py::call_guard<py::gil_scoped_release>(),
        "float32 [rows, d] from project_quantize_rows' output: dequantize_rows, then\n"
        "qtrain.quant.projection.unproject_rows by the same matrix, bit for bit.");
  m.def("pack_bits", &qtrain::pack_bits, py::arg("values"), py::arg("bits"),
        py::call_guard<py::gil_scoped_release>(),
        "uint8 or bool values (any shape, taken flat, masked to `bits` bits) as one dense\n"
        "little-endian bit stream (uint8 [ceil(n*bits/8)]), as qtrain.quant.rowwise.pack_bits.");
  m.def("unpack_bits", &qtrain::unpack_bits, py::arg("packed"), py::arg("bits"), py::arg("n"),
        py::call_guard<py::gil_scoped_release>(),
        "The first n values (uint8, flat) of a stream written by pack_bits.");
  m.def("masked_scale", &qtrain::masked_scale, py::arg("grad"), py::arg("packed"),
        py::arg("scale"), py::call_guard<py::gil_scoped_release>(),
        "float32 grad * fl32(scale) where bit i of the 1-bit stream packed (pack_bits(mask, 1))\n"
        "is set, else +0: ReLU's and dropout's backward from a packed mask, in one pass.\n"
        "As qtrain.quant.rowwise.masked_scale.");
  m.def("rademacher", &qtrain::rademacher, py::arg("d"), py::arg("k"), py::arg("seed") = 0,
        py::arg("offset") = 0, py::call_guard<py::gil_scoped_release>(),
        "float32 [d, k] normalized Rademacher matrix: entry i is -fl32(1/sqrt(k)) if the\n"
        "counter hash of (seed, offset + i) has its top bit set, else +fl32(1/sqrt(k)).\n"
        "Bit-identical to qtrain.quant.projection.rademacher.");
  m.def("info", &info,
        "Build and run-time facts: ISA in use, OpenMP threads, compiler, torch version.");
  m.def(
      "set_isa", [](const std::string& name) { return qtrain::isa::set(name); }, py::arg("name"),
      "Force the kernel variant ('avx512vnni', 'avx512f', 'avx2', 'default'); returns the\n"
      "previous one. 'avx512vnni' differs from 'avx512f' only in the int8 GEMM.");
}
