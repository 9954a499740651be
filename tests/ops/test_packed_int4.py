"""pack_int4 / unpack_int4 and qspmm4 (issue 32, packed 4-bit storage) on every device:
pack and unpack against the references (qtrain.quant.packed), bytes and values exact;
qspmm4 bit for bit qspmm of the unpacked rows (the same body reading nibbles) on every
form, width, graph shape, thread count and ISA variant; the Python fronts (per-row scales,
dispatch); opcheck; the fake kernels' shapes; every error path."""

from __future__ import annotations

import math

import pytest
import torch
from sparse_cases import INDEX_DTYPES, csr
from support import DEVICES, ErrorCase, assert_same, expect_errors, gen, library, opcheck, variants

from qtrain.ops import dispatch, fakes
from qtrain.ops.packed import pack_int4, unpack_int4
from qtrain.ops.sparse import qspmm, qspmm_packed, reference_qspmm, reference_qspmm4
from qtrain.quant import packed as ref

WIDTHS_PACK = (0, 1, 2, 3, 7, 8, 33, 129)
# odd widths (a half byte at each row's end); 64 / 128 / 600: whole vector tiles, the CUDA
# lane groups and windows (16-bit gathers)
SPMM_WIDTHS = (1, 3, 5, 33, 67, 129, 257, 64, 128, 600)


def _on(device: str, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(device) for t in tensors]


def _int4(shape: tuple[int, ...], seed: int, lo: int = -8) -> torch.Tensor:
    return torch.randint(lo, 8, shape, dtype=torch.int8, generator=gen(seed))


# ---------------------------------------------------------------- pack / unpack


def test_reference_layout() -> None:
    """Value j in byte j // 2, low nibble first, two's complement; odd D: high nibble 0."""
    q = torch.tensor([1, -1, -8, 7, 3], dtype=torch.int8)
    assert ref.pack_int4(q).tolist() == [0xF1, 0x78, 0x03]
    assert torch.equal(ref.unpack_int4(ref.pack_int4(q), 5), q)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", WIDTHS_PACK)
def test_pack_unpack_match_reference(device: str, width: int) -> None:
    ops = library(device)
    for rank, lead in ((1, ()), (2, (5,)), (3, (3, 4))):
        shape = (*lead, width)
        cases = {
            "random": _int4(shape, width + rank),
            "zeros": torch.zeros(shape, dtype=torch.int8),
            "every value": (torch.arange(math.prod(shape)) % 16 - 8).to(torch.int8).reshape(shape),
        }
        for what, q in cases.items():
            want = ref.pack_int4(q)
            assert want.shape == (*lead, (width + 1) // 2) and want.dtype == torch.uint8
            for variant in variants(device):
                got = ops.pack_int4(q.to(device))
                assert_same(got, want, f"{what}, rank {rank}, {variant}")
                assert_same(ops.unpack_int4(got, width), q, f"{what}, rank {rank}, {variant}")
            assert_same(pack_int4(q.to(device)), want, what)
            assert_same(unpack_int4(want.to(device), width), q, what)
            assert_same(ref.unpack_int4(want, width), q, what)


@pytest.mark.parametrize("device", DEVICES)
def test_unpack_every_byte(device: str) -> None:
    """All 256 bytes (the high nibble past an odd width ignored) and a non-contiguous input."""
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
    for width in (31, 32):
        want = ref.unpack_int4(packed, width)
        assert int(want.min()) == -8 and int(want.max()) == 7
        assert_same(library(device).unpack_int4(packed.to(device), width), want)
    t = packed.t().to(device)
    assert_same(library(device).unpack_int4(t, 32), ref.unpack_int4(packed.t().contiguous(), 32))


# ---------------------------------------------------------------- qspmm4 == qspmm(unpacked)


def _check_spmm(device: str, indptr, indices, q, scale, weight=None, eids=None, what=""):
    """qspmm4 of pack_int4(q) equals qspmm of q bit for bit on every variant; and the
    reference of qspmm4 equals reference_qspmm."""
    ops = library(device)
    width = q.shape[-1]
    packed = ref.pack_int4(q)
    ip, ix, qd, pd, wd, ed = _on(device, indptr, indices, q, packed, weight, eids)
    assert_same(
        reference_qspmm4(indptr, indices, packed, width, scale, weight, eids),
        reference_qspmm(indptr, indices, q, scale, weight, eids),
        what,
    )
    # past an odd width the last byte's high nibble is not read: junk there changes nothing
    junk = pd.clone()
    if width % 2 and junk.numel():
        junk[..., -1] |= 0xA0
    for variant in variants(device):
        want = ops.qspmm(ip, ix, qd, scale, wd, ed)
        got = ops.qspmm4(ip, ix, pd, width, scale, wd, ed)
        assert_same(got, want, f"{what}, {variant}")
        assert_same(ops.qspmm4(ip, ix, junk, width, scale, wd, ed), want, f"{what}, junk")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["uniform", "powerlaw", "zeros"])
