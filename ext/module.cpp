// The qtrain._ext module. Importing it registers the op library (torch.ops.qtrain.*:
// the fronts in ops/, the kernels in cpu/ and, in a CUDA build, cuda/); what pybind11
// binds here is only what is not an op: the build's description and the ISA choice.
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 + the at::Tensor caster, without all of torch/extension.h

#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

#include "cpu/isa.h"

#ifdef QTRAIN_WITH_CUDA
#include "cuda/module_cuda.h"
#endif

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
#ifdef QTRAIN_WITH_CUDA
  d["cuda_kernels"] = true;
#else
  d["cuda_kernels"] = false;
#endif
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
  m.doc() =
      "qtrain's op library: importing it registers torch.ops.qtrain.*. See "
      "qtrain.backends.status().";
  m.def("info", &info,
        "Build and run-time facts: ISA in use, OpenMP threads, compiler, torch version.");
  m.def(
      "set_isa", [](const std::string& name) { return qtrain::isa::set(name); }, py::arg("name"),
      "Force the kernel variant ('avx512vnni', 'avx512f', 'avx2', 'default'); returns the\n"
      "previous one. 'avx512vnni' differs from 'avx512f' only in the int8 GEMM.");
#ifdef QTRAIN_WITH_CUDA
  qtrain::cuda::bind_module(m);
#endif
}
