// dequantize_rows_into on the CPU (front: ops/dequantize_rows_into.cpp; the codec:
// rowwise.h): the segment's rows are decoded straight into the rows of out that the
// index names (in order without one), or through a per-thread stage row added onto
// them with `add`. The index is checked in one pass before the threads start: every
// entry a row of out (IndexError), no row twice (ValueError), since threads write them.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

void dequantize_rows_into(const at::Tensor& segment, int64_t rows, int64_t bits,
                          const at::Tensor& out, const std::optional<at::Tensor>& index_in,
                          bool add) {
  const int64_t width = out.size(1);
  const at::Tensor index =
      index_in.has_value()
          ? checked_row_index("qtrain::dequantize_rows_into", *index_in, out.size(0), true)
          : at::Tensor();
  if (rows == 0 || width == 0) return;
  const uint8_t* in = static_cast<const uint8_t*>(segment.const_data_ptr());
  const int64_t n_packed = packed_bytes(rows * width, bits);
  const DequantizeArgs a{&kernels(), in, in + n_packed, in + n_packed + 2 * rows, width, bits};
  float* op = out.mutable_data_ptr<float>();
  if (!index.defined() && !add) {
    OutputRows sink{op, width};
    parallel_rows(rows, width,
                  [&](int, int64_t r0, int64_t r1) { dequantize_block(a, r0, r1, sink); });
    return;
  }
  const int64_t* ip = index.defined() ? index.const_data_ptr<int64_t>() : nullptr;
  parallel_rows(rows, width, [&](int, int64_t r0, int64_t r1) {
    IndexedOutputRows sink(op, width, ip, add);
    dequantize_block(a, r0, r1, sink);
  });
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("dequantize_rows_into", &qtrain::dequantize_rows_into);
}
