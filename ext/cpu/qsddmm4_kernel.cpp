// qsddmm4 on the CPU (front: ops/qsddmm4.cpp): qsddmm over rows of 4-bit values packed two
// per byte, bit for bit qsddmm(op, unpack_int4(packed_lhs, width), scale_lhs, lhs_index,
// unpack_int4(packed_rhs, width), scale_rhs, rhs_index, row_scale_lhs, row_scale_rhs)
// (reference: qtrain/ops/sparse.py reference_qsddmm4). Every call runs qsddmm's per-head
// body (cpu/sddmm_body.h heads_body) reading the rows as nibbles: add / sub / mul take W
// values at a time sign-extended in value order (sparse::Int4Rows), a dot multiplies each
// byte's two nibbles with the other row's in place (an exact integer sum, whatever its
// order), so the same float32 operations give the same outputs from half the bytes. Each
// head starts on a byte (ceil(width / 2) bytes a head); past an odd width the high nibble
// is not read.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "common/sparse_operands.h"
#include "cpu/isa.h"
#include "cpu/sddmm_body.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace qtrain {
namespace {

using sddmm_cpu::heads_by_op;
using sparse::Int4Rows;

using PackedArgs = sddmm_cpu::SddmmArgs<uint8_t>;

struct Kernels {
  bool (*edges_i32)(int, const PackedArgs&, int64_t, int64_t);
  bool (*edges_i64)(int, const PackedArgs&, int64_t, int64_t);
};

#define QT_DEFINE_VARIANT(NAME, ATTR, ISA)                                                 \
  ATTR QT_FLATTEN bool edges_i32_##NAME(int op, const PackedArgs& a, int64_t e0, int64_t e1) { \
    return heads_by_op<ISA, Int4Rows, int32_t>(op, a, e0, e1);                                \
  }                                                                                           \
  ATTR QT_FLATTEN bool edges_i64_##NAME(int op, const PackedArgs& a, int64_t e0, int64_t e1) { \
    return heads_by_op<ISA, Int4Rows, int64_t>(op, a, e0, e1);                                \
  }                                                                                           \
  const Kernels kernels_##NAME = {edges_i32_##NAME, edges_i64_##NAME};

#define QT_NO_ATTR
QT_DEFINE_VARIANT(default, QT_NO_ATTR, isa::kDefault)
#if QT_X86_DISPATCH
QT_DEFINE_VARIANT(avx2, QT_TARGET_AVX2, isa::kAvx2)
QT_DEFINE_VARIANT(avx512, QT_TARGET_AVX512, isa::kAvx512)
#endif

at::Tensor qsddmm4(c10::string_view op_name, const at::Tensor& packed_lhs, double scale_lhs,
                   const at::Tensor& lhs_index, const at::Tensor& packed_rhs, double scale_rhs,
                   const at::Tensor& rhs_index, int64_t width,
                   const std::optional<at::Tensor>& row_scale_lhs,
                   const std::optional<at::Tensor>& row_scale_rhs) {
  const sparse_operands::Sddmm s =
      sparse_operands::sddmm(op_name, packed_lhs, lhs_index, packed_rhs, rhs_index,
                             row_scale_lhs, row_scale_rhs, width);
  if (s.E == 0) return s.out;
  const PackedArgs a = sddmm_cpu::make_args<uint8_t>(s, scale_lhs, scale_rhs);
  const Kernels& K = QT_SELECT_VARIANT(kernels_);
  const auto run = s.wide ? K.edges_i64 : K.edges_i32;
  sddmm_cpu::run_edges("qtrain::qsddmm4", "packed_lhs", "packed_rhs", a, s.E,
                       [&](const PackedArgs& args, int64_t e0, int64_t e1) {
                         return run(s.op, args, e0, e1);
                       });
  return s.out;
}

}  // namespace
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("qsddmm4", &qtrain::qsddmm4); }
