"""Quantized SpMM / SDDMM: the ext-cpu kernels against the pure-PyTorch reference.

Copy SpMM and every SDDMM form are exact (integer sums, elementwise float32),
so ext == reference bit for bit; weighted SpMM sums floats in another order,
so it agrees to float32 rounding, with the tolerance scaled by the sum of the
absolute terms. Every ISA variant this CPU runs and 1 / 2 threads are checked.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import ext_or_skip

from qtrain.ops import dispatch
from qtrain.ops.quantize import quantize
from qtrain.ops.sparse import (
    SDDMM_OPS,
    qsddmm,
    qspmm,
    qspmm_incidence,
    reference_qsddmm,
    reference_qspmm,
)

WIDTHS = (1, 3, 5, 17, 33, 64, 127, 129)
INDEX_DTYPES = (torch.int32, torch.int64)
EPS32 = 2.0**-23


def _csr(
    rows: int, n_in: int, avg: int, kind: str, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random CSR (indptr, indices): uniform or power-law degrees, with zero-degree rows."""
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        deg = torch.randint(0, 2 * avg + 1, (rows,), generator=g)
    else:  # power law: most rows short, a few hubs, about a third empty
        u = torch.rand(rows, generator=g)
        deg = (avg * 0.4 * (u.clamp(min=1e-3) ** -1.2 - 1)).long().clamp(max=50 * avg)
    indptr = torch.zeros(rows + 1, dtype=torch.int64)
    indptr[1:] = deg.cumsum(0)
    indices = torch.randint(0, max(n_in, 1), (int(indptr[-1]),), generator=g)
    return indptr.to(dtype), indices.to(dtype)


