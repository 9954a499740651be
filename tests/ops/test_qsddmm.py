"""torch.ops.qtrain.qsddmm on every device against its reference
(qtrain.ops.sparse.reference_qsddmm), bit for bit: every form is exact integer arithmetic
or the reference's elementwise float32 operations. On the CPU every ISA variant runs
with 1 and 2 threads."""

from __future__ import annotations

import pytest
import torch
from sparse_cases import INDEX_DTYPES, q_shape, quantized
from support import (
    DEVICES,
    WIDTHS,
    ErrorCase,
    assert_same,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)

from qtrain.ops.quantize import quantize
from qtrain.ops.sparse import SDDMM_OPS, reference_qsddmm

# WIDTHS, the narrow rows GAT uses (2, 4, 8: their own CPU loops), whole vector registers
SDDMM_WIDTHS = (*WIDTHS, 2, 4, 8, 64, 128, 256)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
def test_matches_reference(device: str, op: str, dtype: torch.dtype, heads: int) -> None:
    ops = library(device)
    g = gen(heads)
    n_l, n_r, n_e = 37, 29, 301
    lhs = torch.randint(0, n_l, (n_e,), generator=g).to(dtype)
    rhs = torch.randint(0, n_r, (n_e,), generator=g)  # int64: mixed with int32 lhs
    li, ri = lhs.to(device), rhs.to(device)
    for i, width in enumerate(SDDMM_WIDTHS):
        ql, sl = quantized(q_shape(n_l, heads, width), bits=2 + i % 7, seed=i)
        qr, sr = quantized(q_shape(n_r, heads, width), bits=8 - i % 7, seed=100 + i)
        want = reference_qsddmm(op, ql, sl, lhs, qr, sr, rhs)
        qld, qrd = ql.to(device), qr.to(device)
        for variant in variants(device):
            got = ops.qsddmm(op, qld, float(sl), li, qrd, float(sr), ri)
            assert_same(got, want, f"{variant}, width {width}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
def test_random_int8_and_wide_heads(device: str, op: str) -> None:
    """Full-range int8 (-128 included), odd scales, GAT-like [N, H, 1] .. [N, 3, 256]."""
    ops = library(device)
    for trailing in [(1,), (3,), (129,), (4, 1), (8, 2), (2, 17), (4, 16), (3, 256)]:
        g = gen(sum(trailing) + len(op))
        ql = torch.randint(-128, 128, (37, *trailing), generator=g, dtype=torch.int8)
        qr = torch.randint(-128, 128, (23, *trailing), generator=g, dtype=torch.int8)
        li = torch.randint(0, 37, (301,), generator=g).to(torch.int32)
        ri = torch.randint(0, 23, (301,), generator=g).to(torch.int32)
        sl, sr = 0.0317, 0.77
        want = reference_qsddmm(op, ql, sl, li, qr, sr, ri)
        got = ops.qsddmm(op, ql.to(device), sl, li.to(device), qr.to(device), sr, ri.to(device))
        assert_same(got, want, f"{trailing}")


@pytest.mark.parametrize("device", DEVICES)
def test_large_parallel(device: str) -> None:
    """Enough edges that two CPU threads really split them."""
    ops = library(device)
    g = gen(9)
    lhs = torch.randint(0, 500, (40000,), generator=g)
    rhs = torch.randint(0, 500, (40000,), generator=g)
    li, ri = lhs.to(device), rhs.to(device)
    for shape in [(500, 4, 1), (500, 64)]:
        ql, sl = quantized(shape, 8, seed=1)
        qr, sr = quantized(shape, 8, seed=2)
        qld, qrd = ql.to(device), qr.to(device)
        for op in ("add", "dot"):
            want = reference_qsddmm(op, ql, sl, lhs, qr, sr, rhs)
            for variant in variants(device):
                got = ops.qsddmm(op, qld, float(sl), li, qrd, float(sr), ri)
                assert_same(got, want, f"{variant}, {op}, {shape}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
def test_edge_cases(device: str, op: str) -> None:
    ops = library(device)
    for dtype in INDEX_DTYPES:
        # no edges
        none = torch.zeros(0, dtype=dtype)
        q = torch.zeros(0, 3, dtype=torch.int8)
        want = reference_qsddmm(op, q, 1.0, none, q, 1.0, none)
        assert want.shape == ((0, 1) if op == "dot" else (0, 3))
        qd, nd = q.to(device), none.to(device)
        assert_same(ops.qsddmm(op, qd, 1.0, nd, qd, 1.0, nd), want)
        # rows of width 0: dot of nothing is 0, the others are empty
        idx = torch.tensor([0, 3], dtype=dtype)
        for shape in [(4, 2, 0), (4, 0), (4, 0, 3)]:
            q = torch.zeros(shape, dtype=torch.int8)
            want = reference_qsddmm(op, q, 1.0, idx, q, -1.0, idx)
            qd, id_ = q.to(device), idx.to(device)
            assert_same(ops.qsddmm(op, qd, 1.0, id_, qd, -1.0, id_), want, f"{shape}")
    idx = torch.tensor([0, 2, 1, 1])
    ind = idx.to(device)
    qz, sz = quantize(torch.zeros(3, 5), 8)
    for variant in variants(device):
        # all-zero and constant tensors (scale 0: never NaN), -128 everywhere
        for c in (1.5, -1.5):
            qc, sc = quantize(torch.full((3, 5), c), 3)
            for a, sa, b, sb in ((qz, sz, qc, sc), (qc, sc, qc, sc), (qc, sc, qz, sz)):
                want = reference_qsddmm(op, a, sa, idx, b, sb, idx)
                got = ops.qsddmm(op, a.to(device), float(sa), ind, b.to(device), float(sb), ind)
                assert_same(got, want, f"{variant}, {c}")
                assert not bool(got.isnan().any())
        q = torch.full((4, 8), -128, dtype=torch.int8)
        i3 = torch.tensor([0, 3, 3])
        want = reference_qsddmm(op, q, 0.5, i3, q, 0.25, i3)
        qd, i3d = q.to(device), i3.to(device)
        assert_same(ops.qsddmm(op, qd, 0.5, i3d, qd, 0.25, i3d), want, variant)
        # non-contiguous operands (transposed views from autograd)
        qt = torch.randint(-127, 128, (5, 3), dtype=torch.int8, generator=gen(4)).t()
        qtd = qt.to(device).t().contiguous().t()
        assert not qtd.is_contiguous()
        want = reference_qsddmm(op, qt, 0.5, idx, qt, 0.25, idx)
        assert_same(ops.qsddmm(op, qtd, 0.5, ind, qtd, 0.25, ind), want, variant)
        # an index view with a stride
        every_other = torch.tensor([0, 9, 2, 9, 1, 9, 1, 9], device=device)[::2]
        got = ops.qsddmm(op, qtd, 0.5, every_other, qtd, 0.25, ind)
        assert_same(got, want, variant)


def _by_definition(
    op: str,
    ql: torch.Tensor,
    sl: float,
    rsl: torch.Tensor | None,
    lhs: torch.Tensor,
    qr: torch.Tensor,
    sr: float,
    rsr: torch.Tensor | None,
    rhs: torch.Tensor,
) -> torch.Tensor:
    """The op's formulas with each edge's (and head's) scales s = fl32(scale * rs[row, h]),
    written out per head, independently of reference_qsddmm."""
    heads = ql.shape[1] if ql.dim() == 3 else 1
    a = ql[lhs].reshape(lhs.numel(), heads, -1)
    b = qr[rhs].reshape(rhs.numel(), heads, -1)

    def side(s: float, rs: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        if rs is None:
            return torch.full((rows.numel(), heads), s)
        per_row = rs.reshape(rs.shape[0], -1).expand(rs.shape[0], heads)
        return torch.tensor(s, dtype=torch.float32) * per_row[rows]

    el, er = side(sl, rsl, lhs)[:, :, None], side(sr, rsr, rhs)[:, :, None]
    if op in ("add", "sub"):
        x, y = a.to(torch.float32) * el, b.to(torch.float32) * er
        out = x + y if op == "add" else x - y
    else:
        prod = a.to(torch.int32) * b.to(torch.int32)
        if op == "dot":
            prod = prod.sum(-1, keepdim=True)
        out = prod.to(torch.float32) * (el * er)
    width = 1 if op == "dot" else ql.shape[-1]
    return out.reshape(lhs.numel(), *(() if ql.dim() == 2 else (heads,)), width)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", SDDMM_OPS)
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("sides", ["lhs", "rhs", "both"])
def test_row_scales(device: str, op: str, heads: int, sides: str) -> None:
    """row_scale_lhs / row_scale_rhs (one scale per row, or per row and head) give each
    edge and head fl32(scale * row_scale[row, h]), bit for bit in every kernel variant and
    in the reference; all-zero and power-of-ten scales, widths from 1 to 64."""
    ops = library(device)
    g = gen(30 + heads)
    n_l, n_r, n_e = 23, 17, 157
    lhs = torch.randint(0, n_l, (n_e,), generator=g)
    rhs = torch.randint(0, n_r, (n_e,), generator=g).to(torch.int32)
    li, ri = lhs.to(device), rhs.to(device)
    shapes = [(), (1,)] + ([(heads,)] if heads > 1 else [])
    for i, width in enumerate((1, 2, 4, 5, 8, 33, 64)):
        ql = torch.randint(-128, 128, q_shape(n_l, heads, width), generator=g, dtype=torch.int8)
        qr = torch.randint(-8, 8, q_shape(n_r, heads, width), generator=g, dtype=torch.int8)
        for shape in shapes:
            rsl = 10.0 ** (torch.rand((n_l, *shape), generator=g) * 6 - 3)
            rsr = 10.0 ** (torch.rand((n_r, *shape), generator=g) * 6 - 3)
            rsl[::5], rsr[1::4] = 0.0, 0.0
            rsl = rsl if sides != "rhs" else None
            rsr = rsr if sides != "lhs" else None
            sl, sr = (0.75, 1.0) if i % 2 else (1.0, 0.3)
            want = _by_definition(op, ql, sl, rsl, lhs, qr, sr, rsr, rhs.long())
            what = f"width {width}, row scales {shape}"
            assert_same(reference_qsddmm(op, ql, sl, lhs, qr, sr, rhs, rsl, rsr), want, what)
            qld, qrd, rld, rrd = (None if t is None else t.to(device) for t in (ql, qr, rsl, rsr))
            for variant in variants(device):
                got = ops.qsddmm(op, qld, sl, li, qrd, sr, ri, rld, rrd)
                assert_same(got, want, f"{variant}, {what}")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    g = gen(2)
    ql = torch.randint(-128, 128, (9, 4, 3), generator=g, dtype=torch.int8).to(device)
    qr = torch.randint(-128, 128, (6, 4, 3), generator=g, dtype=torch.int8).to(device)
    li = torch.randint(0, 9, (20,), generator=g).to(device)
    ri = torch.randint(0, 6, (20,), generator=g).to(torch.int32).to(device)
    rs_l = torch.rand(9, 4, generator=g).to(device)
    rs_r = torch.rand(6, 4, generator=g).to(device)
    for args in (
        ("dot", ql, 0.5, li, qr, 0.25, ri),
        ("add", ql[:, 0], 0.5, li, qr[:, 0], 0.25, ri),
        ("mul", ql, 0.5, li.int(), qr, 2.0, ri),
        ("sub", ql, 1.0, li[:0], qr, 1.0, ri[:0]),
        ("dot", ql, 1.0, li, qr, 1.0, ri, rs_l, rs_r),
        ("add", ql, 0.5, li, qr, 1.0, ri, rs_l[:, :1], None),
        ("mul", ql[:, 0], 1.0, li, qr[:, 0], 2.0, ri, None, rs_r[:, 0]),
    ):
        opcheck(ops.qsddmm.default, args)


# What every error case may use: q (int8 [3, 4]), q3 (int8 [3, 2, 4]), idx ([0, 2]), i64
# (a helper); support defines other, a device that is not dev.
SETUP = (
    "i64 = lambda *v: torch.tensor(v, dtype=torch.int64, device=dev)\n"
    "q = torch.ones(3, 4, dtype=torch.int8, device=dev)\n"
    "q3 = torch.ones(3, 2, 4, dtype=torch.int8, device=dev)\n"
    "idx = i64(0, 2)\n"
)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    outside = r"an entry of lhs_index is outside \[0, 3\) \(rows of q_lhs\) or of rhs_index outside \[0, 3\) \(rows of q_rhs\)"
    expect_errors(
        [
            # the front
            ErrorCase(
                "op div",
                "ops.qsddmm('div', q, 1.0, idx, q, 1.0, idx)",
                "ValueError",
                "op must be one of 'add', 'sub', 'mul', 'dot', got 'div'",
            ),
            ErrorCase(
                "op empty",
                "ops.qsddmm('', q, 1.0, idx, q, 1.0, idx)",
                "ValueError",
                "op must be one of",
            ),
            ErrorCase(
                "q_lhs float",
                "ops.qsddmm('add', q.float(), 1.0, idx, q, 1.0, idx)",
                "TypeError",
                "q_lhs must be int8, got float32",
            ),
            ErrorCase(
                "q_lhs 1-d",
                "ops.qsddmm('add', q[0], 1.0, idx, q, 1.0, idx)",
                "ValueError",
                r"q_lhs must have shape \[N, D\] or \[N, H, D\]",
            ),
            ErrorCase(
                "q_lhs sparse",
                "ops.qsddmm('add', q.to_sparse(), 1.0, idx, q, 1.0, idx)",
                "ValueError",
                "q_lhs must be a dense",
            ),
            ErrorCase(
                "q_rhs uint8",
                "ops.qsddmm('dot', q, 1.0, idx, q.to(torch.uint8), 1.0, idx)",
                "TypeError",
                "q_rhs must be int8, got uint8",
            ),
            ErrorCase(
                "q_rhs 4-d",
                "ops.qsddmm('mul', q3, 1.0, idx, q3[None], 1.0, idx)",
                "ValueError",
                "q_rhs must have shape",
            ),
            ErrorCase(
                "q_rhs device",
                "ops.qsddmm('add', q, 1.0, idx, q.to(other), 1.0, idx)",
                "ValueError",
                "q_rhs is on .* but q_lhs is on",
            ),
            ErrorCase(
                "lhs_index float",
                "ops.qsddmm('add', q, 1.0, idx.float(), q, 1.0, idx)",
                "TypeError",
                "lhs_index must be int32 or int64, got float32",
            ),
            ErrorCase(
                "lhs_index 2-d",
                "ops.qsddmm('add', q, 1.0, idx[None], q, 1.0, idx)",
                "ValueError",
                "lhs_index must be 1-d",
            ),
            ErrorCase(
                "lhs_index device",
                "ops.qsddmm('add', q, 1.0, idx.to(other), q, 1.0, idx)",
                "ValueError",
                "lhs_index is on",
            ),
            ErrorCase(
                "rhs_index uint8",
                "ops.qsddmm('add', q, 1.0, idx, q, 1.0, idx.to(torch.uint8))",
                "TypeError",
                "rhs_index must be int32 or int64",
            ),
            ErrorCase(
                "rhs_index 0-d",
                "ops.qsddmm('add', q, 1.0, idx, q, 1.0, idx[0])",
                "ValueError",
                "rhs_index must be 1-d",
            ),
            ErrorCase(
                "rhs_index device",
                "ops.qsddmm('add', q, 1.0, idx, q, 1.0, idx.to(other))",
                "ValueError",
                "rhs_index is on",
            ),
            ErrorCase(
                "trailing width",
                "ops.qsddmm('add', q, 1.0, idx, q[:, :2], 1.0, idx)",
                "ValueError",
                "q_lhs and q_rhs need the same trailing shape",
            ),
            ErrorCase(
                "trailing heads",
                "ops.qsddmm('dot', q3, 1.0, idx, q, 1.0, idx)",
                "ValueError",
                "same trailing shape",
            ),
            ErrorCase(
                "index lengths",
                "ops.qsddmm('add', q, 1.0, idx, q, 1.0, idx[:1])",
                "ValueError",
                "lhs_index has 2 entries, rhs_index 1",
            ),
            # the kernels: an index out of range
            ErrorCase(
                "rhs too large, dot",
                "ops.qsddmm('dot', q, 1.0, idx, q, 1.0, i64(0, 3))",
                "ValueError",
                outside,
            ),
            ErrorCase(
                "lhs negative, mul",
                "ops.qsddmm('mul', q, 1.0, i64(-1, 0), q, 1.0, idx)",
                "ValueError",
                outside,
            ),
            ErrorCase(
                "lhs too large, add, int32",
                "ops.qsddmm('add', q, 1.0, i64(0, 7).int(), q, 1.0, idx.int())",
                "ValueError",
                outside,
            ),
            ErrorCase(
                "rhs too large, sub, mixed",
                "ops.qsddmm('sub', q, 1.0, idx.int(), q, 1.0, i64(5, 0))",
                "ValueError",
                outside,
            ),
            ErrorCase(
                "rhs too large, narrow heads",
                "ops.qsddmm('add', q3[..., :1], 1.0, idx, q3[..., :1], 1.0, i64(0, 3))",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "lhs too large, dot per head",
                "ops.qsddmm('dot', q3, 1.0, i64(3, 0), q3, 1.0, idx)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "lhs too large, wide",
                "ops.qsddmm('add', torch.ones(3, 300, dtype=torch.int8, device=dev), 1.0, i64(0, 3), torch.ones(3, 300, dtype=torch.int8, device=dev), 1.0, idx)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "rhs too large, width 0",
                "ops.qsddmm('add', q[:, :0], 1.0, idx, q[:, :0], 1.0, i64(0, 3))",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "lhs too large, dot width 0",
                "ops.qsddmm('dot', q[:, :0], 1.0, i64(3, 0), q[:, :0], 1.0, idx)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "lhs too large, dot no heads",
                "ops.qsddmm('dot', q3[:, :0], 1.0, i64(3, 0), q3[:, :0], 1.0, idx)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "row_scale_lhs float64",
                "ops.qsddmm('dot', q, 1.0, idx, q, 1.0, idx, torch.ones(3, dtype=torch.float64, device=dev))",
                "TypeError",
                "row_scale_lhs must be float32, got float64",
            ),
            ErrorCase(
                "row_scale_rhs rows",
                "ops.qsddmm('add', q, 1.0, idx, q, 1.0, idx, None, torch.ones(2, device=dev))",
                "ValueError",
                r"row_scale_rhs must have shape \[3\], \[3, 1\] \(one per row of q_rhs\), got \[2\]",
            ),
            ErrorCase(
                "row_scale_lhs heads",
                "ops.qsddmm('mul', q3, 1.0, idx, q3, 1.0, idx, torch.ones(3, 3, device=dev))",
                "ValueError",
                r"\[3\], \[3, 1\] or \[3, 2\] \(one per row of q_lhs\), got \[3, 3\]",
            ),
            ErrorCase(
                "row_scale_rhs 3-d",
                "ops.qsddmm('dot', q3, 1.0, idx, q3, 1.0, idx, None, torch.ones(3, 2, 1, device=dev))",
                "ValueError",
                "row_scale_rhs must have shape",
            ),
            ErrorCase(
                "row_scale_lhs device",
                "ops.qsddmm('sub', q, 1.0, idx, q, 1.0, idx, torch.ones(3, device=other))",
                "ValueError",
                "row_scale_lhs is on",
            ),
            ErrorCase(
                "row_scale_rhs sparse",
                "ops.qsddmm('sub', q, 1.0, idx, q, 1.0, idx, None, torch.ones(3, device=dev).to_sparse())",
                "ValueError",
                "row_scale_rhs must be a dense",
            ),
            ErrorCase(
                "lhs too large, row scales",
                "ops.qsddmm('dot', q3, 1.0, i64(3, 0), q3, 1.0, idx, torch.ones(3, 2, device=dev), torch.ones(3, device=dev))",
                "ValueError",
                outside,
            ),
            ErrorCase(
                "rhs negative, row scales, add",
                "ops.qsddmm('add', q, 1.0, idx, q, 1.0, i64(0, -1), torch.ones(3, device=dev))",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "q without rows",
                "ops.qsddmm('add', torch.ones(0, 4, dtype=torch.int8, device=dev), 1.0, idx, q, 1.0, idx)",
                "ValueError",
                r"outside \[0, 0\)",
            ),
        ],
        device,
        SETUP,
    )
