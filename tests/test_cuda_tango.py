"""CUDA tango kernels (qtrain._ext_cuda) against the pure-PyTorch references on CPU copies.

Every op is bit-exact: quantization is elementwise with counter-based randomness,
integer sums are exact, the weighted SpMM adds in CSR order per row (compared with
a CSR-order emulation below), and every float step is the reference's float32
operation. Skipped where no GPU or no CUDA build is present.
"""

from __future__ import annotations

import pytest
import torch

from qtrain import backends
from qtrain.ops import dispatch
from qtrain.ops import quantize as quantize_op  # the function (it shadows its submodule)
from qtrain.ops import sparse as sparse_ops
from qtrain.ops.sparse import SDDMM_OPS, reference_qsddmm
from qtrain.quant.quantize import quantize_symmetric
from qtrain.quant.rng import counter_uniform

if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
if not backends.available("ext-cuda"):
    pytest.skip(
        f"qtrain._ext_cuda not built: {backends.error('ext-cuda')}", allow_module_level=True
    )

EXT = backends.ext_cuda()
DEV = torch.device("cuda")
WIDTHS = (1, 3, 5, 17, 33, 127, 129)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _exact(got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    # bitwise, so -0.0 vs 0.0 and NaN payloads count too
    if got.dtype == torch.float32:
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (
            f"max diff {(got - want).abs().max().item() if got.numel() else 0}"
        )
    else:
        assert torch.equal(got, want)


# ---------------------------------------------------------------- quantize


QUANT_SHAPES = [(0,), (1,), (3,), (5, 17), (33, 127), (129, 3, 5), (4099,), (1 << 20) + 3]


@pytest.mark.parametrize("shape", QUANT_SHAPES)
@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantize_matches_reference(shape, bits: int, stochastic: bool) -> None:
    shape = shape if isinstance(shape, tuple) else (shape,)
    x = torch.randn(shape, generator=_gen(bits)) * 3.0
    rounding = "stochastic" if stochastic else "nearest"
    for seed, offset in ((0, 0), (12345, 77), (2**64 - 1, 2**32 - 5)):
        q, s = EXT.quantize_symmetric(x.to(DEV), bits, stochastic, seed, offset)
        rq, rs = quantize_symmetric(x, bits, rounding, seed, offset)
        assert q.device.type == "cuda" and s.device.type == "cuda" and s.dim() == 0
        _exact(q, rq)
        _exact(s, rs)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(37),
        torch.full((5, 7), -2.5),
        torch.full((64,), 1e-39),  # qmax / absmax overflows: the 2^64 pre-scale path
        torch.tensor([0.5, -0.5, 1.5, -1.5, 2.5, 127.0, -127.0]),  # ties to even
        torch.tensor([-0.0, 0.0, -0.0]),
    ],
)
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantize_edge_values(x: torch.Tensor, stochastic: bool) -> None:
    rounding = "stochastic" if stochastic else "nearest"
    for bits in (2, 5, 8):
        q, s = EXT.quantize_symmetric(x.to(DEV), bits, stochastic, 9, 3)
        rq, rs = quantize_symmetric(x, bits, rounding, 9, 3)
        _exact(q, rq)
        _exact(s, rs)


def test_quantize_unaligned_and_strided_input() -> None:
    base = torch.randn(4099, generator=_gen(1))
    for x in (base[1:], base[3:3003], base.reshape(4099, 1)[::2, 0]):
        q, s = EXT.quantize_symmetric(x.to(DEV), 6, True, 5, 11)
        rq, rs = quantize_symmetric(x, 6, "stochastic", 5, 11)
        _exact(q, rq)
        _exact(s, rs)
    # a view at an odd element offset of a CUDA tensor: the scalar (unvectorized) kernels
    xd = base.to(DEV)[1:]
    q, s = EXT.quantize_symmetric(xd, 4, False, 0, 0)
    rq, rs = quantize_symmetric(base[1:], 4, "nearest", 0, 0)
    _exact(q, rq)
    _exact(s, rs)


