"""int8_gemm, qspmm and qsddmm with one scale per row (issue 32), on every device and
backend: each equals its definition with the rows' scales, and bad scales are refused
with one clear error.

Definitions (``s_a[m]``, ``s_b[n]``: per-row scales; a per-tensor scale is one number)::

    int8_gemm:  C[m, n] = fl32(float(acc[m, n]) * fl32(s_a[m] * s_b[n])) (+ bias[n])
    qspmm:      out[r]  = sum_k fl32(fl32(w[eids[k]] * s[indices[k]]) * float(q[indices[k]]))
                (without edge weights: fl32(s[indices[k]] * float(q[indices[k]])) summed)
    qsddmm:     mul / dot: the integer result times fl32(s_l[i] * s_r[j]);
                add / sub: fl32(q_l[i] * s_l[i]) +/- fl32(q_r[j] * s_r[j])
"""

from __future__ import annotations

import pytest
import torch

from qtrain.ops.gemm import int8_gemm
from qtrain.ops.sparse import qsddmm, qspmm
from tests.ops.sparse_cases import csr, kernel_order_weighted
from tests.ops.support import DEVICES, assert_same, library

BACKENDS = ("reference", "compiled")


def _backend(name: str, device: str) -> str:
    if name == "reference":
        return "reference"
    library(device)
    return "ext-cuda" if torch.device(device).type == "cuda" else "ext-cpu"


def _q(shape: tuple[int, ...], seed: int, bits: int = 4) -> torch.Tensor:
    qmax = 2 ** (bits - 1) - 1
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-qmax, qmax + 1, shape, generator=g, dtype=torch.int8)


def _scales(n: int, seed: int, zeros: bool = True) -> torch.Tensor:
    """Positive per-row scales over several decades, some rows 0 (an all-zero row)."""
    g = torch.Generator().manual_seed(seed)
    s = 10.0 ** (torch.rand(n, generator=g) * 6 - 4)
    if zeros and n > 2:
        s[::3] = 0.0
    return s


# ------------------------------------------------------------------ int8_gemm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
@pytest.mark.parametrize(
    ("m", "k", "n"), [(7, 33, 5), (1, 1, 1), (0, 4, 3), (6, 0, 2), (65, 129, 17)]
)
def test_int8_gemm_with_row_and_column_scales(
    device: str, backend: str, layout: str, m: int, k: int, n: int
) -> None:
    a = _q((m, k) if layout != "tn" else (k, m), 1, 8)
    b = _q((k, n) if layout != "nt" else (n, k), 2, 8)
    s_a, s_b, bias = _scales(m, 3), _scales(n, 4), torch.randn(n)
    af, bf = a.to(torch.float64), b.to(torch.float64)
    acc = (af.t() if layout == "tn" else af) @ (bf.t() if layout == "nt" else bf)
    factor = (s_a[:, None] * s_b[None, :]).to(torch.float32)
    want = acc.to(torch.float32) * factor
    dev = torch.device(device)
    chosen = _backend(backend, device)
    for sa, sb, w in (
        (s_a[:, None], s_b[:, None], want),  # quantize_per_row's [rows, 1]
        (s_a, torch.tensor(0.5), acc.to(torch.float32) * (s_a[:, None] * 0.5)),
        (torch.tensor(2.0), s_b, acc.to(torch.float32) * (2.0 * s_b[None, :])),
    ):
        got = int8_gemm(a.to(dev), b.to(dev), sa.to(dev), sb.to(dev), layout, None, chosen)
        assert_same(got.cpu(), w, f"{layout} {m}x{k}x{n}")
    got = int8_gemm(a.to(dev), b.to(dev), s_a.to(dev), s_b.to(dev), layout, bias.to(dev), chosen)
    assert_same(got.cpu(), want + bias, "with bias")


