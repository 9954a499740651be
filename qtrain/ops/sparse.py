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

``q`` is int8 ``[N_in, D]`` or ``[N_in, H, D]``; ``weight`` is float32 ``[E]``,
``[E, 1]`` (one weight per edge) or ``[E, H]`` / ``[E, H, 1]`` (one per head:
Fig. 6's per-head split). The output has q's trailing shape. The integer sum
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
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch
from qtrain.ops.gemm import combined_scale

SPMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends implementing qspmm
SDDMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends implementing qsddmm
SDDMM_OPS = ("add", "sub", "mul", "dot")


def _check_index(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise TypeError(
            f"{name} must be a 1-d int32 or int64 tensor, got {getattr(t, 'dtype', t)!r}"
        )


def _check_indptr(indptr: torch.Tensor, nnz: int) -> None:
    """CSR row pointers: start at 0, never decrease, end at the number of entries."""
    first, last = int(indptr[0]), int(indptr[-1])
    if first != 0 or last != nnz:
        raise ValueError(
            f"indptr must start at 0 and end at the number of entries ({nnz}), "
            f"got indptr[0]={first}, indptr[-1]={last}"
        )
    if indptr.numel() > 1 and bool((indptr[1:] < indptr[:-1]).any()):
        raise ValueError("indptr must be non-decreasing")


def _check_q(name: str, q: torch.Tensor) -> None:
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or q.dim() not in (2, 3):
        raise TypeError(
            f"{name} must be an int8 tensor of shape [N, D] or [N, H, D], got "
            f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}"
        )


def _heads_weight(weight: torch.Tensor, heads: int, nnz_rows: int) -> torch.Tensor:
    """weight as float32 [E, H] (a per-edge scalar is broadcast to every head)."""
    w = weight.to(torch.float32)
    if w.dim() == 3 and w.shape[2] == 1:
        w = w[:, :, 0]
    if w.dim() == 1:
        w = w[:, None]
    if w.dim() != 2 or w.shape[1] not in (1, heads):
        raise ValueError(
            f"weight must have shape [E], [E, 1], [E, {heads}] or [E, {heads}, 1], "
            f"got {tuple(weight.shape)}"
        )
    return w.expand(w.shape[0], heads) if w.shape[1] != heads else w


def reference_qspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor | float,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition of :func:`qspmm`."""
    rows = indptr.numel() - 1
    q3 = q if q.dim() == 3 else q[:, None, :]
    heads, width = q3.shape[1], q3.shape[2]
    counts = (indptr[1:] - indptr[:-1]).to(torch.int64)
    row_of = torch.repeat_interleave(torch.arange(rows, device=q.device), counts)
    gathered = q3[indices.to(torch.int64)]
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=q.device).reshape(())
    if weight is None:
        acc = torch.zeros((rows, heads, width), dtype=torch.int64, device=q.device)
        acc.index_add_(0, row_of, gathered.to(torch.int64))
        out = acc.to(torch.float32) * scale_t
    else:
        w = _heads_weight(weight, heads, indices.numel())
        e = eids.to(torch.int64) if eids is not None else torch.arange(indices.numel())
        contrib = w[e][:, :, None] * gathered.to(torch.float32)
        acc = torch.zeros((rows, heads, width), dtype=torch.float32, device=q.device)
        acc.index_add_(0, row_of, contrib)
        out = acc * scale_t
    return out if q.dim() == 3 else out[:, 0, :]


def qspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor | float,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Sum (optionally edge-weighted) of quantized input rows into each output row; see module doc."""
    _check_index("indptr", indptr)
    _check_index("indices", indices)
    _check_q("q", q)
    if eids is not None:
        _check_index("eids", eids)
        if eids.numel() != indices.numel():
            raise ValueError(f"eids has {eids.numel()} entries, indices {indices.numel()}")
    if indptr.numel() < 1:
        raise ValueError("indptr needs at least one entry (rows + 1)")
    _check_indptr(indptr, indices.numel())
    if weight is not None:
        _heads_weight(weight, q.shape[1] if q.dim() == 3 else 1, indices.numel())
    chosen = dispatch.resolve("spmm", q, backend, kernels=SPMM_KERNELS)
    with dispatch.call("spmm", chosen):
        if chosen == "ext-cpu":
            from qtrain import backends

            out = backends.ext_cpu().qspmm(indptr, indices, q, float(scale), weight, eids)
        elif chosen == "ext-cuda":
            from qtrain import backends

            out = backends.ext_cuda().qspmm(indptr, indices, q, float(scale), weight, eids)
        else:
            out = reference_qspmm(indptr, indices, q, scale, weight, eids)
    return out


def qspmm_incidence(
    indptr: torch.Tensor,
    eids: torch.Tensor,
    q_edges: torch.Tensor,
    scale: torch.Tensor | float,
    backend: str = "auto",
) -> torch.Tensor:
    """Edge-to-node sum as an incidence-matrix SpMM (Fig. 5): out[r] = sum of q_edges[eids[k]]."""
    return qspmm(indptr, eids, q_edges, scale, backend=backend)


def reference_qsddmm(
    op: str,
    q_lhs: torch.Tensor,
    scale_lhs: torch.Tensor | float,
    lhs_index: torch.Tensor,
    q_rhs: torch.Tensor,
    scale_rhs: torch.Tensor | float,
    rhs_index: torch.Tensor,
) -> torch.Tensor:
    """The pure-PyTorch definition of :func:`qsddmm`."""
    a = q_lhs[lhs_index.to(torch.int64)]
    b = q_rhs[rhs_index.to(torch.int64)]
    sl = torch.as_tensor(scale_lhs, dtype=torch.float32).reshape(())
    sr = torch.as_tensor(scale_rhs, dtype=torch.float32).reshape(())
    if op in ("add", "sub"):
        da = a.to(torch.float32) * sl
        db = b.to(torch.float32) * sr
        return da + db if op == "add" else da - db
    both = torch.tensor(combined_scale(sl, sr), dtype=torch.float32)
    prod = a.to(torch.int32) * b.to(torch.int32)
    if op == "mul":
        return prod.to(torch.float32) * both
    return prod.sum(dim=-1, keepdim=True).to(torch.float32) * both


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
    """Per-edge op on a gathered pair of quantized rows; see the module docstring."""
    if op not in SDDMM_OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, SDDMM_OPS))}, got {op!r}")
    _check_q("q_lhs", q_lhs)
    _check_q("q_rhs", q_rhs)
    _check_index("lhs_index", lhs_index)
    _check_index("rhs_index", rhs_index)
    if q_lhs.shape[1:] != q_rhs.shape[1:]:
        raise ValueError(
            f"q_lhs and q_rhs need the same trailing shape, got {tuple(q_lhs.shape[1:])} "
            f"and {tuple(q_rhs.shape[1:])}"
        )
    if lhs_index.numel() != rhs_index.numel():
        raise ValueError(
            f"lhs_index has {lhs_index.numel()} entries, rhs_index {rhs_index.numel()}"
        )
    chosen = dispatch.resolve("sddmm", q_lhs, backend, kernels=SDDMM_KERNELS)
    with dispatch.call("sddmm", chosen):
        if chosen == "ext-cpu":
            from qtrain import backends

            out = backends.ext_cpu().qsddmm(
                op, q_lhs, float(scale_lhs), lhs_index, q_rhs, float(scale_rhs), rhs_index
            )
        elif chosen == "ext-cuda":
            from qtrain import backends

            out = backends.ext_cuda().qsddmm(
                op, q_lhs, float(scale_lhs), lhs_index, q_rhs, float(scale_rhs), rhs_index
            )
        else:
            out = reference_qsddmm(op, q_lhs, scale_lhs, lhs_index, q_rhs, scale_rhs, rhs_index)
    return out
