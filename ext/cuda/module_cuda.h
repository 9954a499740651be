// What a CUDA build adds to the qtrain._ext module (module.cpp calls bind_module):
// cuda_info() and the CUDA half of the error-path probe. The CUDA kernels themselves
// register as torch ops (TORCH_LIBRARY_IMPL(qtrain, CUDA, ...)) in their own files.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace qtrain {
namespace cuda {

void bind_module(pybind11::module_& m);

}  // namespace cuda
}  // namespace qtrain
