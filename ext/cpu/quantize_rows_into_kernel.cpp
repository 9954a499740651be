// quantize_rows_into on the CPU (front: ops/quantize_rows_into.cpp; the codec:
// rowwise.h): the rows x[index[r]] are gathered as they are quantized (no gathered
// copy), and the packed values, zeros and ranges go straight to their places in the
// segment, whose zero points may start at any byte. The index is checked against x's
// rows (IndexError) in one pass before the threads start.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <optional>

#include "cpu/rowwise.h"

namespace qtrain {
namespace {

using namespace rowwise;

void quantize_rows_into(const at::Tensor& x_in, const std::optional<at::Tensor>& index_in,
                        int64_t bits, bool stochastic, int64_t seed, int64_t offset,
                        const at::Tensor& out) {
  const int64_t width = x_in.size(1);
  const at::Tensor index =
      index_in.has_value()
          ? checked_row_index("qtrain::quantize_rows_into", *index_in, x_in.size(0), false)
          : at::Tensor();
  const int64_t rows = index.defined() ? index.numel() : x_in.size(0);
  if (rows == 0) return;
  uint8_t* o = static_cast<uint8_t*>(out.mutable_data_ptr());
  const int64_t n_packed = packed_bytes(rows * width, bits);
  if (width == 0) {  // no values: each row's zero and range are those of an empty row
    std::memset(o, 0, static_cast<size_t>(4 * rows));
    return;
  }
  const at::Tensor x = x_in.contiguous();
  const QuantizeArgs a = quantize_args(o, o + n_packed, o + n_packed + 2 * rows, width, bits,
                                       stochastic, static_cast<uint64_t>(seed), offset);
  if (index.defined()) {
    IndexedInputRows src{x.const_data_ptr<float>(), width, index.const_data_ptr<int64_t>()};
    parallel_rows(rows, width,
                  [&](int, int64_t r0, int64_t r1) { quantize_block(a, r0, r1, src); });
  } else {
    InputRows src{x.const_data_ptr<float>(), width};
    parallel_rows(rows, width,
                  [&](int, int64_t r0, int64_t r1) { quantize_block(a, r0, r1, src); });
  }
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("quantize_rows_into", &qtrain::quantize_rows_into); }
