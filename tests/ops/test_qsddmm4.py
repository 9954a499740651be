"""qsddmm4 (issue 32, packed 4-bit storage) on every device: bit for bit qsddmm of the
unpacked rows for every op, width (odd ones: each head starts on a byte, the high nibble
past the width is never read), head count, index dtype, row scales, thread count and ISA
variant; its reference equal to reference_qsddmm of the unpacked rows; edge cases (no
edges, all-zero and constant rows, dots longer than one int32 partial sum); the Python
front (per-row scales, dispatch); opcheck; the fake kernel's shapes; every error path."""

from __future__ import annotations

import pytest
import torch
from sparse_cases import INDEX_DTYPES, q_shape
from support import DEVICES, ErrorCase, assert_same, expect_errors, gen, library, opcheck, variants

from qtrain.ops import dispatch, fakes
from qtrain.ops.sparse import (
    SDDMM_OPS,
    qsddmm,
    qsddmm_packed,
    reference_qsddmm,
    reference_qsddmm4,
)
from qtrain.quant import packed as ref

# odd widths (a half byte at each head's end; 7, 15, 31, 63: the padded last byte would end
# a whole vector of 4, 8 or 16 bytes), the vector tiles and the CUDA 32-bit words (8 values)
WIDTHS = (1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 67, 128)