def test_quantize_argument_errors() -> None:
    with pytest.raises(ValueError, match="NaN or Inf"):
        EXT.quantize_symmetric(torch.tensor([1.0, float("nan")], device=DEV), 8)
    with pytest.raises(ValueError, match="NaN or Inf"):
        EXT.quantize_symmetric(torch.tensor([float("inf")], device=DEV), 8)
    with pytest.raises(ValueError, match="CUDA tensor"):
        EXT.quantize_symmetric(torch.ones(3), 8)
    with pytest.raises(TypeError, match="float32"):
        EXT.quantize_symmetric(torch.ones(3, device=DEV, dtype=torch.float64), 8)
    with pytest.raises(ValueError, match="bits"):
        EXT.quantize_symmetric(torch.ones(3, device=DEV), 9)
    with pytest.raises(ValueError, match="offset"):
        EXT.quantize_symmetric(torch.ones(3, device=DEV), 8, True, 0, -1)


@pytest.mark.parametrize("n", [0, 1, 5, 1001, (1 << 18) + 1])
def test_counter_uniform_matches_reference(n: int) -> None:
    for seed, offset in ((0, 0), (7, 2**32 - 3), (2**40 + 1, 123)):
        got = EXT.counter_uniform(n, seed, offset)
        assert got.device.type == "cuda"
        _exact(got, counter_uniform(n, seed, offset))
    with pytest.raises(ValueError):
        EXT.counter_uniform(-1)


def test_quantize_wrapper_dispatches_to_cuda() -> None:
    dispatch.reset()
    x = torch.randn(100, generator=_gen(3))
    q, s = quantize_op(x.to(DEV), 4, "stochastic", seed=2, offset=5)
    assert dispatch.snapshot()["quantize"] == {"ext-cuda": 1}
    rq, rs = quantize_symmetric(x, 4, "stochastic", 2, 5)
    _exact(q, rq)
    _exact(s, rs)


# ---------------------------------------------------------------- sparse


