// dequantize_rows_into on CUDA (front: ops/dequantize_rows_into.cpp): a composition of
// the dequantize_rows kernel (rowwise.cu) and ATen ops, bit for bit with the reference
// qtrain/quant/rowwise.py dequantize_rows_into. The index is checked on the device
// (an entry outside out's rows is an IndexError, a row named twice a ValueError; the
// host waits for those flags). The zeros and ranges are copied out of the segment
// (they may start at an odd byte); the rows are decoded straight into out when they
// fill it in order, else into a fresh tensor that index_copy_ / index_add_ / add_
// put in place (one float32 addition per element, as the reference's +=).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "common/checks.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

void dequantize_rows_into(const at::Tensor& segment, int64_t rows, int64_t bits,
                          const at::Tensor& out, const std::optional<at::Tensor>& index_in,
                          bool add) {
  const c10::cuda::CUDAGuard guard(segment.device());
  const cudaStream_t stream = current_stream();
  const int64_t width = out.size(1);
  const at::Tensor index = index_in.has_value()
                               ? checked_row_index("qtrain::dequantize_rows_into", *index_in,
                                                   out.size(0), true, stream)
                               : at::Tensor();
  if (rows == 0 || width == 0) return;
  const int64_t n_packed = checks::packed_bytes(rows * width, bits);
  const at::Tensor params = segment.narrow(0, n_packed, 4 * rows).clone();  // zeros, ranges
  const auto* zero = static_cast<const uint16_t*>(params.const_data_ptr());
  const auto* packed = static_cast<const uint8_t*>(segment.const_data_ptr());
  if (!index.defined() && !add) {
    launch_dequantize_rows(packed, zero, zero + rows, rows, width, bits,
                           out.mutable_data_ptr<float>(), stream);
    return;
  }
  at::Tensor values = at::empty({rows, width}, out.options());
  launch_dequantize_rows(packed, zero, zero + rows, rows, width, bits,
                         values.mutable_data_ptr<float>(), stream);
  at::Tensor target = out;  // out is the caller's tensor: written in place
  if (!index.defined()) {
    target.add_(values);
  } else if (add) {
    target.index_add_(0, index, values);
  } else {
    target.index_copy_(0, index, values);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("dequantize_rows_into", &qtrain::cuda::dequantize_rows_into);
}