def _quantized(shape: tuple[int, ...], bits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return quantize(x, bits, backend="reference")


def _q_shape(n: int, heads: int, width: int) -> tuple[int, ...]:
    return (n, width) if heads == 1 else (n, heads, width)


def _weighted_check(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor,
    eids: torch.Tensor | None,
) -> Callable[[torch.Tensor], None]:
    """A checker of ext output for the float-summed form: |diff| <= 2 (deg + 1) eps sum|terms|."""
    ref = reference_qspmm(indptr, indices, q, scale, weight, eids)
    terms = reference_qspmm(indptr, indices, q.abs(), scale, weight.abs(), eids)
    deg = (indptr[1:] - indptr[:-1]).to(torch.float32)
    deg = deg.reshape((-1,) + (1,) * (q.dim() - 1))
    tol = 2 * (deg + 1) * EPS32 * terms + 1e-30

    def check(out: torch.Tensor) -> None:
        assert out.shape == ref.shape and out.dtype == torch.float32
        assert bool(((out - ref).abs() <= tol).all()), float((out - ref).abs().max())

    return check


# ------------------------------------------------------------------ SpMM


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("kind", ["uniform", "powerlaw"])
def test_copy_spmm_bit_exact(
    dtype: torch.dtype, heads: int, kind: str, isas: list[str], threads: None
) -> None:
    ext = ext_or_skip()
    indptr, indices = _csr(61, 47, 5, kind, seed=heads, dtype=dtype)
    for i, width in enumerate(WIDTHS):
        q, scale = _quantized(_q_shape(47, heads, width), bits=2 + i % 7, seed=i)
        ref = reference_qspmm(indptr, indices, q, scale)
        for isa in isas:
            ext.set_isa(isa)
            for nt in (1, 2):
                torch.set_num_threads(nt)
                out = qspmm(indptr, indices, q, scale, backend="ext-cpu")
                assert torch.equal(out, ref), (isa, nt, width)


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("with_eids", [False, True])
def test_weighted_spmm_matches_reference(
    dtype: torch.dtype, heads: int, with_eids: bool, isas: list[str], threads: None
) -> None:
    ext = ext_or_skip()
    indptr, indices = _csr(53, 40, 6, "powerlaw", seed=7 + heads, dtype=dtype)
    nnz = indices.numel()
    gen = torch.Generator().manual_seed(3)
    eids = torch.randperm(nnz, generator=gen).to(dtype) if with_eids else None
    shapes = [(nnz,), (nnz, 1), (nnz, heads), (nnz, heads, 1), (nnz, 1, 1)]
    for i, width in enumerate(WIDTHS):
        q, scale = _quantized(_q_shape(40, heads, width), bits=8 - i % 7, seed=10 + i)
        for shape in shapes:
            w = torch.randn(shape, generator=gen)
            check = _weighted_check(indptr, indices, q, scale, w, eids)
            for isa in isas:
                ext.set_isa(isa)
                torch.set_num_threads(1 + i % 2)
                check(qspmm(indptr, indices, q, scale, w, eids, backend="ext-cpu"))


def test_spmm_thread_count_and_isa_do_not_change_bits(isas: list[str], threads: None) -> None:
    """Rows are summed whole by one thread in CSR order: the float sums are identical too."""
    ext = ext_or_skip()
    indptr, indices = _csr(3000, 2500, 12, "powerlaw", seed=5, dtype=torch.int64)
    q, scale = _quantized((2500, 4, 24), 8, seed=5)
    w = torch.randn(indices.numel(), 4, 1, generator=torch.Generator().manual_seed(5))
    eids = torch.randperm(indices.numel(), generator=torch.Generator().manual_seed(6))
    results = []
    for isa in isas:
        ext.set_isa(isa)
        for nt in (1, 2):
            torch.set_num_threads(nt)
            results.append(qspmm(indptr, indices, q, scale, w, eids, backend="ext-cpu"))
            results.append(qspmm(indptr, indices, q[:, 0], scale, w[:, 0], eids, backend="ext-cpu"))
    for r in results[2::2]:
        assert torch.equal(r, results[0])
    for r in results[3::2]:
        assert torch.equal(r, results[1])
    _weighted_check(indptr, indices, q, scale, w, eids)(results[0])


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_incidence_form(dtype: torch.dtype, isas: list[str]) -> None:
    """Edge-to-node sums (GAT's backward over [E, H, 1] edge tensors) are the copy form."""
    ext = ext_or_skip()
    indptr, indices = _csr(70, 70, 4, "powerlaw", seed=11, dtype=dtype)
    nnz = indices.numel()
    eids = torch.randperm(nnz, generator=torch.Generator().manual_seed(1)).to(dtype)
    for shape in [(nnz, 4, 1), (nnz, 1), (nnz, 8, 16)]:
        q, scale = _quantized(shape, 6, seed=len(shape))
        ref = reference_qspmm(indptr, eids, q, scale)
        for isa in isas:
            ext.set_isa(isa)
            assert torch.equal(qspmm_incidence(indptr, eids, q, scale, backend="ext-cpu"), ref)


def test_spmm_edge_cases(isas: list[str]) -> None:
    ext = ext_or_skip()
    for isa in isas:
        ext.set_isa(isa)
        for dtype in INDEX_DTYPES:
            empty = torch.zeros(0, dtype=dtype)
            # empty graph: 0 rows, 0 entries, 0 input rows
            out = qspmm(
                torch.zeros(1, dtype=dtype), empty, torch.zeros(0, 5, dtype=torch.int8), 1.0
            )
            assert out.shape == (0, 5)
            # rows but no edges: zeros, also weighted and multi-head
            indptr = torch.zeros(4, dtype=dtype)
            q = torch.ones(2, 3, 7, dtype=torch.int8)
            out = qspmm(indptr, empty, q, 0.5)
            assert torch.equal(out, torch.zeros(3, 3, 7))
            out = qspmm(indptr, empty, q, 0.5, torch.zeros(0, 3), empty)
            assert torch.equal(out, torch.zeros(3, 3, 7))
            # zero width
            out = qspmm(
                torch.tensor([0, 1], dtype=dtype),
                torch.zeros(1, dtype=dtype),
                torch.zeros(1, 0, dtype=torch.int8),
                1.0,
            )
            assert out.shape == (1, 0)
        indptr, indices = _csr(40, 30, 5, "powerlaw", seed=2, dtype=torch.int32)
        # all-zero input: scale 0, exactly zero out (never NaN)
        q, scale = quantize(torch.zeros(30, 17), 8)
        assert float(scale) == 0.0
        assert torch.equal(qspmm(indptr, indices, q, scale), torch.zeros(40, 17))
        w = torch.rand(indices.numel())
        assert torch.equal(qspmm(indptr, indices, q, scale, w), torch.zeros(40, 17))
        # constant tensors, positive and negative: every element on the top level
        for c in (2.5, -2.5):
            q, scale = quantize(torch.full((30, 33), c), 4)
            assert torch.equal(
                qspmm(indptr, indices, q, scale), reference_qspmm(indptr, indices, q, scale)
            )
        # non-contiguous operands (transposed views from autograd)
        qt = torch.randint(-127, 128, (33, 30), dtype=torch.int8).t()
        wt = torch.randn(2, indices.numel()).t()
        assert torch.equal(
            qspmm(indptr, indices, qt, 0.25), reference_qspmm(indptr, indices, qt, 0.25)
        )
        quarter = torch.tensor(0.25)
        check = _weighted_check(indptr, indices, qt, quarter, wt[:, :1], None)
        check(qspmm(indptr, indices, qt, quarter, wt[:, :1]))


def test_spmm_long_row_does_not_overflow_int32() -> None:
    """A row whose int8 sum leaves int32 takes the int64 path (still exact)."""
    ext = ext_or_skip()
    deg = (1 << 31) // 128 + 1  # -128 * deg < -2^31
    indptr = torch.tensor([0, deg], dtype=torch.int32)
    out = ext.qspmm(
        indptr,
        torch.zeros(deg, dtype=torch.int32),
        torch.full((1, 1), -128, dtype=torch.int8),
        1.0,
        None,
        None,
    )
    expect = torch.tensor([[-128 * deg]], dtype=torch.int64).to(torch.float32)
    assert torch.equal(out, expect)


def test_spmm_errors() -> None:
    ext = ext_or_skip()
    indptr = torch.tensor([0, 2, 3])
    indices = torch.tensor([0, 1, 1])
    q = torch.ones(2, 4, dtype=torch.int8)
    with pytest.raises(TypeError, match="int8"):
        qspmm(indptr, indices, q.float(), 1.0)
    with pytest.raises(TypeError, match="int32 or int64"):
        qspmm(indptr.float(), indices, q, 1.0)
    with pytest.raises(ValueError, match="outside"):
        qspmm(indptr, torch.tensor([0, 1, 2]), q, 1.0)
    with pytest.raises(ValueError, match="outside"):
        qspmm(indptr, torch.tensor([0, -1, 1]), q, 1.0)
    with pytest.raises(ValueError, match="outside"):
        qspmm(indptr, indices, q, 1.0, torch.ones(3), torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="indptr"):
        qspmm(torch.tensor([0, 2, 4]), indices, q, 1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        qspmm(torch.tensor([0, 2, 1, 3]), indices, q, 1.0)
    with pytest.raises(ValueError, match="weight must have shape"):
        qspmm(indptr, indices, q[:, None, :].expand(2, 3, 4), 1.0, torch.ones(3, 2))
    with pytest.raises(ValueError, match="eids has"):
        qspmm(indptr, indices, q, 1.0, torch.ones(3), torch.tensor([0, 1]))
    # the kernel validates on its own too (it is callable directly)
    with pytest.raises(ValueError, match="non-decreasing"):
        ext.qspmm(torch.tensor([0, 2, 1, 3]), indices, q, 1.0, None, None)
    with pytest.raises(ValueError, match="rows of weight"):
        ext.qspmm(indptr, indices, q, 1.0, torch.ones(3), torch.tensor([0, 1, 5]))
    with pytest.raises(ValueError, match="rows but there are"):
        ext.qspmm(indptr, indices, q, 1.0, torch.ones(2), None)
    with pytest.raises(ValueError, match=r"weight must have shape"):
        ext.qspmm(indptr, indices, q, 1.0, torch.ones(3, 2), None)
    with pytest.raises(TypeError, match="int8"):
        ext.qspmm(indptr, indices, q.int(), 1.0, None, None)


# ------------------------------------------------------------------ SDDMM


@pytest.mark.parametrize("op", SDDMM_OPS)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
def test_sddmm_bit_exact(
    op: str, dtype: torch.dtype, heads: int, isas: list[str], threads: None
) -> None:
    ext = ext_or_skip()
    gen = torch.Generator().manual_seed(heads)
    n_l, n_r, n_e = 37, 29, 301
    lhs = torch.randint(0, n_l, (n_e,), generator=gen).to(dtype)
    rhs = torch.randint(0, n_r, (n_e,), generator=gen).to(dtype)
    for i, width in enumerate((*WIDTHS, 2, 4, 8)):
        ql, sl = _quantized(_q_shape(n_l, heads, width), bits=2 + i % 7, seed=i)
        qr, sr = _quantized(_q_shape(n_r, heads, width), bits=8 - i % 7, seed=100 + i)
        ref = reference_qsddmm(op, ql, sl, lhs, qr, sr, rhs)
        for isa in isas:
            ext.set_isa(isa)
            for nt in (1, 2):
                torch.set_num_threads(nt)
                out = qsddmm(op, ql, sl, lhs, qr, sr, rhs, backend="ext-cpu")
                assert out.shape == ref.shape and torch.equal(out, ref), (isa, nt, width)


def test_sddmm_large_parallel_matches(isas: list[str], threads: None) -> None:
    """Enough edges that two threads really split them."""
    ext = ext_or_skip()
    gen = torch.Generator().manual_seed(9)
    lhs = torch.randint(0, 500, (40000,), generator=gen)
    rhs = torch.randint(0, 500, (40000,), generator=gen)
    for shape in [(500, 4, 1), (500, 64)]:
        ql, sl = _quantized(shape, 8, seed=1)
        qr, sr = _quantized(shape, 8, seed=2)
        for op in ("add", "dot"):
            ref = reference_qsddmm(op, ql, sl, lhs, qr, sr, rhs)
            for isa in isas:
                ext.set_isa(isa)
                for nt in (1, 2):
                    torch.set_num_threads(nt)
                    assert torch.equal(qsddmm(op, ql, sl, lhs, qr, sr, rhs), ref)


def test_sddmm_edge_cases() -> None:
    ext_or_skip()
    for op in SDDMM_OPS:
        for dtype in INDEX_DTYPES:
            none = torch.zeros(0, dtype=dtype)
            q = torch.zeros(0, 3, dtype=torch.int8)
            out = qsddmm(op, q, 1.0, none, q, 1.0, none, backend="ext-cpu")
            assert out.shape == ((0, 1) if op == "dot" else (0, 3))
            q = torch.zeros(4, 2, 0, dtype=torch.int8)
            idx = torch.tensor([0, 3], dtype=dtype)
            out = qsddmm(op, q, 1.0, idx, q, 1.0, idx, backend="ext-cpu")
            assert torch.equal(out, reference_qsddmm(op, q, 1.0, idx, q, 1.0, idx))
        idx = torch.tensor([0, 2, 1, 1])
        qz, sz = quantize(torch.zeros(3, 5), 8)
        for c in (1.5, -1.5):
            qc, sc = quantize(torch.full((3, 5), c), 3)
            for a, sa, b, sb in ((qz, sz, qc, sc), (qc, sc, qc, sc), (qc, sc, qz, sz)):
                out = qsddmm(op, a, sa, idx, b, sb, idx, backend="ext-cpu")
                ref = reference_qsddmm(op, a, sa, idx, b, sb, idx)
                assert torch.equal(out, ref) and not bool(out.isnan().any())
        qt = torch.randint(-127, 128, (5, 3), dtype=torch.int8).t()  # non-contiguous
        out = qsddmm(op, qt, 0.5, idx, qt, 0.25, idx, backend="ext-cpu")
        assert torch.equal(out, reference_qsddmm(op, qt, 0.5, idx, qt, 0.25, idx))


def test_sddmm_errors() -> None:
    ext = ext_or_skip()
    q = torch.ones(3, 4, dtype=torch.int8)
    idx = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="op must be one of"):
        qsddmm("div", q, 1.0, idx, q, 1.0, idx)
    with pytest.raises(ValueError, match="trailing shape"):
        qsddmm("add", q, 1.0, idx, q[:, :2], 1.0, idx)
    with pytest.raises(ValueError, match="entries"):
        qsddmm("add", q, 1.0, idx, q, 1.0, idx[:1])
    with pytest.raises(TypeError, match="int32 or int64"):
        qsddmm("add", q, 1.0, idx.float(), q, 1.0, idx)
    with pytest.raises(ValueError, match="outside"):
        qsddmm("dot", q, 1.0, idx, q, 1.0, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="outside"):
        qsddmm("mul", q, 1.0, torch.tensor([-1, 0]), q, 1.0, idx)
    with pytest.raises(ValueError, match="op must be one of"):
        ext.qsddmm("max", q, 1.0, idx, q, 1.0, idx)
    with pytest.raises(TypeError, match="int8"):
        ext.qsddmm("add", q.float(), 1.0, idx, q, 1.0, idx)


# ------------------------------------------------------------------ dispatch, DGL


def test_auto_uses_ext_and_counts() -> None:
    ext_or_skip()
    dispatch.reset()
    indptr, indices = _csr(10, 10, 3, "uniform", seed=0, dtype=torch.int64)
    q = torch.ones(10, 4, dtype=torch.int8)
    qspmm(indptr, indices, q, 1.0)
    qsddmm("dot", q, 1.0, indices, q, 1.0, indices)
    qspmm(indptr, indices, q, 1.0, backend="reference")
    snap = dispatch.snapshot()
    assert snap["spmm"] == {"ext-cpu": 1, "reference": 1}
    assert snap["sddmm"] == {"ext-cpu": 1}
    assert dispatch.fallbacks() == []


def test_matches_dgl_message_passing() -> None:
    """The in-CSR of a DGL graph is g.adj_tensors('csc'): (indptr over dst, src, eids)."""
    ext_or_skip()
    from qtrain._compat import import_dgl

    dgl = import_dgl()
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, 50, (400,), generator=gen)
    dst = torch.randint(0, 60, (400,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=60)
    indptr, indices, eids = g.adj_tensors("csc")
    assert indptr.numel() == g.num_nodes() + 1 and eids.numel() == g.num_edges()
    x = torch.randn(60, 4, 9, generator=gen)
    w = torch.rand(g.num_edges(), 4, 1, generator=gen)
    q, scale = quantize(x, 8)
    xd = q.to(torch.float32) * scale
    out = qspmm(indptr, indices, q, scale)
    torch.testing.assert_close(out, dgl.ops.copy_u_sum(g, xd), rtol=1e-5, atol=1e-5)
    out = qspmm(indptr, indices, q, scale, w, eids)
    torch.testing.assert_close(out, dgl.ops.u_mul_e_sum(g, xd, w), rtol=1e-5, atol=1e-5)
    # SDDMM on the edge list in edge-id order
    u, v = g.edges()
    out = qsddmm("dot", q, scale, u, q, scale, v)
    torch.testing.assert_close(out, dgl.ops.u_dot_v(g, xd, xd), rtol=1e-5, atol=1e-4)
    out = qsddmm("add", q, scale, u, q, scale, v)
    torch.testing.assert_close(out, dgl.ops.u_add_v(g, xd, xd), rtol=0, atol=0)
