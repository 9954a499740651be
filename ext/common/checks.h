// Device-neutral argument checks used by the op fronts (ext/ops/*.cpp). They read
// only metadata (dtype, shape, layout, device), never data, so they cost nothing on
// any device and never wait for a GPU. Failures are c10::ValueError / TypeError,
// which Python sees as ValueError / TypeError.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace qtrain {
namespace checks {

// A defined, dense (strided) tensor.
inline void dense(const char* fn, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.defined(), fn, ": ", name, " must be a tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, fn, ": ", name,
                    " must be a dense (strided) tensor, got layout ", t.layout());
}

// t is on `device` (the device of the op's first tensor, named `first`).
inline void same_device(const char* fn, const char* name, const at::Tensor& t,
                        const char* first, const at::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device, fn, ": ", name, " is on ", t.device(), " but ", first,
                    " is on ", device);
}

// A dtype as Python spells it (float32, int8, ...), as users read it in messages.
inline const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

inline void dtype(const char* fn, const char* name, const at::Tensor& t, at::ScalarType want) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, fn, ": ", name, " must be ", dtype_name(want),
                   ", got ", dtype_name(t.scalar_type()));
}

// A 1-d int32 or int64 index tensor.
inline void index(const char* fn, const char* name, const at::Tensor& t) {
  dense(fn, name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, fn, ": ", name,
                   " must be int32 or int64, got ", dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1, fn, ": ", name, " must be 1-d, got shape ", t.sizes());
}

// int8 rows [N, D] or [N, H, D].
inline void int8_rows(const char* fn, const char* name, const at::Tensor& t) {
  dense(fn, name, t);
  dtype(fn, name, t, at::kChar);
  TORCH_CHECK_VALUE(t.dim() == 2 || t.dim() == 3, fn, ": ", name,
                    " must have shape [N, D] or [N, H, D], got ", t.sizes());
}

inline void bits_in(const char* fn, int64_t bits, int64_t lo, int64_t hi) {
  TORCH_CHECK_VALUE(bits >= lo && bits <= hi, fn, ": bits must be an integer in ", lo, "..", hi,
                    ", got ", bits);
}

// Counters offset .. offset + n - 1 of the random stream stay in [0, 2^63).
inline void counter_range(const char* fn, int64_t n, int64_t offset) {
  TORCH_CHECK_VALUE(offset >= 0, fn, ": offset must be >= 0, got ", offset);
  TORCH_CHECK_VALUE(n <= std::numeric_limits<int64_t>::max() - offset, fn,
                    ": offset + numel must stay below 2^63, got offset ", offset, " and numel ",
                    n);
}

// The input of a row or column quantizer (quantize_symmetric_rows / _cols and their packed
// forms): bits in 2..max_bits, x a dense float32 [rows, cols], its counters in range.
inline void quantizer_input(const char* fn, const at::Tensor& x, int64_t bits, int64_t max_bits,
                            int64_t offset) {
  bits_in(fn, bits, 2, max_bits);
  dense(fn, "x", x);
  dtype(fn, "x", x, at::kFloat);
  TORCH_CHECK_VALUE(x.dim() == 2, fn, ": x must be 2-d [rows, cols], got shape ", x.sizes());
  counter_range(fn, x.numel(), offset);
}

// A column quantizer's block: 0 (one scale per column) or rows per scale.
inline void column_block(const char* fn, int64_t block) {
  TORCH_CHECK_VALUE(block >= 0, fn, ": block must be >= 0 (0: one scale per column), got ",
                    block);
}

// ---------------------------------------------------------------- GEMM (int8_gemm, quantized_gemm)

// The three layouts of a GEMM's stored operands: "nn" C = A @ B, "nt" A @ B^T, "tn" A^T @ B.
inline void gemm_layout(const char* fn, c10::string_view layout) {
  TORCH_CHECK_VALUE(layout == "nn" || layout == "nt" || layout == "tn", fn,
                    ": layout must be one of 'nn', 'nt', 'tn', got '", layout, "'");
}

// A dense 2-d operand of dtype `want`.
inline void gemm_operand(const char* fn, const char* name, const at::Tensor& t,
                         at::ScalarType want) {
  dense(fn, name, t);
  dtype(fn, name, t, want);
  TORCH_CHECK_VALUE(t.dim() == 2, fn, ": ", name, " must be 2-d, got shape ", t.sizes());
}