def test_qspmm4_forms(device: str, kind: str) -> None:
    indptr, indices = csr(47, 31, 5, kind, seed=3)
    nnz = indices.numel()
    for i, width in enumerate(SPMM_WIDTHS):
        q = _int4((31, width), 50 + i, lo=-7 if i % 2 else -8)
        w = torch.randn(nnz, generator=gen(60 + i))
        eids = torch.randperm(nnz, generator=gen(70 + i))
        what = f"{kind}, width {width}"
        _check_spmm(device, indptr, indices, q, 0.375, what=f"copy, {what}")
        _check_spmm(device, indptr, indices, q, 0.25, w, what=f"per-edge, {what}")
        _check_spmm(device, indptr, indices, q, 1.5, w[:, None], eids, what=f"eids, {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_qspmm4_heads(device: str, dtype: torch.dtype) -> None:
    """3-d packed: per-edge and per-head ([E, H]) weights; odd widths start each head on a
    byte."""
    indptr, indices = csr(53, 40, 6, "powerlaw", seed=9, dtype=dtype)
    nnz = indices.numel()
    for i, width in enumerate((1, 3, 4, 5, 8, 33, 64)):
        q = _int4((40, 3, width), 80 + i)
        wh = torch.randn(nnz, 3, generator=gen(90 + i))
        eids = torch.randperm(nnz, generator=gen(95 + i)).to(dtype)
        what = f"width {width}"
        _check_spmm(device, indptr, indices, q, 0.5, what=f"copy, {what}")
        _check_spmm(device, indptr, indices, q, 0.5, wh, what=f"per-head, {what}")
        _check_spmm(device, indptr, indices, q, 0.5, wh[:, :, None], eids, what=f"eids, {what}")
        _check_spmm(device, indptr, indices, q, 0.5, wh[:, 0], eids, what=f"per-edge, {what}")


@pytest.mark.parametrize("device", DEVICES)
def test_qspmm4_hub_rows_and_edge_cases(device: str) -> None:
    """Hubs split across merge-path units (256 items each at this size), empty graphs,
    zero-degree rows, all-zero and constant rows."""
    degrees = [1024, 0, 0, 1, 3, 0, 31, 0, 2, 1500, 0, 1, 1, 0, 0, 5, 64, 0, 700, 0, 3]
    indptr = torch.tensor([0, *torch.tensor(degrees).cumsum(0).tolist()])
    indices = torch.randint(0, 50, (int(indptr[-1]),), generator=gen(21))
    nnz = indices.numel()
    w = torch.randn(nnz, generator=gen(22))
    for width in (7, 128, 257):
        q = _int4((50, width), width)
        _check_spmm(device, indptr, indices, q, 0.375, what=f"hub copy, {width}")
        _check_spmm(device, indptr, indices, q, 0.375, w, what=f"hub weighted, {width}")
        for what, c in (("zeros", 0), ("sevens", 7), ("minus eights", -8)):
            full = torch.full((50, width), c, dtype=torch.int8)
            _check_spmm(device, indptr, indices, full, 0.5, what=f"{what}, {width}")
            _check_spmm(device, indptr, indices, full, 0.5, w, what=f"{what} weighted, {width}")
    empty = torch.zeros(0, dtype=torch.int64)
    q = _int4((4, 5), 1)
    _check_spmm(device, torch.zeros(1, dtype=torch.int64), empty, q, 1.0, what="no rows")
    _check_spmm(device, torch.zeros(4, dtype=torch.int64), empty, q, 1.0, what="no edges")
    _check_spmm(device, torch.zeros(4, dtype=torch.int64), empty, q[:0], 1.0, what="no input")
    _check_spmm(
        device, torch.zeros(3, dtype=torch.int64), empty, q, 1.0, torch.ones(0), what="no edges w"
    )


@pytest.mark.parametrize("device", DEVICES)
def test_qspmm4_threads_on_a_larger_graph(device: str) -> None:
    """Enough work that two CPU threads really split the units."""
    indptr, indices = csr(3000, 2500, 12, "powerlaw", seed=5)
    q = _int4((2500, 67), 5)
    w = torch.randn(indices.numel(), generator=gen(6))
    _check_spmm(device, indptr, indices, q, 0.125, what="copy")
    _check_spmm(device, indptr, indices, q, 0.125, w, what="weighted")


# ---------------------------------------------------------------- the Python front


@pytest.mark.parametrize("device", DEVICES)
def test_qspmm_packed_front(device: str) -> None:
    """Per-row scales (with and without edge weights, 2-d and 3-d, per node and per node and
    head) as qspmm does them; every
    backend; counted as the primitive "spmm"."""
    indptr, indices = csr(40, 30, 5, "powerlaw", seed=2)
    nnz = indices.numel()
    for heads, width in ((1, 9), (2, 5), (1, 64)):
        shape = (30, width) if heads == 1 else (30, heads, width)
        q = _int4(shape, width, lo=-7)
        packed = ref.pack_int4(q)
        s = torch.rand(30, 1, generator=gen(3)) + 0.1
        w = torch.randn(nnz, heads, generator=gen(4))
        eids = torch.randperm(nnz, generator=gen(5))
        ip, ix, qd, pd, sd, wd, ed = _on(device, indptr, indices, q, packed, s, w, eids)
        cases = [(0.5, None, None), (sd, None, None), (sd, wd, ed), (sd, wd, None)]
        if heads > 1:  # one scale per node and head
            (sh,) = _on(device, torch.rand(30, heads, 1, generator=gen(6)) + 0.1)
            cases += [(sh, None, None), (sh, wd, ed)]
        for scale, weight, e in cases:
            want = qspmm(ip, ix, qd, scale, weight, e)
            for backend in ("auto", "reference"):
                got = qspmm_packed(ip, ix, pd, width, scale, weight, e, backend=backend)
                if backend == "auto" or (weight is None and not isinstance(scale, torch.Tensor)):
                    assert_same(got, want, f"{backend}, heads {heads}, width {width}")
                else:  # the reference's float sums run in another order
                    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-5)
    dispatch.reset()
    try:
        qspmm_packed(ip, ix, pd, 64, 0.5)
        qspmm_packed(ip, ix, pd, 64, 0.5, backend="reference")
        pack_int4(qd)
        unpack_int4(pd, 64)
        kernel = "ext-cuda" if device == "cuda" else "ext-cpu"
        assert dispatch.snapshot() == {
            "spmm": {kernel: 1, "reference": 1},
            "pack_int4": {kernel: 1},
            "unpack_int4": {kernel: 1},
        }
    finally:
        dispatch.reset()


