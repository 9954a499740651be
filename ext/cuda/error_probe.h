// error_probe.cu: throws c10::ValueError from code nvcc compiled (its host compiler
// may differ from the one that built module.cpp), for qtrain.backends.check_error_path.
#pragma once

namespace qtrain {
namespace cuda {

void raise_value_error();

}  // namespace cuda
}  // namespace qtrain
