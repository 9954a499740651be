"""The Python fronts of quantized SpMM / SDDMM (qtrain.ops.sparse) and their references.

The ops themselves (torch.ops.qtrain.qspmm / qsddmm) are tested against the references
on every device in tests/ops/test_qspmm.py and tests/ops/test_qsddmm.py. Here: which
backend the fronts choose and count, that the reference path refuses the inputs the ops
refuse with the same exceptions, that the compiled path does not wait for the GPU, and
that the forms match DGL's message passing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from qtrain.ops import backends, dispatch
from qtrain.ops.quantize import quantize
from qtrain.ops.sparse import (
    SDDMM_OPS,
    qsddmm,
    qspmm,
    qspmm_incidence,
    reference_qsddmm,
    reference_qspmm,
)

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _ext(device: str) -> str:
    """The compiled backend of ``device``; the library must be built (no skip)."""
    backend = "ext-cuda" if device == "cuda" else "ext-cpu"
    assert backends.available(backend), backends.error(backend)
    return backend


def _graph(device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr, indices, eids) of a small random CSR graph with empty rows."""
    g = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, 5, (12,), generator=g)
    indptr = torch.zeros(13, dtype=torch.int64)
    indptr[1:] = deg.cumsum(0)
    nnz = int(indptr[-1])
    indices = torch.randint(0, 10, (nnz,), generator=g)
    eids = torch.randperm(nnz, generator=g)
    return indptr.to(device), indices.to(device), eids.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_auto_uses_ext_and_counts(device: str) -> None:
    ext = _ext(device)
    indptr, indices, _ = _graph(device)
    q = torch.ones(10, 4, dtype=torch.int8, device=device)
    dispatch.reset()
    qspmm(indptr, indices, q, 1.0)
    qspmm_incidence(indptr, indices, q, 1.0)
    qsddmm("dot", q, 1.0, indices, q, 1.0, indices)
    qspmm(indptr, indices, q, 1.0, backend="reference")
    qsddmm("add", q, 1.0, indices, q, 1.0, indices, backend=ext)
    snap = dispatch.snapshot()
    assert snap["spmm"] == {ext: 2, "reference": 1}
    assert snap["sddmm"] == {ext: 2}
    assert dispatch.fallbacks() == []


def test_backend_must_match_the_device() -> None:
    _ext("cpu")
    indptr, indices, _ = _graph("cpu")
    q = torch.ones(10, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match="cannot run on a cpu tensor"):
        qspmm(indptr, indices, q, 1.0, backend="ext-cuda")
    with pytest.raises(ValueError, match="cannot run on a cpu tensor"):
        qsddmm("add", q, 1.0, indices, q, 1.0, indices, backend="ext-cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        qspmm(indptr, indices, q, 1.0, backend="fast")


@pytest.mark.parametrize("device", DEVICES)
def test_front_agrees_with_reference(device: str) -> None:
    """Both paths of each front, on the device (the reference runs there too)."""
    ext = _ext(device)
    indptr, indices, eids = _graph(device, seed=3)
    x = torch.randn(10, 2, 5, generator=torch.Generator().manual_seed(1)).to(device)
    q, scale = quantize(x, 8)
    w = torch.rand(indices.numel(), 2, generator=torch.Generator().manual_seed(2)).to(device)
    qe, se = quantize(w[:, :, None], 6)  # edge data for the incidence form
    for backend in (ext, "reference"):
        got = qspmm(indptr, indices, q, scale, backend=backend)
        assert got.device.type == device
        assert torch.equal(got.cpu(), reference_qspmm(indptr, indices, q, scale).cpu())
        got = qspmm(indptr, indices, q, scale, w, eids, backend=backend)
        want = reference_qspmm(indptr, indices, q, scale, w, eids)
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-6)
        got = qspmm_incidence(indptr, eids, qe, se, backend=backend)
        assert torch.equal(got.cpu(), reference_qspmm(indptr, eids, qe, se).cpu())
        for op in SDDMM_OPS:
            got = qsddmm(op, q, scale, indices, q, scale, eids % 10, backend=backend)
            want = reference_qsddmm(op, q, scale, indices, q, scale, eids % 10)
            assert torch.equal(got.cpu(), want.cpu()), (backend, op)