// N, the columns of the product of 2-d operands a, b stored as `layout` (checked) says;
// their inner dimensions must agree.
inline int64_t gemm_columns(const char* fn, c10::string_view layout, const char* a_name,
                            const at::Tensor& a, const char* b_name, const at::Tensor& b) {
  const int64_t k = layout == "tn" ? a.size(0) : a.size(1);
  const int64_t k2 = layout == "nt" ? b.size(1) : b.size(0);
  TORCH_CHECK_VALUE(k == k2, fn, ": inner dimensions differ for layout '", layout, "': ", a_name,
                    " ", a.sizes(), ", ", b_name, " ", b.sizes());
  return layout == "nt" ? b.size(0) : b.size(1);
}

// An optional bias: a dense floating-point 1-d tensor of n on `device`.
inline void gemm_bias(const char* fn, const std::optional<at::Tensor>& bias, int64_t n,
                      const char* first, const at::Device& device) {
  if (!bias.has_value() || !bias->defined()) return;
  const at::Tensor& t = *bias;
  dense(fn, "bias", t);
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), fn,
                   ": bias must be a floating-point tensor, got ", dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, fn, ": bias must have shape (", n,
                    ",), got ", t.sizes());
  same_device(fn, "bias", t, first, device);
}

// An optional per-row / per-column scale of the product's epilogue (int8_gemm's row_scale,
// col_scale): a dense float32 1-d tensor of n on `device`.
inline void gemm_scale_vector(const char* fn, const char* name,
                              const std::optional<at::Tensor>& scale, int64_t n,
                              const char* first, const at::Device& device) {
  if (!scale.has_value() || !scale->defined()) return;
  const at::Tensor& t = *scale;
  dense(fn, name, t);
  dtype(fn, name, t, at::kFloat);
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, fn, ": ", name, " must have shape (", n,
                    ",), got ", t.sizes());
  same_device(fn, name, t, first, device);
}

// ---------------------------------------------------------------- GCINT (requantize, dyq)

// The lowest bit of GCINT's 7-bit window: 0..25, so the window ends at bit 31 at most.
inline void window_shift(const char* fn, int64_t shift) {
  TORCH_CHECK_VALUE(shift >= 0 && shift <= 25, fn, ": shift must be an integer in 0..25, got ",
                    shift);
}

// dyq's saturation bound: at most one nonzero value in 2^tail saturates, tail in 0..24 (a
// count below 2^39 times 2^tail stays within int64). None: the paper's fullest window.
inline void dyq_tail(const char* fn, const std::optional<int64_t>& tail) {
  if (!tail.has_value()) return;
  TORCH_CHECK_VALUE(*tail >= 0 && *tail <= 24, fn,
                    ": tail must be None or an integer in 0..24, got ", *tail);
}

// ---------------------------------------------------------------- row codecs, bit packing

// Bits per value of the row codecs and bit packing (ops/quantize_rows.cpp and the rest).
inline void pack_bits_in(const char* fn, int64_t bits) {
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 4 || bits == 8, fn,
                    ": bits must be one of 1, 2, 4, 8, got ", bits);
}

// Values a packed stream may hold: at most 2^60, so n * bits never overflows.
inline void element_count(const char* fn, int64_t n) {
  TORCH_CHECK_VALUE(n >= 0 && n <= (int64_t{1} << 60), fn,
                    ": element count must be in [0, 2^60], got ", n);
}

// Bytes that n values of `bits` bits take packed (n <= 2^60).
inline int64_t packed_bytes(int64_t n, int64_t bits) { return (n * bits + 7) / 8; }

// rows x width values stay at most 2^60 (`what` names the width: "width", "k", "d").
inline void rows_times(const char* fn, int64_t rows, int64_t width, const char* what) {
  TORCH_CHECK_VALUE(width == 0 || rows <= (int64_t{1} << 60) / width, fn, ": rows * ", what,
                    " too large: ", rows, " x ", width);
}

// float32 rows [rows, width], dense.
inline void float_rows(const char* fn, const char* name, const at::Tensor& t) {
  dense(fn, name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat && t.dim() == 2, fn, ": ", name,
                   " must be a 2-d float32 tensor [rows, width], got ", dtype_name(t.scalar_type()),
                   " ", t.sizes());
}

