// The CUDA part of the qtrain._ext module: cuda_info() and the CUDA error-path probe.
#include <cuda_runtime_api.h>

#include <string>

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

#include "cuda/error_probe.h"
#include "cuda/module_cuda.h"

namespace {

pybind11::dict info() {
  namespace py = pybind11;
  py::dict d;
  int runtime = 0;
  d["cuda_runtime"] = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? py::cast(runtime) : py::none();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    count = 0;
    cudaGetLastError();  // clear the sticky "no device" error for later calls
  }
  d["devices"] = count;
  py::list names;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      names.append(std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                   std::to_string(prop.minor) + ")");
    }
  }
  d["device_names"] = names;
#ifdef QTRAIN_CUDA_ARCHS
  d["archs_compiled"] = QTRAIN_CUDA_ARCHS;
#else
  d["archs_compiled"] = py::none();
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

namespace qtrain {
namespace cuda {

void bind_module(pybind11::module_& m) {
  m.def("cuda_info", &info, "The CUDA build and devices: CUDA runtime, devices, archs, torch.");
  m.def("cuda_raise_value_error", &raise_value_error,
        "Raises ValueError from code nvcc compiled: the CUDA half of the error-path probe.");
}

}  // namespace cuda
}  // namespace qtrain