def _spmm_bad(device: str) -> dict[str, tuple[Callable[[], tuple[Any, ...]], type[Exception], str]]:
    """Inputs the op refuses: name -> (arguments, exception, message pattern)."""
    other = "meta" if device == "cpu" else "cpu"

    def i64(*v: int) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int64, device=device)

    ip, ix = i64(0, 2, 3), i64(0, 1, 1)
    q = torch.ones(2, 4, dtype=torch.int8, device=device)
    q3 = torch.ones(2, 3, 4, dtype=torch.int8, device=device)
    w = torch.ones(3, device=device)
    return {
        "q float": (lambda: (ip, ix, q.float(), 1.0), TypeError, "q must be int8"),
        "q 1-d": (lambda: (ip, ix, q[0], 1.0), ValueError, "q must have shape"),
        "indptr float": (lambda: (ip.float(), ix, q, 1.0), TypeError, "int32 or int64"),
        "indices 2-d": (lambda: (ip, ix[None], q, 1.0), ValueError, "1-d"),
        "indices sparse": (lambda: (ip, ix.to_sparse(), q, 1.0), ValueError, "dense"),
        "indices device": (lambda: (ip, ix.to(other), q, 1.0), ValueError, "indices is on"),
        "indptr empty": (lambda: (ip[:0], ix, q, 1.0), ValueError, "at least one entry"),
        "eids length": (lambda: (ip, ix, q, 1.0, w, ix[:2]), ValueError, "eids has"),
        "eids dtype": (lambda: (ip, ix, q, 1.0, w, ix.float()), TypeError, "int32 or int64"),
        "weight shape": (
            lambda: (ip, ix, q3, 1.0, torch.ones(3, 2, device=device)),
            ValueError,
            "weight must have shape",
        ),
        "weight complex": (lambda: (ip, ix, q, 1.0, w.to(torch.complex64)), TypeError, "real"),
        "weight rows": (lambda: (ip, ix, q, 1.0, w[:2]), ValueError, "rows but there are"),
        "weight device": (lambda: (ip, ix, q, 1.0, w.to(other)), ValueError, "weight is on"),
        "indptr start": (lambda: (i64(1, 2, 3), ix, q, 1.0), ValueError, "indptr"),
        "indptr end": (lambda: (i64(0, 2, 4), ix, q, 1.0), ValueError, "indptr"),
        "indptr decreasing": (lambda: (i64(0, 2, 1, 3), ix, q, 1.0), ValueError, "indptr"),
        "no rows": (lambda: (i64(0), ix, q, 1.0), ValueError, "indptr"),
        "index too large": (lambda: (ip, i64(0, 1, 2), q, 1.0), ValueError, "outside"),
        "index negative": (lambda: (ip, i64(0, -1, 1), q, 1.0), ValueError, "outside"),
        "eid too large": (lambda: (ip, ix, q, 1.0, w, i64(0, 1, 3)), ValueError, "rows of weight"),
        "eid negative": (lambda: (ip, ix, q, 1.0, w, i64(0, -1, 1)), ValueError, "rows of weight"),
    }


def _sddmm_bad(
    device: str,
) -> dict[str, tuple[Callable[[], tuple[Any, ...]], type[Exception], str]]:
    other = "meta" if device == "cpu" else "cpu"
    q = torch.ones(3, 4, dtype=torch.int8, device=device)
    idx = torch.tensor([0, 2], device=device)
    return {
        "op": (lambda: ("div", q, 1.0, idx, q, 1.0, idx), ValueError, "op must be one of"),
        "q_lhs float": (lambda: ("add", q.float(), 1.0, idx, q, 1.0, idx), TypeError, "int8"),
        "q_rhs 1-d": (lambda: ("add", q, 1.0, idx, q[0], 1.0, idx), ValueError, "shape"),
        "index float": (lambda: ("add", q, 1.0, idx.float(), q, 1.0, idx), TypeError, "int32"),
        "index 2-d": (lambda: ("add", q, 1.0, idx, q, 1.0, idx[None]), ValueError, "1-d"),
        "q_rhs device": (lambda: ("add", q, 1.0, idx, q.to(other), 1.0, idx), ValueError, "is on"),
        "trailing": (lambda: ("add", q, 1.0, idx, q[:, :2], 1.0, idx), ValueError, "trailing"),
        "lengths": (lambda: ("add", q, 1.0, idx, q, 1.0, idx[:1]), ValueError, "entries"),
        "too large": (lambda: ("dot", q, 1.0, idx, q, 1.0, idx + 1), ValueError, "outside"),
        "negative": (lambda: ("mul", q, 1.0, idx - 1, q, 1.0, idx), ValueError, "outside"),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(_spmm_bad("cpu")))
def test_spmm_reference_refuses_what_the_op_refuses(device: str, case: str) -> None:
    ext = _ext(device)
    args, error, match = _spmm_bad(device)[case]
    for backend in (ext, "reference"):
        with pytest.raises(error, match=match):
            qspmm(*args(), backend=backend)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(_sddmm_bad("cpu")))
def test_sddmm_reference_refuses_what_the_op_refuses(device: str, case: str) -> None:
    ext = _ext(device)
    args, error, match = _sddmm_bad(device)[case]
    for backend in (ext, "reference"):
        with pytest.raises(error, match=match):
            qsddmm(*args(), backend=backend)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_fronts_do_not_sync() -> None:
    """The compiled path reads no tensor data on the host (only the kernels' own flag read)."""
    _ext("cuda")
    indptr, indices, eids = _graph("cuda")
    q = torch.ones(10, 4, dtype=torch.int8, device="cuda")
    w = torch.ones(indices.numel(), device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        qspmm(indptr, indices, q, 0.5, w, eids)
        qsddmm("dot", q, 0.5, indices, q, 0.25, indices)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_matches_dgl_message_passing() -> None:
    """The in-CSR of a DGL graph is g.adj_tensors('csc'): (indptr over dst, src, eids)."""
    _ext("cpu")
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
