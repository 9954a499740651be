"""Quantized SpMM and SDDMM on a CSR graph (tango-sc23 sections 3.2-3.3).

The graph is given as CSR over *output rows*: row ``r``'s entries are
``indptr[r] .. indptr[r+1]``, entry ``k`` reads input row ``indices[k]`` and,
when edge weights are given, weight row ``eids[k]`` (DGL's edge id). For the
message passing of a DGL graph, rows are destination nodes and ``indices``
are source nodes (the in-CSR); the backward pass uses the out-CSR.

SpMM (``qspmm``), features quantized once before the random gathers::

    copy (weight None):   out[r] = fl32(float(sum_k q[indices[k]]) * scale)     exact int sum
    weighted:             acc[r] = sum_k fl32(w[eids[k], h] * float(q[indices[k], h, :]))
                          out[r] = fl32(acc[r] * scale)                         float32 sum
    row_scale given:      w[eids[k], h] above is fl32(w[eids[k], h] * row_scale[indices[k], h])
                          (w taken as 1 without weight)

``q`` is int8 ``[N_in, D]`` or ``[N_in, H, D]``; ``weight`` is float32 ``[E]``,
``[E, 1]`` (one weight per edge) or ``[E, H]`` / ``[E, H, 1]`` (one per head:
Fig. 6's per-head split); ``row_scale`` is float32 ``[N_in]``, ``[N_in, 1]`` or
``[N_in, H]``: q quantized with one scale per row (or row and head), applied by the
kernels as they gather the rows. The output has q's trailing shape. The integer sum
is exact, so the copy form is bit-identical across backends; the weighted
form sums floats in CSR order in the compiled kernel and in another order in
the reference, so they agree to float32 rounding.

The incidence-matrix form of edge-to-node aggregation (Fig. 5: GAT's
backward sums edge gradients into nodes) is the copy form with ``q`` the
quantized *edge* tensor and ``indices = eids``: :func:`qspmm_incidence`.

SDDMM (``qsddmm``), for each edge ``e``: ``i = lhs_index[e]``, ``j = rhs_index[e]``::

    add / sub: out[e] = fl32(q_l[i] * s_l) +/- fl32(q_r[j] * s_r)    on-the-fly dequantization
    mul:       out[e] = fl32(float(q_l[i] * q_r[j]) * fl32(s_l * s_r))
    dot:       out[e, h, 0] = fl32(float(sum_d q_l[i,h,d] * q_r[j,h,d]) * fl32(s_l * s_r))

``q_l`` and ``q_r`` have the same trailing shape ``[D]`` or ``[H, D]``; add,
sub and mul give ``[E, *trailing]``, dot gives ``[E, 1]`` or ``[E, H, 1]``.
All SDDMM forms are exact integer or elementwise float32 operations, so every
backend agrees bit for bit.

The compiled backends are the ops ``torch.ops.qtrain.qspmm`` and
``torch.ops.qtrain.qsddmm`` (one call for both devices: the dispatcher routes by
the tensors' device). Their C++ front checks dtypes, shapes and devices without
reading data, and the kernels refuse what only the data shows (a malformed
``indptr``, an index out of range), so the compiled path never waits for the GPU
to validate. The references check the same things themselves and refuse the
same inputs with the same Python exceptions.
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch
from qtrain.ops.gemm import per_tensor
from qtrain.quant import packed as packed_ref

SPMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends implementing qspmm
SDDMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends implementing qsddmm
SDDMM_OPS = ("add", "sub", "mul", "dot")
PACKED_SDDMM_NAMES = ("qsddmm4", "packed_lhs", "packed_rhs")  # the op, its two operands

# ---------------------------------------------------------------- the references' checks
#
# The same checks as the ops' C++ fronts (ext/ops/qspmm.cpp, ext/ops/qsddmm.cpp) and
# kernels, with the same exception types, made only on the reference path: the value
# checks read the data (a host sync on CUDA), which the compiled path leaves to its
# kernels.


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_dense(fn: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{fn}: {name} must be a dense (strided) tensor, got layout {t.layout}")
    return t


def _check_index(fn: str, name: str, t: object) -> None:
    """A dense 1-d int32 or int64 tensor."""
    t = _check_dense(fn, name, t)
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: {name} must be int32 or int64, got {_dtype_name(t.dtype)}")
    if t.dim() != 1:
        raise ValueError(f"{fn}: {name} must be 1-d, got shape {list(t.shape)}")


def _check_q(fn: str, name: str, q: object) -> None:
    """Dense int8 rows [N, D] or [N, H, D]."""
    q = _check_dense(fn, name, q)
    if q.dtype != torch.int8:
        raise TypeError(f"{fn}: {name} must be int8, got {_dtype_name(q.dtype)}")
    if q.dim() not in (2, 3):
        raise ValueError(f"{fn}: {name} must have shape [N, D] or [N, H, D], got {list(q.shape)}")


def _check_device(fn: str, name: str, t: torch.Tensor, first: str, like: torch.Tensor) -> None:
    if t.device != like.device:
        raise ValueError(f"{fn}: {name} is on {t.device} but {first} is on {like.device}")


def _in_range(t: torch.Tensor, n: int) -> bool:
    """Every entry of the index tensor ``t`` is in [0, n) (reads the data)."""
    return t.numel() == 0 or bool(((t >= 0) & (t < n)).all())


def _check_indptr(fn: str, indptr: torch.Tensor, nnz: int) -> None:
    """CSR row pointers: start at 0, never decrease, end at the number of entries."""
    first, last = int(indptr[0]), int(indptr[-1])
    if first != 0:
        raise ValueError(f"{fn}: indptr[0] must be 0, got {first}")
    if last != nnz:
        raise ValueError(f"{fn}: indptr[-1] must equal the number of entries ({nnz}), got {last}")
    if indptr.numel() > 1 and bool((indptr[1:] < indptr[:-1]).any()):
        raise ValueError(f"{fn}: indptr must be non-decreasing")


def _check_weight(
    fn: str, weight: object, heads: int, nnz: int, has_eids: bool, like: torch.Tensor
) -> None:
    w = _check_dense(fn, "weight", weight)
    _check_device(fn, "weight", w, "indptr", like)
    if w.is_complex() or w.dtype == torch.bool:
        raise TypeError(f"{fn}: weight must be a real (float32) tensor, got {_dtype_name(w.dtype)}")
    per_edge = w.shape[1] if w.dim() >= 2 else 1
    shape_ok = w.dim() in (1, 2) or (w.dim() == 3 and w.shape[2] == 1)
    if not shape_ok or per_edge not in (1, heads):
        raise ValueError(
            f"{fn}: weight must have shape [E], [E, 1], [E, {heads}] or [E, {heads}, 1], "
            f"got {list(w.shape)}"
        )
    if not has_eids and w.shape[0] < nnz:
        raise ValueError(
            f"{fn}: weight has {w.shape[0]} rows but there are {nnz} entries and no eids"
        )


def _check_row_scale(fn: str, name: str, row_scale: object, of: str, q: torch.Tensor) -> None:
    """One float32 scale per row of q (the operand named ``of``), ``[N]`` or ``[N, 1]``, or
    per row and head, ``[N, H]``, on q's device (the ops' ``checks::row_scale``)."""
    r = _check_dense(fn, name, row_scale)
    _check_device(fn, name, r, of, q)
    if r.dtype != torch.float32:
        raise TypeError(f"{fn}: {name} must be float32, got {_dtype_name(r.dtype)}")
    rows, heads = q.shape[0], q.shape[1] if q.dim() == 3 else 1
    shape_ok = (r.dim() == 1 or (r.dim() == 2 and r.shape[1] in (1, heads))) and (
        r.shape[0] == rows
    )
    if not shape_ok:
        per_head = f" or [{rows}, {heads}]" if heads > 1 else ""
        raise ValueError(
            f"{fn}: {name} must have shape [{rows}], [{rows}, 1]{per_head} (one per row of "
            f"{of}), got {list(r.shape)}"
        )


def _check_packed(fn: str, packed: object, width: object, name: str = "packed") -> None:
    """Dense uint8 rows [N, ceil(width / 2)] or [N, H, ceil(width / 2)] (pack_int4's layout)."""
    packed = _check_dense(fn, name, packed)
    if packed.dtype != torch.uint8:
        raise TypeError(f"{fn}: {name} must be uint8, got {_dtype_name(packed.dtype)}")
    if packed.dim() not in (2, 3):
        raise ValueError(
            f"{fn}: {name} must have shape [N, ceil(width / 2)] or [N, H, ceil(width / 2)], "
            f"got {list(packed.shape)}"
        )


def _check_qspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
    width: int | None = None,
    row_scale: torch.Tensor | None = None,
) -> None:
    """What ``torch.ops.qtrain.qspmm`` refuses (front and kernels), refused the same way;
    with ``width``, what ``qspmm4`` refuses (q: packed rows of ``width`` 4-bit values)."""
    fn, name = ("qspmm", "q") if width is None else ("qspmm4", "packed")
    _check_index(fn, "indptr", indptr)
    _check_index(fn, "indices", indices)
    _check_device(fn, "indices", indices, "indptr", indptr)
    if width is None:
        _check_q(fn, "q", q)
    else:
        _check_packed(fn, q, width)
    _check_device(fn, name, q, "indptr", indptr)
    if width is not None:
        packed_ref.check_int4_width(fn, q, width)
    if indptr.numel() < 1:
        raise ValueError(f"{fn}: indptr needs at least one entry (rows + 1)")
    nnz = indices.numel()
    if eids is not None:
        _check_index(fn, "eids", eids)
        _check_device(fn, "eids", eids, "indptr", indptr)
        if eids.numel() != nnz:
            raise ValueError(f"{fn}: eids has {eids.numel()} entries, indices {nnz}")
    heads = q.shape[1] if q.dim() == 3 else 1
    if weight is not None:
        _check_weight(fn, weight, heads, nnz, eids is not None, indptr)
    if row_scale is not None:
        _check_row_scale(fn, "row_scale", row_scale, name, q)
    _check_indptr(fn, indptr, nnz)
    bad_eids = weight is not None and eids is not None and not _in_range(eids, weight.shape[0])
    if not _in_range(indices, q.shape[0]) or bad_eids:
        where = f" or of eids outside [0, {weight.shape[0]}) (rows of weight)" if bad_eids else ""
        raise ValueError(
            f"{fn}: an entry of indices is outside [0, {q.shape[0]}) (rows of {name}){where}"
        )


