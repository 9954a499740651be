// What the qspmm(4) and qsddmm(4) kernels of every device start from, once their front
// (ops/qspmm.cpp, ops/qsddmm.cpp, ...) has checked the arguments: contiguous operands,
// the index tensors promoted to one type (mixed int32 / int64 becomes int64), the
// weights as float32, and the float32 output allocated on the operands' device.
// Device-neutral host code; the kernels then read the data (and refuse what only
// the data shows).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace qtrain {
namespace sparse_operands {

struct Spmm {
  at::Tensor indptr, indices, eids, q, w, rs, out;  // eids / w / rs undefined when absent
  bool wide = false;      // int64 indices (else int32)
  bool weighted = false;  // weight or row_scale given: the float32 form (eids may be absent)
  // Hw: weights per edge (1 or H); Hr: row scales per input row (1 or H)
  int64_t rows = 0, nnz = 0, H = 1, D = 0, Hw = 1, Hr = 1;
};

// width: the values per row (per head) of q when q holds them packed (qspmm4: two 4-bit
// values per byte); -1 for int8 q, whose last dimension is the width.
inline Spmm spmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& q,
                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& eids,
                 const std::optional<at::Tensor>& row_scale, int64_t width = -1) {
  Spmm s;
  s.q = q.contiguous();
  const bool has_weight = weight.has_value() && weight->defined();
  const bool has_rs = row_scale.has_value() && row_scale->defined();
  s.weighted = has_weight || has_rs;
  const bool has_eids = has_weight && eids.has_value() && eids->defined();
  s.wide = indptr.scalar_type() == at::kLong || indices.scalar_type() == at::kLong ||
           (has_eids && eids->scalar_type() == at::kLong);
  const at::ScalarType it = s.wide ? at::kLong : at::kInt;
  s.indptr = indptr.to(it).contiguous();
  s.indices = indices.to(it).contiguous();
  if (has_eids) s.eids = eids->to(it).contiguous();
  s.rows = s.indptr.numel() - 1;
  s.nnz = s.indices.numel();
  s.H = s.q.dim() == 3 ? s.q.size(1) : 1;
  s.D = width >= 0 ? width : s.q.size(-1);
  if (has_weight) {
    s.w = weight->to(at::kFloat).contiguous();
    s.Hw = s.w.dim() == 1 ? 1 : s.w.size(1);
  }
  if (has_rs) {
    s.rs = row_scale->contiguous();
    s.Hr = s.rs.dim() == 1 ? 1 : s.rs.size(1);
  }
  const std::vector<int64_t> shape =
      s.q.dim() == 3 ? std::vector<int64_t>{s.rows, s.H, s.D} : std::vector<int64_t>{s.rows, s.D};
  s.out = at::empty(shape, s.q.options().dtype(at::kFloat));
  return s;
}

enum SddmmOp : int { kAdd = 0, kSub = 1, kMul = 2, kDot = 3 };

struct Sddmm {
  at::Tensor ql, qr, li, ri, rsl, rsr, out;  // rsl / rsr: row scales, undefined when absent
  int op = kAdd;
  bool wide = false;  // int64 indices (else int32)
  int64_t E = 0, H = 1, D = 0, Hl = 1, Hr = 1;  // Hl / Hr: row scales per row (1 or H)
  int64_t Ds = 0;  // bytes a head's values take: D (int8), ceil(D / 2) (packed)
};

// width as in spmm: the values per row (per head) of packed operands (qsddmm4); -1 for int8.
inline Sddmm sddmm(c10::string_view op, const at::Tensor& q_lhs, const at::Tensor& lhs_index,
                   const at::Tensor& q_rhs, const at::Tensor& rhs_index,
                   const std::optional<at::Tensor>& row_scale_lhs,
                   const std::optional<at::Tensor>& row_scale_rhs, int64_t width = -1) {
  Sddmm s;
  if (op == c10::string_view("add")) {
    s.op = kAdd;
  } else if (op == c10::string_view("sub")) {
    s.op = kSub;
  } else if (op == c10::string_view("mul")) {
    s.op = kMul;
  } else {
    TORCH_INTERNAL_ASSERT(op == c10::string_view("dot"), "qtrain::qsddmm(4): op '", op,
                          "' passed the front");
    s.op = kDot;
  }
  s.ql = q_lhs.contiguous();
  s.qr = q_rhs.contiguous();
  s.wide = lhs_index.scalar_type() == at::kLong || rhs_index.scalar_type() == at::kLong;
  const at::ScalarType it = s.wide ? at::kLong : at::kInt;
  s.li = lhs_index.to(it).contiguous();
  s.ri = rhs_index.to(it).contiguous();
  s.E = s.li.numel();
  s.H = s.ql.dim() == 3 ? s.ql.size(1) : 1;
  s.Ds = s.ql.size(-1);
  s.D = width >= 0 ? width : s.Ds;
  if (row_scale_lhs.has_value() && row_scale_lhs->defined()) {
    s.rsl = row_scale_lhs->contiguous();
    s.Hl = s.rsl.dim() == 1 ? 1 : s.rsl.size(1);
  }
  if (row_scale_rhs.has_value() && row_scale_rhs->defined()) {
    s.rsr = row_scale_rhs->contiguous();
    s.Hr = s.rsr.dim() == 1 ? 1 : s.rsr.size(1);
  }
  std::vector<int64_t> shape{s.E};
  if (s.ql.dim() == 3) shape.push_back(s.H);
  shape.push_back(s.op == kDot ? 1 : s.D);
  s.out = at::empty(shape, s.ql.options().dtype(at::kFloat));
  return s;
}

}  // namespace sparse_operands
}  // namespace qtrain