def _int4(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(-8, 8, shape, dtype=torch.int8, generator=g)


def _with_junk_padding(packed: torch.Tensor, width: int, g: torch.Generator) -> torch.Tensor:
    """``packed`` with random high nibbles past an odd width (values the op must not read)."""
    if width % 2 == 0 or packed.shape[-1] == 0:
        return packed
    out = packed.clone()
    junk = torch.randint(1, 16, out[..., -1].shape, dtype=torch.uint8, generator=g)
    out[..., -1] |= junk << 4
    return out


def _check(
    device: str,
    op: str,
    ql: torch.Tensor,
    sl: float,
    li: torch.Tensor,
    qr: torch.Tensor,
    sr: float,
    ri: torch.Tensor,
    rsl: torch.Tensor | None = None,
    rsr: torch.Tensor | None = None,
    junk: torch.Generator | None = None,
    what: str = "",
) -> None:
    """qsddmm4 of the packed rows equals qsddmm of the int8 rows bit for bit in every
    variant, and reference_qsddmm4 equals reference_qsddmm."""
    ops = library(device)
    width = ql.shape[-1]
    pl, pr = ref.pack_int4(ql), ref.pack_int4(qr)
    if junk is not None:
        pl, pr = _with_junk_padding(pl, width, junk), _with_junk_padding(pr, width, junk)
    want = reference_qsddmm(op, ql, sl, li, qr, sr, ri, rsl, rsr)
    assert_same(reference_qsddmm4(op, pl, sl, li, pr, sr, ri, width, rsl, rsr), want, what)
    on = [None if t is None else t.to(device) for t in (ql, qr, pl, pr, li, ri, rsl, rsr)]
    qld, qrd, pld, prd, lid, rid, rld, rrd = on
    for variant in variants(device):
        int8 = ops.qsddmm(op, qld, sl, lid, qrd, sr, rid, rld, rrd)
        assert_same(int8, want, f"qsddmm {variant}, {what}")
        got = ops.qsddmm4(op, pld, sl, lid, prd, sr, rid, width, rld, rrd)
        assert_same(got, want, f"qsddmm4 {variant}, {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_matches_unpacked(device: str, op: str, heads: int, dtype: torch.dtype) -> None:
    g = gen(heads + 10 * len(op))
    n_l, n_r, n_e = 31, 23, 211
    li = torch.randint(0, n_l, (n_e,), generator=g).to(dtype)
    ri = torch.randint(0, n_r, (n_e,), generator=g)  # int64: mixed with int32 li
    for width in WIDTHS:
        ql = _int4(q_shape(n_l, heads, width), g)
        qr = _int4(q_shape(n_r, heads, width), g)
        what = f"width {width}"
        _check(device, op, ql, 0.375, li, qr, 1.25, ri, junk=g, what=what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
@pytest.mark.parametrize("heads", [1, 4])
def test_row_scales(device: str, op: str, heads: int) -> None:
    """Row scales per row and per row and head, on either side or both, over six decades
    with all-zero rows."""
    g = gen(40 + heads)
    n_l, n_r, n_e = 19, 27, 173
    li = torch.randint(0, n_l, (n_e,), generator=g)
    ri = torch.randint(0, n_r, (n_e,), generator=g).to(torch.int32)
    shapes = [(), (1,)] + ([(heads,)] if heads > 1 else [])
    for width in (1, 5, 16, 33, 64):
        ql = _int4(q_shape(n_l, heads, width), g)
        qr = _int4(q_shape(n_r, heads, width), g)
        for shape in shapes:
            rsl = 10.0 ** (torch.rand((n_l, *shape), generator=g) * 6 - 3)
            rsr = 10.0 ** (torch.rand((n_r, *shape), generator=g) * 6 - 3)
            rsl[::4], rsr[1::5] = 0.0, 0.0
            for sides, (a, b) in {
                "lhs": (rsl, None),
                "rhs": (None, rsr),
                "both": (rsl, rsr),
            }.items():
                what = f"width {width}, row scales {shape} on {sides}"
                _check(device, op, ql, 0.75, li, qr, 0.3, ri, a, b, junk=g, what=what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
def test_edge_cases(device: str, op: str) -> None:
    """No edges (and no rows), zero-width heads, all-zero and constant rows (-8 and 7 at
    every value: the largest products), power-law hubs (one row read by most edges)."""
    g = gen(7)
    empty = torch.zeros(0, dtype=torch.int64)
    q = _int4((6, 2, 9), g)
    _check(device, op, q, 0.5, empty, q, 0.5, empty, what="no edges")
    _check(device, op, q[:0], 0.5, empty, q[:0], 0.5, empty, what="no rows")
    idx = torch.randint(0, 6, (40,), generator=g)
    _check(device, op, q[..., :0], 0.5, idx, q[..., :0], 0.5, idx, what="width 0")
    for c_l, c_r in ((0, 5), (-8, -8), (7, -8), (7, 7)):
        for width in (3, 64):
            ql = torch.full((6, 2, width), c_l, dtype=torch.int8)
            qr = torch.full((6, 2, width), c_r, dtype=torch.int8)
            _check(device, op, ql, 0.5, idx, qr, 2.0, idx, what=f"{c_l} and {c_r}, {width}")
    hub = torch.where(torch.rand(500, generator=g) < 0.9, 0, torch.randint(0, 50, (500,)))
    ql, qr = _int4((50, 4, 32), g), _int4((50, 4, 32), g)
    _check(device, op, ql, 0.25, hub, qr, 0.5, hub.flip(0), what="hub")


@pytest.mark.parametrize("device", DEVICES)
def test_long_dots(device: str) -> None:
    """Heads longer than one int32 partial sum (2^17 values), odd length, at the largest
    products: the int64 sums of the dot."""
    width = (1 << 17) + 3
    idx = torch.tensor([0, 1, 1, 0])
    for c in (-8, 7):
        q = torch.full((2, width), c, dtype=torch.int8)
        q[1, ::3] = -8
        _check(device, "dot", q, 1.0, idx, q, 0.5, idx.flip(0), what=f"constant {c}")


@pytest.mark.parametrize("device", DEVICES)
def test_threads_on_a_larger_graph(device: str) -> None:
    """Enough edges that two CPU threads really split them (GAT's [N, 4, 64] rows)."""
    g = gen(11)
    li = torch.randint(0, 900, (6000,), generator=g)
    ri = torch.randint(0, 700, (6000,), generator=g)
    ql, qr = _int4((900, 4, 64), g), _int4((700, 4, 64), g)
    rsl = torch.rand(900, 4, generator=g)
    _check(device, "dot", ql, 1.0, li, qr, 0.5, ri, rsl, None, what="dot")
    _check(device, "mul", ql, 1.0, li, qr, 0.5, ri, what="mul")


# ---------------------------------------------------------------- the Python front


@pytest.mark.parametrize("device", DEVICES)
def test_qsddmm_packed_front(device: str) -> None:
    """Per-tensor and per-row (per node, per node and head) scales as qsddmm takes them,
    every backend bit for bit; counted as the primitive "sddmm"."""
    g = gen(12)
    li = torch.randint(0, 30, (120,), generator=g)
    ri = torch.randint(0, 20, (120,), generator=g)
    for heads, width in ((1, 9), (3, 5), (4, 64)):
        ql = _int4(q_shape(30, heads, width), g)
        qr = _int4(q_shape(20, heads, width), g)
        on = [t.to(device) for t in (ql, qr, ref.pack_int4(ql), ref.pack_int4(qr), li, ri)]
        qld, qrd, pld, prd, lid, rid = on
        per_node_l = (torch.rand(30, 1, generator=g) + 0.1).to(device)
        per_head_r = (torch.rand(20, heads, 1, generator=g) + 0.1).to(device)
        for sl, sr in ((0.5, 0.25), (per_node_l, 0.5), (per_node_l, per_head_r)):
            for op in SDDMM_OPS:
                want = qsddmm(op, qld, sl, lid, qrd, sr, rid)
                for backend in ("auto", "reference"):
                    got = qsddmm_packed(op, pld, sl, lid, prd, sr, rid, width, backend)
                    assert_same(got, want, f"{op}, {backend}, heads {heads}, width {width}")
    dispatch.reset()
    try:
        qsddmm_packed("dot", pld, 0.5, lid, prd, 0.5, rid, 64)
        qsddmm_packed("dot", pld, 0.5, lid, prd, 0.5, rid, 64, backend="reference")
        kernel = "ext-cuda" if device == "cuda" else "ext-cpu"
        assert dispatch.snapshot() == {"sddmm": {kernel: 1, "reference": 1}}
    finally:
        dispatch.reset()


# ---------------------------------------------------------------- opcheck, fakes


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    g = gen(2)
    pl = ref.pack_int4(_int4((9, 4, 5), g)).to(device)
    pr = ref.pack_int4(_int4((6, 4, 5), g)).to(device)
    li = torch.randint(0, 9, (20,), generator=g).to(device)
    ri = torch.randint(0, 6, (20,), generator=g).to(torch.int32).to(device)
    rs_l = torch.rand(9, 4, generator=g).to(device)
    rs_r = torch.rand(6, 4, generator=g).to(device)
    for args in (
        ("dot", pl, 0.5, li, pr, 0.25, ri, 5),
        ("dot", pl, 0.5, li, pr, 0.25, ri, 6),
        ("add", pl[:, 0], 0.5, li, pr[:, 0], 0.25, ri, 5),
        ("mul", pl, 0.5, li.int(), pr, 2.0, ri, 5),
        ("sub", pl, 1.0, li[:0], pr, 1.0, ri[:0], 6),
        ("dot", pl, 1.0, li, pr, 1.0, ri, 5, rs_l, rs_r),
        ("add", pl, 0.5, li, pr, 1.0, ri, 5, rs_l[:, :1], None),
        ("mul", pl[:, 0], 1.0, li, pr[:, 0], 2.0, ri, 6, None, rs_r[:, 0]),
    ):
        opcheck(ops.qsddmm4.default, args)


def test_fake_shapes() -> None:
    meta = torch.device("meta")
    idx = torch.zeros(20, dtype=torch.int64, device=meta)
    p2 = torch.empty(10, 3, dtype=torch.uint8, device=meta)
    p3 = torch.empty(10, 4, 3, dtype=torch.uint8, device=meta)
    for op in ("add", "sub", "mul"):
        out = fakes.qsddmm4(op, p2, 1.0, idx, p2, 1.0, idx, 5)
        assert out.shape == (20, 5) and out.dtype == torch.float32
        assert fakes.qsddmm4(op, p3, 1.0, idx, p3, 1.0, idx, 6).shape == (20, 4, 6)
    assert fakes.qsddmm4("dot", p2, 1.0, idx, p2, 1.0, idx, 6).shape == (20, 1)
    assert fakes.qsddmm4("dot", p3, 1.0, idx, p3, 1.0, idx, 5).shape == (20, 4, 1)


# ---------------------------------------------------------------- errors

# p (uint8 [3, 3]: width 5 or 6), p3 (uint8 [3, 2, 3]), q (int8 [3, 5]), idx ([0, 2]), i64
SETUP = (
    "i64 = lambda *v: torch.tensor(v, dtype=torch.int64, device=dev)\n"
    "p = torch.zeros(3, 3, dtype=torch.uint8, device=dev)\n"
    "p3 = torch.zeros(3, 2, 3, dtype=torch.uint8, device=dev)\n"
    "q = torch.zeros(3, 5, dtype=torch.int8, device=dev)\n"
    "idx = i64(0, 2)\n"
    "from qtrain.ops.sparse import qsddmm_packed, reference_qsddmm4\n"
)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    outside = (
        r"qsddmm4: an entry of lhs_index is outside \[0, 3\) \(rows of packed_lhs\) or of "
        r"rhs_index outside \[0, 3\) \(rows of packed_rhs\)"
    )
    wid = r"qsddmm4: width must satisfy ceil\(width / 2\) == packed_lhs.size\(-1\)"
    raw = "ops.qsddmm4"
    ref_call = "reference_qsddmm4"
    cases = []
    for call in (raw, ref_call):
        tag = "raw" if call == raw else "reference"
        cases += [
            ErrorCase(
                f"{tag} op",
                f"{call}('div', p, 1.0, idx, p, 1.0, idx, 5)",
                "ValueError",
                "qsddmm4: op must be one of 'add', 'sub', 'mul', 'dot', got 'div'",
            ),
            ErrorCase(
                f"{tag} int8 lhs",
                f"{call}('dot', q, 1.0, idx, p, 1.0, idx, 5)",
                "TypeError",
                "qsddmm4: packed_lhs must be uint8, got int8",
            ),
            ErrorCase(
                f"{tag} int8 rhs",
                f"{call}('dot', p, 1.0, idx, q, 1.0, idx, 5)",
                "TypeError",
                "qsddmm4: packed_rhs must be uint8, got int8",
            ),
            ErrorCase(
                f"{tag} 1-d",
                f"{call}('add', p[0], 1.0, idx, p, 1.0, idx, 5)",
                "ValueError",
                r"packed_lhs must have shape \[N, ceil\(width / 2\)\] or \[N, H, ceil",
            ),
            ErrorCase(
                f"{tag} sparse",
                f"{call}('add', p, 1.0, idx, p.to_sparse(), 1.0, idx, 5)",
                "ValueError",
                "packed_rhs must be a dense",
            ),
            ErrorCase(
                f"{tag} device",
                f"{call}('add', p, 1.0, idx, p.to(other), 1.0, idx, 5)",
                "ValueError",
                "packed_rhs is on .* but packed_lhs is on",
            ),
            ErrorCase(
                f"{tag} index dtype",
                f"{call}('add', p, 1.0, idx.float(), p, 1.0, idx, 5)",
                "TypeError",
                "lhs_index must be int32 or int64, got float32",
            ),
            ErrorCase(
                f"{tag} trailing",
                f"{call}('dot', p3, 1.0, idx, p, 1.0, idx, 5)",
                "ValueError",
                "packed_lhs and packed_rhs need the same trailing shape",
            ),
            ErrorCase(
                f"{tag} counts",
                f"{call}('dot', p, 1.0, idx, p, 1.0, i64(0), 5)",
                "ValueError",
                "lhs_index has 2 entries, rhs_index 1",
            ),
            ErrorCase(
                f"{tag} row scale",
                f"{call}('dot', p, 1.0, idx, p, 1.0, idx, 5, torch.ones(4, device=dev))",
                "ValueError",
                r"row_scale_lhs must have shape \[3\], \[3, 1\] \(one per row of packed_lhs\)",
            ),
            ErrorCase(
                f"{tag} row scale dtype",
                f"{call}('dot', p, 1.0, idx, p, 1.0, idx, 5, None, "
                "torch.ones(3, dtype=torch.float64, device=dev))",
                "TypeError",
                "row_scale_rhs must be float32, got float64",
            ),
            ErrorCase(
                f"{tag} index",
                f"{call}('mul', p, 1.0, i64(0, 3), p, 1.0, idx, 5)",
                "ValueError",
                outside,
            ),
            ErrorCase(
                f"{tag} index negative",
                f"{call}('dot', p3, 1.0, idx, p3, 1.0, i64(-1, 0), 6)",
                "ValueError",
                outside,
            ),
        ]
        for width in (4, 7, -1):
            cases.append(
                ErrorCase(
                    f"{tag} width {width}",
                    f"{call}('dot', p, 1.0, idx, p, 1.0, idx, {width})",
                    "ValueError",
                    wid,
                )
            )
    cases += [
        ErrorCase(
            "front row scales shape",
            "qsddmm_packed('dot', p, torch.ones(4, device=dev), idx, p, 1.0, idx, 5)",
            "ValueError",
            "qsddmm4: scale_lhs must be one value, one per row",
        ),
        ErrorCase(
            "front index with row scales",
            "qsddmm_packed('dot', p, torch.ones(3, device=dev), i64(0, 9), p, 1.0, idx, 5)",
            "ValueError",
            outside,
        ),
    ]
    expect_errors(cases, device, setup=SETUP)