# ---------------------------------------------------------------- opcheck, fakes


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    indptr, indices = csr(20, 15, 3, "powerlaw", seed=4)
    nnz = indices.numel()
    q = _int4((15, 2, 5), 4)
    packed = ref.pack_int4(q)
    w = torch.randn(nnz, 2, generator=gen(4))
    eids = torch.randperm(nnz, generator=gen(5))
    row_scale = torch.rand(15, 2, generator=gen(6))
    ip, ix, qd, pd, wd, ed, rd = _on(device, indptr, indices, q, packed, w, eids, row_scale)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    for args in (
        (ip, ix, pd, 5, 0.5, None, None),
        (ip, ix, pd, 5, 0.25, wd, ed),
        (ip, ix, pd[:, 0], 5, 0.125, wd[:, 0], None),
        (ip[:1], empty, pd[:0], 5, 1.0, None, None),
        (ip, ix, pd, 5, 1.0, None, None, rd),
        (ip, ix, pd, 5, 1.0, wd[:, :1], ed, rd[:, :1]),
        (ip, ix, pd[:, 0], 5, 1.0, None, None, rd[:, 0]),
    ):
        opcheck(ops.qspmm4.default, args)
    for x in (qd, qd[:, 0], qd[0, 0], qd[:0], qd[..., :0]):
        opcheck(ops.pack_int4.default, (x,))
    for x, width in ((pd, 5), (pd, 6), (pd[:, 0], 5), (pd[0, 0], 6), (pd[..., :0], 0)):
        opcheck(ops.unpack_int4.default, (x, width))