def _check_qsddmm(
    op: str,
    q_lhs: torch.Tensor,
    lhs_index: torch.Tensor,
    q_rhs: torch.Tensor,
    rhs_index: torch.Tensor,
    row_scale_lhs: torch.Tensor | None = None,
    row_scale_rhs: torch.Tensor | None = None,
    width: int | None = None,
) -> None:
    """What ``torch.ops.qtrain.qsddmm`` refuses (front and kernels), refused the same way;
    with ``width``, what ``qsddmm4`` refuses (packed rows of ``width`` 4-bit values)."""
    fn, lhs, rhs = ("qsddmm", "q_lhs", "q_rhs") if width is None else PACKED_SDDMM_NAMES
    if op not in SDDMM_OPS:
        raise ValueError(f"{fn}: op must be one of {', '.join(map(repr, SDDMM_OPS))}, got {op!r}")
    for name, t in ((lhs, q_lhs), (rhs, q_rhs)):
        if width is None:
            _check_q(fn, name, t)
        else:
            _check_packed(fn, t, width, name)
    _check_device(fn, rhs, q_rhs, lhs, q_lhs)
    _check_index(fn, "lhs_index", lhs_index)
    _check_device(fn, "lhs_index", lhs_index, lhs, q_lhs)
    _check_index(fn, "rhs_index", rhs_index)
    _check_device(fn, "rhs_index", rhs_index, lhs, q_lhs)
    if q_lhs.shape[1:] != q_rhs.shape[1:]:
        raise ValueError(
            f"{fn}: {lhs} and {rhs} need the same trailing shape, got {list(q_lhs.shape)} "
            f"and {list(q_rhs.shape)}"
        )
    if lhs_index.numel() != rhs_index.numel():
        raise ValueError(
            f"{fn}: lhs_index has {lhs_index.numel()} entries, rhs_index {rhs_index.numel()}"
        )
    if row_scale_lhs is not None:
        _check_row_scale(fn, "row_scale_lhs", row_scale_lhs, lhs, q_lhs)
    if row_scale_rhs is not None:
        _check_row_scale(fn, "row_scale_rhs", row_scale_rhs, rhs, q_rhs)
    if width is not None:
        packed_ref.check_int4_width(fn, q_lhs, width, lhs)
    if not (_in_range(lhs_index, q_lhs.shape[0]) and _in_range(rhs_index, q_rhs.shape[0])):
        raise ValueError(
            f"{fn}: an entry of lhs_index is outside [0, {q_lhs.shape[0]}) (rows of {lhs}) "
            f"or of rhs_index outside [0, {q_rhs.shape[0]}) (rows of {rhs})"
        )