@pytest.mark.parametrize("device", DEVICES)
def test_int8_gemm_refuses_bad_row_scales(device: str) -> None:
    dev = torch.device(device)
    a, b = _q((4, 3), 1).to(dev), _q((3, 5), 2).to(dev)
    for sa, sb, error, match in (
        (
            torch.ones(5, device=dev),
            torch.ones(5, device=dev),
            ValueError,
            r"one value per row \(4\)",
        ),
        (torch.ones(4, 2, device=dev), 1.0, ValueError, r"scale_a must hold one value per row"),
        (1.0, torch.ones(5, dtype=torch.float64, device=dev), TypeError, "scale_b must be float32"),
        (torch.ones(4, device="meta"), 1.0, ValueError, "scale_a is on meta"),
    ):
        with pytest.raises(error, match=match):
            int8_gemm(a, b, sa, sb, "nn")


# ------------------------------------------------------------------ qspmm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["uniform", "powerlaw", "zeros", "empty"])
@pytest.mark.parametrize(("heads", "per"), [(1, "node"), (3, "node"), (3, "head")])
@pytest.mark.parametrize("weighted", [False, True])
def test_qspmm_with_row_scales(
    device: str, kind: str, heads: int, weighted: bool, per: str
) -> None:
    """One scale per node, or (rows [N, H, D]) per node and head: each entry's weight
    takes its row's scale, per head where either is."""
    rows, n_in, width = 40, 23, 7
    if kind == "empty":
        indptr, indices = (
            torch.zeros(rows + 1, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
        )
    else:
        indptr, indices = csr(rows, n_in, 6, kind, seed=5)
    nnz = indices.numel()
    q = _q((n_in, width) if heads == 1 else (n_in, heads, width), 6)
    s = _scales(n_in, 7) if per == "node" else _scales(n_in * heads, 7).reshape(n_in, heads)
    scale = s.reshape(n_in, *[1] * (q.dim() - 1)) if per == "node" else s[:, :, None]
    eids = torch.randperm(nnz, generator=torch.Generator().manual_seed(8)) if weighted else None
    weight = (
        torch.rand(nnz, heads, generator=torch.Generator().manual_seed(9)) if weighted else None
    )
    # the kernels' order of additions with each entry's weight
    entry_s = s[indices] if per == "head" else s[indices][:, None]
    per_entry = entry_s if weight is None else weight[eids] * entry_s
    want = kernel_order_weighted(indptr, indices, q, 1.0, per_entry, None)
    close = torch.zeros_like(want)
    magnitude = torch.zeros_like(want)  # sum of |terms|: what float32 rounding scales with
    x = q.to(torch.float64) * scale.to(torch.float64)
    w64 = None if weight is None else weight.to(torch.float64)[eids]
    for r in range(rows):
        a, b = int(indptr[r]), int(indptr[r + 1])
        part = x[indices[a:b]]
        if w64 is not None:
            part = part * (w64[a:b, :, None] if q.dim() == 3 else w64[a:b])
        close[r] = part.sum(0).to(torch.float32)
        magnitude[r] = part.abs().sum(0).to(torch.float32)
    dev = torch.device(device)
    for backend in BACKENDS:
        chosen = _backend(backend, device)
        args = (indptr.to(dev), indices.to(dev), q.to(dev), scale.to(dev))
        w_dev = None if weight is None else weight.to(dev)
        e_dev = None if eids is None else eids.to(dev)
        got = qspmm(*args, weight=w_dev, eids=e_dev, backend=chosen).cpu()
        assert got.shape == want.shape
        if backend == "compiled":
            assert_same(got, want, f"{kind} heads={heads}")
        assert bool(((got - close).abs() <= 1e-5 * magnitude + 1e-30).all()), f"{kind} {backend}"


@pytest.mark.parametrize("device", DEVICES)
def test_qspmm_refuses_bad_row_scales(device: str) -> None:
    dev = torch.device(device)
    indptr, indices = (t.to(dev) for t in csr(5, 4, 2, "uniform", seed=1))
    q = _q((4, 3), 2).to(dev)
    for scale, error, match in (
        (torch.ones(5, device=dev), ValueError, r"one per row of the quantized tensor \(\[4\]"),
        (torch.ones(4, 3, device=dev), ValueError, r"got shape \[4, 3\]"),
        (torch.ones(4, dtype=torch.float16, device=dev), TypeError, "scale must be float32"),
        (torch.ones(4, device="meta"), ValueError, "scale is on meta"),
    ):
        with pytest.raises(error, match=match):
            qspmm(indptr, indices, q, scale)
    q3 = _q((4, 2, 3), 2).to(dev)  # per node and head: [4, 2] or [4, 2, 1], not [4, 3]
    for scale in (torch.ones(4, 2, device=dev), torch.ones(4, 2, 1, device=dev)):
        qspmm(indptr, indices, q3, scale)
    for scale, match in (
        (torch.ones(4, 3, 1, device=dev), r"\[4, 2\] or \[4, 2, 1\]\), got shape \[4, 3, 1\]"),
        (torch.ones(4, 2, 2, device=dev), r"got shape \[4, 2, 2\]"),
        (torch.ones(4, 1, 2, device=dev), r"got shape \[4, 1, 2\]"),
    ):
        with pytest.raises(ValueError, match=match):
            qspmm(indptr, indices, q3, scale)
    bad = indices.clone()
    bad[0] = 4  # out of range: refused before the weights are gathered by it
    with pytest.raises(ValueError, match="outside"):
        qspmm(
            indptr,
            bad,
            q,
            torch.ones(4, device=dev),
            weight=torch.ones(indices.numel(), device=dev),
        )


# ------------------------------------------------------------------ qsddmm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "dot"])
@pytest.mark.parametrize(("heads", "per"), [(1, "node"), (2, "node"), (2, "head")])
@pytest.mark.parametrize("which", ["both", "lhs", "rhs"])
def test_qsddmm_with_row_scales(device: str, op: str, heads: int, which: str, per: str) -> None:
    """Per-row scales (per node, or per node and head for [N, H, D] rows) on either side."""
    n_l, n_r, edges, width = 9, 6, 31, 5
    shape = (width,) if heads == 1 else (heads, width)
    ql, qr = _q((n_l, *shape), 1), _q((n_r, *shape), 2)
    g = torch.Generator().manual_seed(3)
    li, ri = (
        torch.randint(0, n_l, (edges,), generator=g),
        torch.randint(0, n_r, (edges,), generator=g),
    )
    k = heads if per == "head" else 1
    sl, sr = _scales(n_l * k, 4).reshape(n_l, k), _scales(n_r * k, 5).reshape(n_r, k)
    if which == "rhs":
        sl = torch.tensor(0.25).expand(n_l, k).contiguous()
    if which == "lhs":
        sr = torch.tensor(0.75).expand(n_r, k).contiguous()
    bshape = (-1, k, 1) if len(shape) == 2 else (-1, 1)
    a = ql[li].to(torch.float32)
    b = qr[ri].to(torch.float32)
    el, er = sl[li].reshape(bshape), sr[ri].reshape(bshape)
    if op in ("add", "sub"):
        want = a * el + b * er if op == "add" else a * el - b * er
    else:
        prod = (ql[li].to(torch.int32) * qr[ri].to(torch.int32)).to(torch.float32)
        if op == "dot":
            prod = (ql[li].to(torch.int32) * qr[ri].to(torch.int32)).sum(-1, keepdim=True)
            prod = prod.to(torch.float32)
        want = prod * (el * er)
    dev = torch.device(device)
    scale_l = torch.tensor(0.25) if which == "rhs" else sl.reshape(n_l, k, *[1] * (len(shape) - 1))
    scale_r = torch.tensor(0.75) if which == "lhs" else (sr if k > 1 else sr.reshape(n_r))
    for backend in BACKENDS:
        got = qsddmm(
            op,
            ql.to(dev),
            scale_l.to(dev),
            li.to(dev),
            qr.to(dev),
            scale_r.to(dev),
            ri.to(dev),
            _backend(backend, device),
        )
        assert_same(got.cpu(), want, f"{op} {which} {backend}")


@pytest.mark.parametrize("device", DEVICES)
def test_qsddmm_refuses_bad_row_scales_and_indices(device: str) -> None:
    dev = torch.device(device)
    q = _q((4, 3), 1).to(dev)
    index = torch.tensor([0, 3, 1], device=dev)
    with pytest.raises(ValueError, match=r"scale_rhs must be one value, one per row"):
        qsddmm("dot", q, 1.0, index, q, torch.ones(5, device=dev), index)
    with pytest.raises(ValueError, match="outside"):  # checked before the scales are gathered
        qsddmm(
            "add", q, torch.ones(4, device=dev), torch.tensor([0, 4, 1], device=dev), q, 1.0, index
        )


def test_qsddmm_with_row_scales_counts_the_backend_that_ran() -> None:
    """Every op with per-row scales runs the compiled kernel (row_scale_lhs / _rhs), and
    the kernel counter says so; backend="reference" runs and counts the reference."""
    from qtrain.ops import dispatch

    q, index, scale = _q((4, 3), 1), torch.tensor([0, 3, 1]), torch.ones(4)
    for op in ("add", "sub", "mul", "dot"):
        dispatch.reset()
        qsddmm(op, q, scale, index, q, scale, index)
        assert dispatch.snapshot()["sddmm"] == {"ext-cpu": 1}, op
        dispatch.reset()
        qsddmm(op, q, scale, index, q, scale, index, backend="reference")
        assert dispatch.snapshot()["sddmm"] == {"reference": 1}, op
    dispatch.reset()


def test_quantize_per_row_of_a_3d_tensor_is_that_of_its_last_dimension_rows() -> None:
    """One scale per row of the last dimension (a node's head), the same bits as the 2-d
    rows of x viewed as [N * H, D], scale shaped to broadcast over x: a large head leaves
    the node's other heads their own levels."""
    from qtrain.ops.quantize import quantize_per_row

    x = torch.randn(7, 3, 5, generator=torch.Generator().manual_seed(2))
    x[4, 1] *= 50.0
    for backend in ("reference", "ext-cpu"):
        q, scale = quantize_per_row(x, 4, "stochastic", 3, 9, backend)
        want_q, want_scale = quantize_per_row(x.reshape(21, 5), 4, "stochastic", 3, 9, backend)
        assert q.shape == (7, 3, 5) and scale.shape == (7, 3, 1)
        assert torch.equal(q, want_q.view(7, 3, 5)) and torch.equal(scale.view(21, 1), want_scale)
        # the large head does not crush its node's other heads to 0
        assert bool((q[4, 0] != 0).any()) and bool((q[4, 2] != 0).any())
        x4 = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(3))
        q4, s4 = quantize_per_row(x4, 4, "nearest", 0, 0, backend)
        assert q4.shape == x4.shape and s4.shape == (2, 3, 4, 1)
    with pytest.raises(ValueError, match="2-d"):
        quantize_per_row(torch.ones(4), 4)


@pytest.mark.parametrize("backend", ["reference", "ext-cpu"])
def test_quantize_per_row_of_an_empty_3d_tensor(backend: str) -> None:
    """No rows (the edges of a graph without edges, [0, H, 1]): empty q and scales, not a
    reshape error."""
    from qtrain.ops.quantize import quantize_per_row

    q, scale = quantize_per_row(torch.empty(0, 3, 1), 4, "stochastic", 0, 0, backend)
    assert q.shape == (0, 3, 1) and q.dtype == torch.int8 and scale.shape == (0, 3, 1)