// A 1-d uint8 tensor (a packed stream or a message segment), dense.
inline void byte_stream(const char* fn, const char* name, const at::Tensor& t) {
  dense(fn, name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte && t.dim() == 1, fn, ": ", name,
                   " must be a 1-d uint8 tensor, got ", dtype_name(t.scalar_type()), " ",
                   t.sizes());
}

// (packed, zero, range) of rows x width values as quantize_rows returns them; returns rows
// (= zero.numel()). packed may be longer than the values need.
inline int64_t quantized_rows(const char* fn, const at::Tensor& packed, const at::Tensor& zero,
                              const at::Tensor& range, int64_t bits, int64_t width) {
  pack_bits_in(fn, bits);
  byte_stream(fn, "packed", packed);
  dense(fn, "zero", zero);
  dense(fn, "range", range);
  TORCH_CHECK_TYPE(zero.scalar_type() == at::kBFloat16 && range.scalar_type() == at::kBFloat16 &&
                       zero.dim() == 1 && zero.sizes() == range.sizes(),
                   fn, ": zero and range must be bfloat16 tensors of one shape [rows], got ",
                   dtype_name(zero.scalar_type()), " ", zero.sizes(), " and ",
                   dtype_name(range.scalar_type()), " ", range.sizes());
  same_device(fn, "zero", zero, "packed", packed.device());
  same_device(fn, "range", range, "packed", packed.device());
  TORCH_CHECK_VALUE(width >= 0, fn, ": width must be >= 0, got ", width);
  const int64_t rows = zero.numel();
  rows_times(fn, rows, width, "width");
  const int64_t n = rows * width;
  TORCH_CHECK_VALUE(packed.numel() >= packed_bytes(n, bits), fn, ": packed has ", packed.numel(),
                    " bytes, ", n, " values of ", bits, " bits need ", packed_bytes(n, bits));
  return rows;
}

// The [d, k] Rademacher matrix of a projection, its counters offset .. offset + d * k - 1.
inline void projection(const char* fn, int64_t d, int64_t k, int64_t offset) {
  TORCH_CHECK_VALUE(d >= 0 && k >= 1, fn, ": need d >= 0 and k >= 1, got d=", d, ", k=", k);
  TORCH_CHECK_VALUE(d <= (int64_t{1} << 40) / k, fn, ": the projection matrix is too large: d=",
                    d, ", k=", k);
  counter_range(fn, d * k, offset);
}

// Bytes of a message segment of rows quantized rows: packed values, bf16 zeros, bf16 ranges.
inline int64_t segment_bytes(int64_t rows, int64_t width, int64_t bits) {
  return rows == 0 ? 0 : packed_bytes(rows * width, bits) + 4 * rows;
}

// A contiguous 1-d uint8 segment of exactly `expected` bytes.
inline void segment(const char* fn, const at::Tensor& t, int64_t expected) {
  dense(fn, "the segment", t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte && t.dim() == 1, fn,
                   ": the segment must be a 1-d uint8 tensor, got ", dtype_name(t.scalar_type()),
                   " ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), fn, ": the segment must be a contiguous tensor");
  TORCH_CHECK_VALUE(t.numel() == expected, fn, ": the segment has ", t.numel(),
                    " bytes, its rows need ", expected);
}

// A 1-d int64 row index (the row codecs' gathers and scatters).
inline void row_index(const char* fn, const at::Tensor& t) {
  dense(fn, "index", t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong && t.dim() == 1, fn,
                   ": index must be a 1-d int64 tensor, got ", dtype_name(t.scalar_type()), " ",
                   t.sizes());
}

// ---------------------------------------------------------------- segment GEMM (segment_matmul*)

// A dense 2-d floating-point operand: float32, float64, float16 or bfloat16.
inline void float_matrix(const char* fn, const char* name, const at::Tensor& t) {
  dense(fn, name, t);
  const at::ScalarType s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16,
                   fn, ": ", name, " must be float32, float64, float16 or bfloat16, got ",
                   dtype_name(s));
  TORCH_CHECK_VALUE(t.dim() == 2, fn, ": ", name, " must be 2-d, got shape ", t.sizes());
}