# ---------------------------------------------------------------- SpMM


def _heads_weight(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """weight (a checked shape) as float32 [E, H] (a per-edge scalar is broadcast to every head)."""
    w = weight.to(torch.float32)
    if w.dim() == 3:
        w = w[:, :, 0]
    if w.dim() == 1:
        w = w[:, None]
    return w.expand(w.shape[0], heads) if w.shape[1] != heads else w


def reference_qspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor | float,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition of the op ``qspmm`` (it checks its arguments as the op
    does)."""
    _check_qspmm(indptr, indices, q, weight, eids, row_scale=row_scale)
    rows = indptr.numel() - 1
    q3 = q if q.dim() == 3 else q[:, None, :]
    heads, width = q3.shape[1], q3.shape[2]
    counts = (indptr[1:] - indptr[:-1]).to(torch.int64)
    row_of = torch.repeat_interleave(torch.arange(rows, device=q.device), counts)
    gathered = q3[indices.to(torch.int64)]
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=q.device).reshape(())
    if weight is None and row_scale is None:
        acc = torch.zeros((rows, heads, width), dtype=torch.int64, device=q.device)
        acc.index_add_(0, row_of, gathered.to(torch.int64))
        out = acc.to(torch.float32) * scale_t
    else:
        if weight is None:
            entry_w = torch.ones((indices.numel(), heads), device=q.device)
        else:
            e = (
                eids.to(torch.int64)
                if eids is not None
                else torch.arange(indices.numel(), device=q.device)
            )
            entry_w = _heads_weight(weight, heads)[e]
        if row_scale is not None:
            entry_w = entry_w * _heads_weight(row_scale, heads)[indices.to(torch.int64)]
        contrib = entry_w[:, :, None] * gathered.to(torch.float32)
        acc = torch.zeros((rows, heads, width), dtype=torch.float32, device=q.device)
        acc.index_add_(0, row_of, contrib)
        out = acc * scale_t
    return out if q.dim() == 3 else out[:, 0, :]


def row_scales(fn: str, name: str, scale: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One scale per row of q as float32 ``[N, k]``: ``[N]``, ``[N, 1]`` or ``[N, 1, 1]``
    (one a node: k = 1), or for q ``[N, H, D]`` also ``[N, H]`` / ``[N, H, 1]`` (one a node
    and head, what ``quantize_per_row`` gives a 3-d tensor: k = H); ValueError /
    TypeError naming the problem otherwise."""
    t = _check_dense(fn, name, scale)
    if t.dtype != torch.float32:
        raise TypeError(f"{fn}: {name} must be float32, got {_dtype_name(t.dtype)}")
    is_tensor = isinstance(q, torch.Tensor)
    rows = q.shape[0] if is_tensor and q.dim() >= 1 else -1
    heads = q.shape[1] if is_tensor and q.dim() == 3 else 1
    per_head = t.dim() in (2, 3) and t.shape[1] == heads and all(d == 1 for d in t.shape[2:])
    per_node = all(d == 1 for d in t.shape[1:])
    if t.dim() == 0 or t.shape[0] != rows or not (per_node or per_head):
        per_head_shapes = f", [{rows}, {heads}] or [{rows}, {heads}, 1]" if heads > 1 else ""
        raise ValueError(
            f"{fn}: {name} must be one value, one per row of the quantized tensor ([{rows}], "
            f"[{rows}, 1]{per_head_shapes}), got shape {list(t.shape)}"
        )
    _check_device(fn, name, t, "q", q)
    return t.reshape(rows, heads if per_head and not per_node else 1)


def reference_qspmm4(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    packed: torch.Tensor,
    width: int,
    scale: torch.Tensor | float,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition of the op ``qspmm4``: :func:`reference_qspmm` of the
    unpacked rows (it checks its arguments as the op does)."""
    _check_qspmm(indptr, indices, packed, weight, eids, width=width, row_scale=row_scale)
    q = packed_ref.unpack_int4(packed, width)
    return reference_qspmm(indptr, indices, q, scale, weight, eids, row_scale)


def _split_scale(
    fn: str, scale: torch.Tensor | float, rows: torch.Tensor, name: str = "scale"
) -> tuple[float, torch.Tensor | None]:
    """(the op's scale, its row scales): one scale as it is; one per row of the operand
    (``rows``: q, or the packed rows) as a scale of 1 and float32 ``[N, k]`` row scales,
    which the kernels read per entry as they gather (no E-sized tensor is made)."""
    if per_tensor(scale):
        return float(scale), None
    return 1.0, row_scales(fn, name, scale, rows).contiguous()


def qspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor | float,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Sum (optionally edge-weighted) of quantized input rows into each output row; see module doc.

    ``scale`` is one scale for all of q, or one per row of q (``[N_in]``, ``[N_in, 1]``...;
    for q ``[N_in, H, D]`` also one per node and head, ``[N_in, H, 1]``, as
    ``qtrain.ops.quantize.quantize_per_row`` gives): the scale then varies along the
    sum, which becomes the weighted form with entry k's weight ``s[indices[k]]`` (times
    its edge weight, ``fl32(w[eids[k]] * s[indices[k]])``; per head where either is) and
    an output scale of 1: the op's ``row_scale``, read by the kernels as they gather.
    """
    op_scale, row_scale = _split_scale("qspmm", scale, q)
    chosen = dispatch.resolve("spmm", q, backend, kernels=SPMM_KERNELS)
    with dispatch.call("spmm", chosen):
        if chosen == "reference":
            return reference_qspmm(indptr, indices, q, op_scale, weight, eids, row_scale)
        return torch.ops.qtrain.qspmm(indptr, indices, q, op_scale, weight, eids, row_scale)


def qspmm_packed(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    packed: torch.Tensor,
    width: int,
    scale: torch.Tensor | float,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """:func:`qspmm` of rows of ``width`` 4-bit values packed two per byte (uint8 ``[N,
    ceil(width / 2)]`` or ``[N, H, ceil(width / 2)]``, ``qtrain.ops.packed.pack_int4``'s
    layout), bit for bit ``qspmm(indptr, indices, unpack_int4(packed, width), scale,
    weight, eids)``; the kernels gather the packed rows (half the bytes). ``scale`` as in
    :func:`qspmm` (one, or one per row). Counted as the primitive "spmm", like
    :func:`qspmm`: it is the same SpMM, so per-primitive counts and profiles stay whole.
    """
    op_scale, row_scale = _split_scale("qspmm4", scale, packed)
    chosen = dispatch.resolve("spmm", packed, backend, kernels=SPMM_KERNELS)
    with dispatch.call("spmm", chosen):
        if chosen == "reference":
            return reference_qspmm4(
                indptr, indices, packed, width, op_scale, weight, eids, row_scale
            )
        return torch.ops.qtrain.qspmm4(
            indptr, indices, packed, width, op_scale, weight, eids, row_scale
        )


def qspmm_incidence(
    indptr: torch.Tensor,
    eids: torch.Tensor,
    q_edges: torch.Tensor,
    scale: torch.Tensor | float,
    backend: str = "auto",
) -> torch.Tensor:
    """Edge-to-node sum as an incidence-matrix SpMM (Fig. 5): out[r] = sum of q_edges[eids[k]]."""
    return qspmm(indptr, eids, q_edges, scale, backend=backend)


# ---------------------------------------------------------------- SDDMM


def reference_qsddmm(
    op: str,
    q_lhs: torch.Tensor,
    scale_lhs: torch.Tensor | float,
    lhs_index: torch.Tensor,
    q_rhs: torch.Tensor,
    scale_rhs: torch.Tensor | float,
    rhs_index: torch.Tensor,
    row_scale_lhs: torch.Tensor | None = None,
    row_scale_rhs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition of the op ``qsddmm`` (it checks its arguments as the op
    does)."""
    _check_qsddmm(op, q_lhs, lhs_index, q_rhs, rhs_index, row_scale_lhs, row_scale_rhs)
    a = q_lhs[lhs_index.to(torch.int64)]
    b = q_rhs[rhs_index.to(torch.int64)]
    sl = _side_scales(scale_lhs, row_scale_lhs, lhs_index, a)
    sr = _side_scales(scale_rhs, row_scale_rhs, rhs_index, b)
    if op in ("add", "sub"):
        da = a.to(torch.float32) * sl
        db = b.to(torch.float32) * sr
        return da + db if op == "add" else da - db
    both = sl * sr  # fl32(s_l * s_r): one, or one per edge (and head)
    prod = a.to(torch.int32) * b.to(torch.int32)
    if op == "mul":
        return prod.to(torch.float32) * both
    return prod.sum(dim=-1, keepdim=True).to(torch.float32) * both


def reference_qsddmm4(
    op: str,
    packed_lhs: torch.Tensor,
    scale_lhs: torch.Tensor | float,
    lhs_index: torch.Tensor,
    packed_rhs: torch.Tensor,
    scale_rhs: torch.Tensor | float,
    rhs_index: torch.Tensor,
    width: int,
    row_scale_lhs: torch.Tensor | None = None,
    row_scale_rhs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition of the op ``qsddmm4``: :func:`reference_qsddmm` of the
    unpacked rows (it checks its arguments as the op does)."""
    _check_qsddmm(
        op, packed_lhs, lhs_index, packed_rhs, rhs_index, row_scale_lhs, row_scale_rhs, width
    )
    q_lhs = packed_ref.unpack_int4(packed_lhs, width)
    q_rhs = packed_ref.unpack_int4(packed_rhs, width)
    args = (op, q_lhs, scale_lhs, lhs_index, q_rhs, scale_rhs, rhs_index)
    return reference_qsddmm(*args, row_scale_lhs, row_scale_rhs)


def _side_scales(
    scale: torch.Tensor | float,
    row_scale: torch.Tensor | None,
    index: torch.Tensor,
    gathered: torch.Tensor,
) -> torch.Tensor:
    """One side's scale: 0-d, or with row scales fl32(scale * row_scale[index]) per edge
    (and head), shaped to broadcast over the gathered rows ``[E, D]`` / ``[E, H, D]``."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=gathered.device).reshape(())
    if row_scale is None:
        return s
    heads = gathered.shape[1] if gathered.dim() == 3 else 1
    per_edge = s * _heads_weight(row_scale, heads)[index.to(torch.int64)]  # [E, H]
    return per_edge[:, :, None] if gathered.dim() == 3 else per_edge


def qsddmm(
    op: str,
    q_lhs: torch.Tensor,
    scale_lhs: torch.Tensor | float,
    lhs_index: torch.Tensor,
    q_rhs: torch.Tensor,
    scale_rhs: torch.Tensor | float,
    rhs_index: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Per-edge op on a gathered pair of quantized rows; see the module docstring.

    A scale may be one per row of its tensor (as in :func:`qspmm`; per node and head for
    ``[N, H, D]`` rows): each edge then takes its rows' scales, ``s_l[i]`` and ``s_r[j]``
    (per head where either is), in the same formulas (mul and dot: the integer result
    times ``fl32(s_l[i] * s_r[j])``; add and sub: ``fl32(q_l[i] * s_l[i]) +/- fl32(q_r[j] *
    s_r[j])``): the op's ``row_scale_lhs`` / ``row_scale_rhs``, read by the kernels per
    edge and head."""
    op_scale_lhs, row_scale_lhs = _split_scale("qsddmm", scale_lhs, q_lhs, "scale_lhs")
    op_scale_rhs, row_scale_rhs = _split_scale("qsddmm", scale_rhs, q_rhs, "scale_rhs")
    args = (op, q_lhs, op_scale_lhs, lhs_index, q_rhs, op_scale_rhs, rhs_index)
    chosen = dispatch.resolve("sddmm", q_lhs, backend, kernels=SDDMM_KERNELS)
    with dispatch.call("sddmm", chosen):
        if chosen == "reference":
            return reference_qsddmm(*args, row_scale_lhs, row_scale_rhs)
        return torch.ops.qtrain.qsddmm(*args, row_scale_lhs, row_scale_rhs)


def qsddmm_packed(
    op: str,
    packed_lhs: torch.Tensor,
    scale_lhs: torch.Tensor | float,
    lhs_index: torch.Tensor,
    packed_rhs: torch.Tensor,
    scale_rhs: torch.Tensor | float,
    rhs_index: torch.Tensor,
    width: int,
    backend: str = "auto",
) -> torch.Tensor:
    """:func:`qsddmm` of rows of ``width`` 4-bit values packed two per byte (uint8 ``[N,
    ceil(width / 2)]`` or ``[N, H, ceil(width / 2)]`` on both sides,
    ``qtrain.ops.packed.pack_int4``'s layout), bit for bit ``qsddmm(op,
    unpack_int4(packed_lhs, width), scale_lhs, lhs_index, unpack_int4(packed_rhs, width),
    ...)``: the kernels read the nibbles as they gather, so no unpacked copy is made.
    Scales as in :func:`qsddmm`. Counted as the primitive "sddmm", like :func:`qsddmm`."""
    fn = PACKED_SDDMM_NAMES[0]
    op_scale_lhs, row_scale_lhs = _split_scale(fn, scale_lhs, packed_lhs, "scale_lhs")
    op_scale_rhs, row_scale_rhs = _split_scale(fn, scale_rhs, packed_rhs, "scale_rhs")
    args = (op, packed_lhs, op_scale_lhs, lhs_index, packed_rhs, op_scale_rhs, rhs_index, width)
    chosen = dispatch.resolve("sddmm", packed_lhs, backend, kernels=SDDMM_KERNELS)
    with dispatch.call("sddmm", chosen):
        if chosen == "reference":
            return reference_qsddmm4(*args, row_scale_lhs, row_scale_rhs)
        return torch.ops.qtrain.qsddmm4(*args, row_scale_lhs, row_scale_rhs)