def _graph(rows: int, n_in: int, degrees: str, g: torch.Generator, dtype=torch.int64):
    if degrees == "power":
        deg = (torch.rand(rows, generator=g) ** -1.3).floor().clamp(max=300).to(torch.int64) - 1
    elif degrees == "zeros":  # every other row empty
        deg = torch.randint(0, 5, (rows,), generator=g) * (torch.arange(rows) % 2)
    else:
        deg = torch.randint(0, 9, (rows,), generator=g)
    indptr = torch.zeros(rows + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(deg, 0)
    nnz = int(indptr[-1])
    indices = torch.randint(0, max(n_in, 1), (nnz,), generator=g) if n_in else torch.zeros(0)
    return indptr.to(dtype), indices.to(dtype)


def _csr_order_weighted(indptr, indices, q, scale, weight, eids):
    """Weighted SpMM with the additions in CSR order per row, in float32 (the kernels' order)."""
    rows = indptr.numel() - 1
    q3 = q if q.dim() == 3 else q[:, None, :]
    h, d = q3.shape[1], q3.shape[2]
    w = weight.to(torch.float32)
    if w.dim() == 3:
        w = w[:, :, 0]
    if w.dim() == 1:
        w = w[:, None]
    w = w.expand(w.shape[0], h)
    ip = indptr.to(torch.int64)
    deg = ip[1:] - ip[:-1]
    acc = torch.zeros((rows, h, d), dtype=torch.float32)
    for p in range(int(deg.max()) if rows else 0):
        live = torch.nonzero(deg > p)[:, 0]
        k = ip[live] + p
        e = eids.to(torch.int64)[k] if eids is not None else k
        contrib = w[e][:, :, None] * q3[indices.to(torch.int64)[k]].to(torch.float32)
        acc[live] = acc[live] + contrib
    out = acc * torch.tensor(scale, dtype=torch.float32)
    return out if q.dim() == 3 else out[:, 0, :]


@pytest.mark.parametrize("width", (*WIDTHS, 128, 256, 600))
@pytest.mark.parametrize("degrees", ["uniform", "power", "zeros"])
@pytest.mark.parametrize("itype", [torch.int32, torch.int64])
def test_qspmm_copy_matches_reference(width: int, degrees: str, itype) -> None:
    g = _gen(width)
    indptr, indices = _graph(70, 50, degrees, g, itype)
    q = torch.randint(-128, 128, (50, width), generator=g, dtype=torch.int8)
    got = EXT.qspmm(indptr.to(DEV), indices.to(DEV), q.to(DEV), 0.037)
    _exact(got, sparse_ops.reference_qspmm(indptr, indices, q, 0.037))


@pytest.mark.parametrize("heads,dim", [(1, 1), (1, 17), (2, 3), (4, 8), (8, 16), (3, 129)])
@pytest.mark.parametrize("wshape", ["e", "e1", "eh", "eh1"])
@pytest.mark.parametrize("with_eids", [False, True])
def test_qspmm_weighted_csr_order(heads: int, dim: int, wshape: str, with_eids: bool) -> None:
    g = _gen(heads * 100 + dim)
    indptr, indices = _graph(60, 40, "power", g, torch.int64)
    nnz = indices.numel()
    q = torch.randint(-128, 128, (40, heads, dim), generator=g, dtype=torch.int8)
    shape = {"e": (nnz,), "e1": (nnz, 1), "eh": (nnz, heads), "eh1": (nnz, heads, 1)}[wshape]
    weight = torch.randn(shape, generator=g)
    eids = torch.randperm(nnz, generator=g) if with_eids else None
    got = EXT.qspmm(
        indptr.to(DEV),
        indices.to(DEV),
        q.to(DEV),
        0.25 / 3,
        weight.to(DEV),
        None if eids is None else eids.to(DEV),
    )
    _exact(got, _csr_order_weighted(indptr, indices, q, 0.25 / 3, weight, eids))
    ref = sparse_ops.reference_qspmm(indptr, indices, q, 0.25 / 3, weight, eids)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_qspmm_incidence_mixed_indices_and_edges() -> None:
    g = _gen(11)
    indptr, eids = _graph(30, 0, "uniform", g, torch.int32)
    nnz = int(indptr[-1])
    eids = torch.randperm(nnz, generator=g).to(torch.int64)  # int32 indptr, int64 eids
    q_edges = torch.randint(-128, 128, (nnz, 4, 2), generator=g, dtype=torch.int8)
    got = sparse_ops.qspmm_incidence(indptr.to(DEV), eids.to(DEV), q_edges.to(DEV), 0.5)
    _exact(got, sparse_ops.reference_qspmm(indptr, eids, q_edges, 0.5))
    # empty graph: no rows, no entries
    empty = EXT.qspmm(
        torch.zeros(1, dtype=torch.int64, device=DEV),
        torch.zeros(0, dtype=torch.int64, device=DEV),
        torch.zeros((0, 5), dtype=torch.int8, device=DEV),
        1.0,
    )
    assert empty.shape == (0, 5)
    # rows but no entries
    none = EXT.qspmm(
        torch.zeros(4, dtype=torch.int32, device=DEV),
        torch.zeros(0, dtype=torch.int32, device=DEV),
        torch.zeros((3, 5), dtype=torch.int8, device=DEV),
        1.0,
    )
    _exact(none, torch.zeros(3, 5))


def test_qspmm_long_row_and_dispatch() -> None:
    g = _gen(12)
    indptr = torch.tensor([0, 5000, 5000, 5003])
    indices = torch.randint(0, 100, (5003,), generator=g)
    q = torch.full((100, 33), -128, dtype=torch.int8)
    dispatch.reset()
    got = sparse_ops.qspmm(indptr.to(DEV), indices.to(DEV), q.to(DEV), 0.5)
    assert dispatch.snapshot()["spmm"] == {"ext-cuda": 1}
    _exact(got, sparse_ops.reference_qspmm(indptr, indices, q, 0.5))


def test_qspmm_errors() -> None:
    ip = torch.tensor([0, 2], device=DEV)
    q = torch.zeros((3, 4), dtype=torch.int8, device=DEV)
    with pytest.raises(ValueError, match="outside"):
        EXT.qspmm(ip, torch.tensor([0, 3], device=DEV), q, 1.0)
    with pytest.raises(ValueError, match="indptr"):
        EXT.qspmm(torch.tensor([0, 3], device=DEV), torch.tensor([0, 1], device=DEV), q, 1.0)
    with pytest.raises(ValueError, match="outside"):
        EXT.qspmm(
            ip,
            torch.tensor([0, 1], device=DEV),
            q,
            1.0,
            torch.ones(2, device=DEV),
            torch.tensor([0, 2], device=DEV),
        )
    with pytest.raises(ValueError, match="CUDA"):
        EXT.qspmm(ip.cpu(), torch.tensor([0, 1]), q.cpu(), 1.0)
    with pytest.raises(TypeError, match="int8"):
        EXT.qspmm(ip, torch.tensor([0, 1], device=DEV), q.float(), 1.0)
    with pytest.raises(TypeError, match="int32 or int64"):
        EXT.qspmm(ip.float(), torch.tensor([0, 1], device=DEV), q, 1.0)
    with pytest.raises(ValueError, match="weight"):
        EXT.qspmm(ip, torch.tensor([0, 1], device=DEV), q, 1.0, torch.ones(2, 3, device=DEV))


@pytest.mark.parametrize("op", SDDMM_OPS)
@pytest.mark.parametrize(
    "trailing",
    [
        (1,),
        (3,),
        (5,),
        (17,),
        (33,),
        (127,),
        (129,),
        (128,),
        (4, 1),
        (8, 2),
        (2, 17),
        (4, 16),
        (3, 256),
    ],
)
@pytest.mark.parametrize("itype", [torch.int32, torch.int64])
def test_qsddmm_matches_reference(op: str, trailing, itype) -> None:
    g = _gen(sum(trailing) + len(op))
    ql = torch.randint(-128, 128, (37, *trailing), generator=g, dtype=torch.int8)
    qr = torch.randint(-128, 128, (23, *trailing), generator=g, dtype=torch.int8)
    li = torch.randint(0, 37, (301,), generator=g).to(itype)
    ri = torch.randint(0, 23, (301,), generator=g).to(torch.int32)  # mixed index types
    sl, sr = 0.0317, 0.77
    got = EXT.qsddmm(op, ql.to(DEV), sl, li.to(DEV), qr.to(DEV), sr, ri.to(DEV))
    _exact(got, reference_qsddmm(op, ql, sl, li, qr, sr, ri))


def test_qsddmm_empty_constant_and_errors() -> None:
    q = torch.full((4, 8), -128, dtype=torch.int8)
    idx = torch.tensor([0, 3, 3])
    for op in SDDMM_OPS:
        got = EXT.qsddmm(op, q.to(DEV), 0.5, idx.to(DEV), q.to(DEV), 0.25, idx.to(DEV))
        _exact(got, reference_qsddmm(op, q, 0.5, idx, q, 0.25, idx))
        e = torch.zeros(0, dtype=torch.int64)
        got = EXT.qsddmm(op, q.to(DEV), 0.5, e.to(DEV), q.to(DEV), 0.25, e.to(DEV))
        assert got.shape == reference_qsddmm(op, q, 0.5, e, q, 0.25, e).shape
    dispatch.reset()
    sparse_ops.qsddmm("dot", q.to(DEV), 0.5, idx.to(DEV), q.to(DEV), 0.25, idx.to(DEV))
    assert dispatch.snapshot()["sddmm"] == {"ext-cuda": 1}
    qd = q.to(DEV)
    with pytest.raises(ValueError, match="outside"):
        EXT.qsddmm(
            "add", qd, 1.0, torch.tensor([4], device=DEV), qd, 1.0, torch.tensor([0], device=DEV)
        )
    with pytest.raises(ValueError, match="op"):
        EXT.qsddmm("div", qd, 1.0, idx.to(DEV), qd, 1.0, idx.to(DEV))
    with pytest.raises(ValueError, match="CUDA"):
        EXT.qsddmm("add", q, 1.0, idx, q, 1.0, idx)
    with pytest.raises(TypeError, match="int8"):
        EXT.qsddmm("add", qd.float(), 1.0, idx.to(DEV), qd, 1.0, idx.to(DEV))