def test_fake_shapes() -> None:
    meta = torch.device("meta")
    ip = torch.zeros(8, dtype=torch.int64, device=meta)
    ix = torch.zeros(20, dtype=torch.int64, device=meta)
    p2 = torch.empty(10, 3, dtype=torch.uint8, device=meta)
    p3 = torch.empty(10, 4, 3, dtype=torch.uint8, device=meta)
    out = fakes.qspmm4(ip, ix, p2, 5, 1.0)
    assert out.shape == (7, 5) and out.dtype == torch.float32
    assert fakes.qspmm4(ip, ix, p3, 6, 1.0).shape == (7, 4, 6)
    q = torch.empty(2, 3, 7, dtype=torch.int8, device=meta)
    packed = fakes.pack_int4(q)
    assert packed.shape == (2, 3, 4) and packed.dtype == torch.uint8
    un = fakes.unpack_int4(packed, 7)
    assert un.shape == (2, 3, 7) and un.dtype == torch.int8


# ---------------------------------------------------------------- errors

SETUP = (
    "i64 = lambda *v: torch.tensor(v, dtype=torch.int64, device=dev)\n"
    "ip, ix = i64(0, 2, 3), i64(0, 1, 1)\n"
    "p = torch.zeros(2, 3, dtype=torch.uint8, device=dev)\n"
    "w = torch.ones(3, device=dev)\n"
    "q = torch.zeros(2, 5, dtype=torch.int8, device=dev)\n"
    "from qtrain.ops.packed import pack_int4, unpack_int4\n"
    "from qtrain.ops.sparse import qspmm_packed, reference_qspmm4\n"
)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    rng = r"pack_int4: every value of q must be in \[-8, 7\]"
    wid = r"width must satisfy ceil\(width / 2\) == packed.size\(-1\)"
    cases = []
    for v in (8, -9, 127, -128):
        for call in ("ops.pack_int4", "pack_int4", "lambda t: pack_int4(t, backend='reference')"):
            cases.append(
                ErrorCase(
                    f"{call} value {v}",
                    f"q[1, 4] = {v}; ({call})(q)",
                    "ValueError",
                    rng,
                )
            )
    for width in (4, 7, -1, 0):
        cases += [
            ErrorCase(
                f"raw unpack width {width}", f"ops.unpack_int4(p, {width})", "ValueError", wid
            ),
            ErrorCase(f"unpack width {width}", f"unpack_int4(p, {width})", "ValueError", wid),
            ErrorCase(
                f"raw qspmm4 width {width}",
                f"ops.qspmm4(ip, ix, p, {width}, 1.0)",
                "ValueError",
                wid,
            ),
            ErrorCase(
                f"qspmm_packed width {width}",
                f"qspmm_packed(ip, ix, p, {width}, 1.0, backend='reference')",
                "ValueError",
                wid,
            ),
        ]
    cases += [
        ErrorCase("raw pack int32", "ops.pack_int4(q.int())", "TypeError", "q must be int8"),
        ErrorCase("pack uint8", "pack_int4(p)", "TypeError", "q must be int8, got uint8"),
        ErrorCase("raw pack 0-d", "ops.pack_int4(q[0, 0])", "ValueError", "at least one dim"),
        ErrorCase("raw unpack int8", "ops.unpack_int4(q, 10)", "TypeError", "packed must be uint8"),
        ErrorCase("unpack int8", "unpack_int4(q, 10)", "TypeError", "packed must be uint8"),
        ErrorCase("raw unpack 0-d", "ops.unpack_int4(p[0, 0], 1)", "ValueError", "at least one"),
        ErrorCase(
            "raw qspmm4 int8", "ops.qspmm4(ip, ix, q, 10, 1.0)", "TypeError", "packed must be uint8"
        ),
        ErrorCase(
            "raw qspmm4 1-d", "ops.qspmm4(ip, ix, p[0], 6, 1.0)", "ValueError", "packed must have"
        ),
        ErrorCase(
            "raw qspmm4 device",
            "ops.qspmm4(ip, ix, p.to(other), 6, 1.0)",
            "ValueError",
            "packed is on",
        ),
        ErrorCase(
            "raw qspmm4 row_scale rows",
            "ops.qspmm4(ip, ix, p, 6, 1.0, None, None, torch.ones(3, device=dev))",
            "ValueError",
            r"qspmm4: row_scale must have shape \[2\], \[2, 1\]",
        ),
        ErrorCase(
            "raw qspmm4 row_scale dtype",
            "ops.qspmm4(ip, ix, p, 6, 1.0, w, None, torch.ones(2, dtype=torch.float16, device=dev))",
            "TypeError",
            "row_scale must be float32, got float16",
        ),
        ErrorCase(
            "qspmm4 reference row_scale rows",
            "reference_qspmm4(ip, ix, p, 6, 1.0, None, None, torch.ones(3, device=dev))",
            "ValueError",
            r"qspmm4: row_scale must have shape \[2\], \[2, 1\]",
        ),
        ErrorCase(
            "raw qspmm4 weight shape",
            "ops.qspmm4(ip, ix, p, 6, 1.0, torch.ones(3, 2, device=dev))",
            "ValueError",
            "weight must have shape",
        ),
        ErrorCase(
            "raw qspmm4 index",
            "ops.qspmm4(ip, i64(0, 2, 1), p, 6, 1.0)",
            "ValueError",
            r"qspmm4: an entry of indices is outside \[0, 2\) \(rows of packed\)",
        ),
        ErrorCase(
            "raw qspmm4 index weighted",
            "ops.qspmm4(ip, i64(0, -1, 1), p, 5, 1.0, w)",
            "ValueError",
            r"indices is outside \[0, 2\)",
        ),
        ErrorCase(
            "raw qspmm4 eid",
            "ops.qspmm4(ip, ix, p, 5, 1.0, w, i64(0, 3, 1))",
            "ValueError",
            r"eids outside \[0, 3\)",
        ),
        ErrorCase(
            "raw qspmm4 indptr",
            "ops.qspmm4(i64(0, 2, 4), ix, p, 5, 1.0)",
            "ValueError",
            "indptr",
        ),
        ErrorCase(
            "qspmm_packed reference index",
            "qspmm_packed(ip, i64(0, 2, 1), p, 6, 1.0, backend='reference')",
            "ValueError",
            r"qspmm4: an entry of indices is outside \[0, 2\) \(rows of packed\)",
        ),
        ErrorCase(
            "qspmm_packed row scales index",
            "qspmm_packed(ip, i64(0, 2, 1), p, 6, torch.ones(2, device=dev), w)",
            "ValueError",
            r"indices is outside \[0, 2\)",
        ),
        ErrorCase(
            "qspmm_packed row scales shape",
            "qspmm_packed(ip, ix, p, 6, torch.ones(3, device=dev))",
            "ValueError",
            "one per row",
        ),
    ]
    expect_errors(cases, device, setup=SETUP)
