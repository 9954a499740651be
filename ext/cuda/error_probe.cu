// The CUDA half of the error-path probe (qtrain.backends.check_error_path): a
// ValueError thrown by code nvcc compiled must reach Python as a ValueError. An
// H100 build whose compiler differed from torch's killed the process on every C++
// exception instead; this shows that without needing a GPU.
#include <c10/util/Exception.h>

#include "cuda/error_probe.h"

namespace qtrain {
namespace cuda {

void raise_value_error() {
  TORCH_CHECK_VALUE(false,
                    "qtrain._ext.cuda_raise_value_error: raised on purpose (error-path probe)");
}

}  // namespace cuda
}  // namespace qtrain
