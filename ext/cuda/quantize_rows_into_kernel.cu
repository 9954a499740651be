// quantize_rows_into on CUDA (front: ops/quantize_rows_into.cpp): a composition of ATen
// ops and the quantize_rows kernel (rowwise.cu), bit for bit with the reference
// qtrain/quant/rowwise.py quantize_rows_into / write_segment: the index is checked on
// the device (an entry outside x's rows is an IndexError; the host waits for that one
// flag), the rows are gathered (index_select), quantized into fresh, aligned buffers and
// copied into the segment's layout: the packed values, then the bfloat16 zeros, then the
// ranges (the segment may start at any byte of a message buffer, so its parts may not be
// aligned for the kernel's stores).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "common/checks.h"
#include "common/rng.h"
#include "cuda/common.cuh"
#include "cuda/rowwise.cuh"

namespace qtrain {
namespace cuda {
namespace {

using namespace rowwise;

void quantize_rows_into(const at::Tensor& x_in, const std::optional<at::Tensor>& index_in,
                        int64_t bits, bool stochastic, int64_t seed, int64_t offset,
                        const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const cudaStream_t stream = current_stream();
  const int64_t width = x_in.size(1);
  const at::Tensor index = index_in.has_value()
                               ? checked_row_index("qtrain::quantize_rows_into", *index_in,
                                                   x_in.size(0), false, stream)
                               : at::Tensor();
  const int64_t rows = index.defined() ? index.numel() : x_in.size(0);
  if (rows == 0) return;
  if (width == 0) {  // no values: each row's zero and range are those of an empty row
    out.zero_();
    return;
  }
  const at::Tensor x = index.defined() ? x_in.index_select(0, index) : x_in.contiguous();
  Quantized q = allocate_quantized(x.options(), rows, width, bits);
  launch_quantize_rows(x.const_data_ptr<float>(), rows, width, bits, stochastic,
                       rng::keys_from_seed(static_cast<uint64_t>(seed)), offset, q, stream);
  const int64_t n_packed = checks::packed_bytes(rows * width, bits);
  out.narrow(0, 0, n_packed).copy_(q.packed);
  out.narrow(0, n_packed, 2 * rows).copy_(q.zero.view(at::kByte));
  out.narrow(0, n_packed + 2 * rows, 2 * rows).copy_(q.range.view(at::kByte));
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("quantize_rows_into", &qtrain::cuda::quantize_rows_into);
}