// t has the dtype of `first` (named `first_name`).
inline void same_dtype(const char* fn, const char* name, const at::Tensor& t,
                       const char* first_name, const at::Tensor& first) {
  TORCH_CHECK_TYPE(t.scalar_type() == first.scalar_type(), fn, ": ", name, " must be ",
                   dtype_name(first.scalar_type()), " (the dtype of ", first_name, "), got ",
                   dtype_name(t.scalar_type()));
}

// Segment offsets: a dense 1-d int64 tensor of R + 1 >= 1 elements, on the CPU whatever
// the operands' device (the host loop reads them without waiting for a GPU, as DGL's
// seglen). Returns R. Their values (0 first, non-decreasing, N last) are the kernels'
// to check (common/segment_matmul.h), which read them.
inline int64_t segment_offsets(const char* fn, const at::Tensor& offsets) {
  dense(fn, "offsets", offsets);
  dtype(fn, "offsets", offsets, at::kLong);
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.numel() >= 1, fn,
                    ": offsets must be 1-d with R + 1 >= 1 elements, got shape ",
                    offsets.sizes());
  TORCH_CHECK_VALUE(offsets.device().is_cpu(), fn,
                    ": offsets must be on the CPU (read by the host loop without a device "
                    "sync), got ",
                    offsets.device());
  return offsets.numel() - 1;
}

// ---------------------------------------------------------------- SpMM (qspmm, qspmm4)

// The SpMM's operands other than its rows q (checked by the caller between the indices and
// these): indptr and indices first, then what needs the rows' heads.
inline void spmm_indices(const char* fn, const at::Tensor& indptr, const at::Tensor& indices) {
  index(fn, "indptr", indptr);
  index(fn, "indices", indices);
  same_device(fn, "indices", indices, "indptr", indptr.device());
}

inline void spmm_weights(const char* fn, const at::Tensor& indptr, const at::Tensor& indices,
                         int64_t heads, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& eids) {
  const at::Device device = indptr.device();
  TORCH_CHECK_VALUE(indptr.numel() >= 1, fn, ": indptr needs at least one entry (rows + 1)");
  const int64_t nnz = indices.numel();
  const bool has_eids = eids.has_value() && eids->defined();
  if (has_eids) {
    index(fn, "eids", *eids);
    same_device(fn, "eids", *eids, "indptr", device);
    TORCH_CHECK_VALUE(eids->numel() == nnz, fn, ": eids has ", eids->numel(), " entries, indices ",
                      nnz);
  }
  if (weight.has_value() && weight->defined()) {
    const at::Tensor& w = *weight;
    dense(fn, "weight", w);
    same_device(fn, "weight", w, "indptr", device);
    TORCH_CHECK_TYPE(!at::isComplexType(w.scalar_type()) && w.scalar_type() != at::kBool, fn,
                     ": weight must be a real (float32) tensor, got ",
                     dtype_name(w.scalar_type()));
    const int64_t per_edge = w.dim() >= 2 ? w.size(1) : 1;
    const bool shape_ok = (w.dim() == 1 || w.dim() == 2 || (w.dim() == 3 && w.size(2) == 1)) &&
                          (per_edge == 1 || per_edge == heads);
    TORCH_CHECK_VALUE(shape_ok, fn, ": weight must have shape [E], [E, 1], [E, ", heads,
                      "] or [E, ", heads, ", 1], got ", w.sizes());
    TORCH_CHECK_VALUE(has_eids || w.size(0) >= nnz, fn, ": weight has ", w.size(0),
                      " rows but there are ", nnz, " entries and no eids");
  }
}

// A row scale (qspmm / qspmm4's row_scale, qsddmm's row_scale_lhs / _rhs): one float32
// scale per row of the operand `of`, [rows] or [rows, 1], or one per row and head,
// [rows, heads], on `device`.
inline void row_scale(const char* fn, const char* name, const char* of, const at::Device& device,
                      int64_t rows, int64_t heads, const std::optional<at::Tensor>& scale) {
  if (!scale.has_value() || !scale->defined()) return;
  const at::Tensor& r = *scale;
  dense(fn, name, r);
  TORCH_CHECK_VALUE(r.device() == device, fn, ": ", name, " is on ", r.device(), " but ", of,
                    " is on ", device);
  dtype(fn, name, r, at::kFloat);
  const bool shape_ok =
      (r.dim() == 1 || (r.dim() == 2 && (r.size(1) == 1 || r.size(1) == heads))) &&
      r.size(0) == rows;
  TORCH_CHECK_VALUE(shape_ok, fn, ": ", name, " must have shape [", rows, "], [", rows, ", 1]",
                    heads > 1 ? " or [" : "", heads > 1 ? std::to_string(rows) : std::string(),
                    heads > 1 ? ", " : "", heads > 1 ? std::to_string(heads) : std::string(),
                    heads > 1 ? "]" : "", " (one per row of ", of, "), got ", r.sizes());
}

