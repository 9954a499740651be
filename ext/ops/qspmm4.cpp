// qspmm4: qspmm over rows of 4-bit values packed two per byte (issue 32, packed storage).
// Reference: qtrain/ops/sparse.py reference_qspmm4 (= reference_qspmm of
// qtrain/quant/packed.py unpack_int4(packed, width)); kernels: cpu/qspmm4_kernel.cpp,
// cuda/qspmm4_kernel.cu (qspmm's bodies, cpu/spmm_body.h and cuda/spmm_body.cuh, reading
// nibbles); Python front qtrain/ops/sparse.py qspmm_packed.
//
//   qspmm4(indptr, indices, packed, width, scale, weight, eids, row_scale)
//     == qspmm(indptr, indices, unpack_int4(packed, width), scale, weight, eids, row_scale)
//   bit for bit
//
// packed is uint8 [N, ceil(width / 2)] or [N, H, ceil(width / 2)] (pack_int4's layout: value
// j of a row in byte j / 2, the low nibble for an even j, 4-bit two's complement); out
// float32 [rows, width] or [rows, H, width]. The other arguments, and what the kernels
// refuse, are qspmm's (ops/qspmm.cpp).
#include "common/checks.h"
#include "common/front.h"

#include <optional>

namespace qtrain {
namespace {

struct QSpmm4 {
  static constexpr const char* kName = "qspmm4";
  static constexpr const char* kSchema =
      "qspmm4(Tensor indptr, Tensor indices, Tensor packed, int width, float scale,"
      " Tensor? weight=None, Tensor? eids=None, Tensor? row_scale=None) -> Tensor";
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                               double, const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&);

  static void check(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& packed,
                    int64_t width, double, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& eids,
                    const std::optional<at::Tensor>& row_scale) {
    constexpr const char* fn = "qtrain::qspmm4";
    checks::spmm_indices(fn, indptr, indices);
    checks::packed_rows(fn, "packed", packed);
    checks::same_device(fn, "packed", packed, "indptr", indptr.device());
    checks::int4_width(fn, packed, width);
    checks::spmm_weights(fn, indptr, indices, packed.dim() == 3 ? packed.size(1) : 1, weight,
                         eids);
    checks::row_scale(fn, "row_scale", "packed", packed.device(), packed.size(0),
                      packed.dim() == 3 ? packed.size(1) : 1, row_scale);
  }
};

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<qtrain::QSpmm4>(m); }
TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<qtrain::QSpmm4>(m); }