// width values packed two per byte take ceil(width / 2) bytes: the last dimension of
// `packed` (pack_int4's layout).
inline void int4_width(const char* fn, const at::Tensor& packed, int64_t width,
                       const char* name = "packed") {
  const int64_t bytes = packed.dim() >= 1 ? packed.size(-1) : 0;
  TORCH_CHECK_VALUE(width >= 0 && (width + 1) / 2 == bytes, fn, ": width must satisfy "
                    "ceil(width / 2) == ", name, ".size(-1) (", bytes, " bytes: width ",
                    bytes > 0 ? 2 * bytes - 1 : 0, " or ", 2 * bytes, "), got ", width);
}

// Rows of 4-bit values packed two per byte (qspmm4, qsddmm4): dense uint8 [N, ceil(width /
// 2)] or [N, H, ceil(width / 2)].
inline void packed_rows(const char* fn, const char* name, const at::Tensor& t) {
  dense(fn, name, t);
  dtype(fn, name, t, at::kByte);
  TORCH_CHECK_VALUE(t.dim() == 2 || t.dim() == 3, fn, ": ", name,
                    " must have shape [N, ceil(width / 2)] or [N, H, ceil(width / 2)], got ",
                    t.sizes());
}

// ---------------------------------------------------------------- SDDMM (qsddmm, qsddmm4)

// The operands of a quantized SDDMM: op one of add / sub / mul / dot; lhs and rhs rows of
// the same trailing shape (int8, or packed for qsddmm4: `packed`), each with a 1-d index,
// as many entries on each side; the optional row scales one a row (or row and head).
inline void sddmm(const char* fn, c10::string_view op, bool packed, const char* lhs_name,
                  const at::Tensor& lhs, const at::Tensor& lhs_index, const char* rhs_name,
                  const at::Tensor& rhs, const at::Tensor& rhs_index,
                  const std::optional<at::Tensor>& row_scale_lhs,
                  const std::optional<at::Tensor>& row_scale_rhs) {
  TORCH_CHECK_VALUE(op == c10::string_view("add") || op == c10::string_view("sub") ||
                        op == c10::string_view("mul") || op == c10::string_view("dot"),
                    fn, ": op must be one of 'add', 'sub', 'mul', 'dot', got '", op, "'");
  const auto rows = packed ? packed_rows : int8_rows;
  rows(fn, lhs_name, lhs);
  const at::Device device = lhs.device();
  rows(fn, rhs_name, rhs);
  same_device(fn, rhs_name, rhs, lhs_name, device);
  index(fn, "lhs_index", lhs_index);
  same_device(fn, "lhs_index", lhs_index, lhs_name, device);
  index(fn, "rhs_index", rhs_index);
  same_device(fn, "rhs_index", rhs_index, lhs_name, device);
  TORCH_CHECK_VALUE(lhs.sizes().slice(1) == rhs.sizes().slice(1), fn, ": ", lhs_name, " and ",
                    rhs_name, " need the same trailing shape, got ", lhs.sizes(), " and ",
                    rhs.sizes());
  TORCH_CHECK_VALUE(lhs_index.numel() == rhs_index.numel(), fn, ": lhs_index has ",
                    lhs_index.numel(), " entries, rhs_index ", rhs_index.numel());
  const int64_t heads = lhs.dim() == 3 ? lhs.size(1) : 1;
  row_scale(fn, "row_scale_lhs", lhs_name, device, lhs.size(0), heads, row_scale_lhs);
  row_scale(fn, "row_scale_rhs", rhs_name, device, rhs.size(0), heads, row_scale_rhs);
}

}  // namespace checks
}  // namespace qtrain
