"""torch.ops.qtrain.qspmm on every device against its reference (qtrain.ops.sparse.reference_qspmm).

The copy form is an exact integer sum, so every kernel equals the reference bit for
bit. The weighted form adds float32 terms in the same order in every kernel (each row's
pieces of the merge-path partition in CSR order, a split row's pieces in unit order), so
it equals that order's emulation (sparse_cases.kernel_order_weighted) bit for bit, and
the reference, which adds in another order, to float32 rounding. On the CPU every ISA
variant runs with 1 and 2 threads.
"""

from __future__ import annotations

import pytest
import torch
from sparse_cases import (
    INDEX_DTYPES,
    csr,
    csr_order,
    kernel_order_weighted,
    q_shape,
    quantized,
)
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

from qtrain.ops.packed import pack_int4
from qtrain.ops.partition import spmm_items_per_unit
from qtrain.ops.quantize import quantize
from qtrain.ops.sparse import reference_qspmm

# WIDTHS; 64 (whole AVX-512 tiles); the CUDA lane groups: 128 (a warp of 4-byte gathers),
# 256 (2 chunks per lane), 600 (4 chunks per lane, two windows per row)
SPMM_WIDTHS = (*WIDTHS, 64, 128, 256, 600)
EPS32 = 2.0**-23


def _on(device: str, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(device) for t in tensors]


def _close_to_reference(got: torch.Tensor, indptr, indices, q, scale, weight, eids) -> None:
    """|got - reference| <= 2 (deg + 1) eps sum|terms| (the weighted form's float sums)."""
    ref = reference_qspmm(indptr, indices, q, scale, weight, eids)
    terms = reference_qspmm(indptr, indices, q.abs(), scale, weight.abs(), eids)
    deg = (indptr[1:] - indptr[:-1]).to(torch.float32).reshape((-1,) + (1,) * (q.dim() - 1))
    tol = 2 * (deg + 1) * EPS32 * terms + 1e-30
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert bool(((got - ref).abs() <= tol).all()), float((got - ref).abs().max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("kind", ["uniform", "powerlaw", "zeros"])
def test_copy_matches_reference(device: str, dtype: torch.dtype, heads: int, kind: str) -> None:
    ops = library(device)
    indptr, indices = csr(61, 47, 5, kind, seed=heads, dtype=dtype)
    ip, ix = _on(device, indptr, indices)
    for i, width in enumerate(SPMM_WIDTHS):
        q, scale = quantized(q_shape(47, heads, width), bits=2 + i % 7, seed=i)
        if i % 2:  # the whole int8 range, -128 included
            q = torch.randint(-128, 128, q.shape, generator=gen(i), dtype=torch.int8)
        want = reference_qspmm(indptr, indices, q, scale)
        qd = q.to(device)
        for variant in variants(device):
            assert_same(ops.qspmm(ip, ix, qd, float(scale)), want, f"{variant}, width {width}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("with_eids", [False, True])
def test_weighted_sums_in_kernel_order(
    device: str, dtype: torch.dtype, heads: int, with_eids: bool
) -> None:
    ops = library(device)
    indptr, indices = csr(53, 40, 6, "powerlaw", seed=7 + heads, dtype=dtype)
    nnz = indices.numel()
    g = gen(3)
    eids = torch.randperm(nnz, generator=g).to(dtype) if with_eids else None
    ip, ix, ed = _on(device, indptr, indices, eids)
    shapes = [(nnz,), (nnz, 1), (nnz, heads), (nnz, heads, 1), (nnz, 1, 1)]
    # 8: per-head weights with 4-byte gathers; 600: several CUDA windows per row (one
    # weight shape, to keep the test short)
    for i, width in enumerate((*WIDTHS, 8, 600)):
        q, scale = quantized(q_shape(40, heads, width), bits=8 - i % 7, seed=10 + i)
        qd = q.to(device)
        for shape in shapes if width < 600 else shapes[3:4]:
            w = torch.randn(shape, generator=g)
            want = kernel_order_weighted(indptr, indices, q, scale, w, eids)
            wd = w.to(device)
            for variant in variants(device):
                got = ops.qspmm(ip, ix, qd, float(scale), wd, ed)
                assert_same(got, want, f"{variant}, width {width}, weight {shape}")
        # the emulated order agrees with the reference's to float32 rounding
        _close_to_reference(got, indptr, indices, q, scale, w, eids)


@pytest.mark.parametrize("device", DEVICES)
def test_large_graph_every_variant(device: str) -> None:
    """Enough work that two CPU threads really split the rows; hubs of up to 600 entries."""
    ops = library(device)
    indptr, indices = csr(3000, 2500, 12, "powerlaw", seed=5)
    q, scale = quantized((2500, 4, 24), 8, seed=5)
    w = torch.randn(indices.numel(), 4, 1, generator=gen(5))
    eids = torch.randperm(indices.numel(), generator=gen(6))
    ip, ix, qd, wd, ed = _on(device, indptr, indices, q, w, eids)
    want_heads = kernel_order_weighted(indptr, indices, q, scale, w, eids)
    want_one = kernel_order_weighted(indptr, indices, q[:, 0], scale, w[:, 0], eids)
    want_copy = reference_qspmm(indptr, indices, q, scale)
    for variant in variants(device):
        assert_same(ops.qspmm(ip, ix, qd, float(scale), wd, ed), want_heads, variant)
        assert_same(ops.qspmm(ip, ix, qd[:, 0], float(scale), wd[:, 0], ed), want_one, variant)
        assert_same(ops.qspmm(ip, ix, qd, float(scale)), want_copy, variant)


def _folded(
    weight: torch.Tensor | None,
    eids: torch.Tensor | None,
    row_scale: torch.Tensor,
    indices: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """What row_scale stands for: each entry's weight fl32(w[eids[k], h] * rs[indices[k], h])
    as an [E, H] weight of its own (w taken as 1 without weight)."""
    nnz = indices.numel()
    w = torch.ones(nnz, 1) if weight is None else weight.to(torch.float32)
    w = w.reshape(w.shape[0], w[0].numel() if w.shape[0] else 1)
    if weight is not None and eids is not None:
        w = w[eids.to(torch.int64)]
    rs = row_scale.reshape(row_scale.shape[0], row_scale[0].numel())[indices.to(torch.int64)]
    return (w[:nnz] * rs).expand(nnz, heads).contiguous()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("kind", ["uniform", "powerlaw", "zeros", "empty"])
@pytest.mark.parametrize("with_eids", [False, True])
def test_row_scale_is_the_folded_weight(
    device: str, heads: int, kind: str, with_eids: bool
) -> None:
    """row_scale (one scale per input row, or per row and head) gives bit for bit the SpMM
    whose entries' weights have the scales folded in, with and without an edge weight,
    in every CPU variant, int8 and packed rows alike; the reference agrees exactly too."""
    ops = library(device)
    rows, n_in = 45, 31
    if kind == "empty":
        indptr, indices = (
            torch.zeros(rows + 1, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
        )
    else:
        indptr, indices = csr(rows, n_in, 7, kind, seed=11 + heads)
    nnz = indices.numel()
    g = gen(12)
    eids = torch.randperm(nnz, generator=g) if with_eids else None
    rs_shapes = [(n_in,), (n_in, 1)] + ([(n_in, heads)] if heads > 1 else [])
    w_shapes = [None, (nnz,), (nnz, heads)]
    ip, ix, ed = _on(device, indptr, indices, eids)
    for i, width in enumerate((1, 5, 8, 33, 64)):
        q, _ = quantized(q_shape(n_in, heads, width), bits=4, seed=20 + i)
        packed = pack_int4(q, backend="reference")
        qd, pd = _on(device, q, packed)
        for rs_shape in rs_shapes:
            rs = 10.0 ** (torch.rand(rs_shape, generator=g) * 4 - 2)
            rs[::4] = 0.0  # all-zero rows
            for w_shape in w_shapes:
                w = None if w_shape is None else torch.randn(w_shape, generator=g)
                e = eids if w is not None else None
                folded = _folded(w, e, rs, indices, heads)
                if heads == 1:
                    folded = folded[:, 0]
                want_ref = reference_qspmm(indptr, indices, q, 0.5, folded)
                got_ref = reference_qspmm(indptr, indices, q, 0.5, w, e, rs)
                what = f"width {width}, row_scale {rs_shape}, weight {w_shape}"
                assert_same(got_ref, want_ref, f"reference, {what}")
                rsd, wd, fd = _on(device, rs, w, folded)
                for variant in variants(device):
                    want = ops.qspmm(ip, ix, qd, 0.5, fd)
                    assert_same(
                        ops.qspmm(ip, ix, qd, 0.5, wd, ed if w is not None else None, rsd),
                        want,
                        f"{variant}, {what}",
                    )
                    got4 = ops.qspmm4(
                        ip, ix, pd, width, 0.5, wd, ed if w is not None else None, rsd
                    )
                    assert_same(got4, want, f"qspmm4 {variant}, {what}")


def _hub_graph(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Hubs split across merge-path units (256 items each at this size) at the start, in
    the middle and at the end, between runs of empty and short rows. The first hub's last
    entry is item 1023, the last of unit 3: its end is unit 4's first item, so its last
    piece is empty."""
    degrees = [1024, 0, 0, 1, 3, 0, 31, 0, 2, 1500, 0, 1, 1, 0, 0, 5, 64, 0, 700, 0, 3]
    ptr = torch.tensor([0, *torch.tensor(degrees).cumsum(0).tolist()])
    indices = torch.randint(0, 50, (int(ptr[-1]),), generator=gen(21))
    return ptr.to(dtype), indices.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_hub_rows_split_across_units(device: str, dtype: torch.dtype) -> None:
    """The kernels hand out merge-path units, not rows: a hub is summed in pieces, the
    copy form exactly and the weighted form in unit order, on every device and variant."""
    ops = library(device)
    indptr, indices = _hub_graph(dtype)
    nnz = indices.numel()
    per_unit = spmm_items_per_unit(indptr.numel() - 1, nnz)
    assert per_unit == 256 and nnz > 12 * per_unit  # the hubs span several units each
    assert int(indptr[1]) % per_unit == 0  # the first hub's end item opens a unit
    eids = torch.randperm(nnz, generator=gen(22)).to(dtype)
    ip, ix, ed = _on(device, indptr, indices, eids)
    for i, width in enumerate((1, 7, 128, 600)):
        q = torch.randint(-128, 128, (50, width), dtype=torch.int8, generator=gen(30 + i))
        w = torch.randn(nnz, generator=gen(40 + i))
        want_copy = reference_qspmm(indptr, indices, q, 0.375)
        want_weighted = kernel_order_weighted(indptr, indices, q, 0.375, w, eids)
        # the unit order is not the CSR order: the test tells a row-parallel kernel apart
        if width > 1:
            assert not torch.equal(want_weighted, csr_order(indptr, indices, q, 0.375, w, eids))
        qd, wd = _on(device, q, w)
        for variant in variants(device):
            what = f"{variant}, width {width}"
            assert_same(ops.qspmm(ip, ix, qd, 0.375), want_copy, what)
            assert_same(ops.qspmm(ip, ix, qd, 0.375, wd, ed), want_weighted, what)


@pytest.mark.parametrize("device", DEVICES)
def test_units_larger_than_the_minimum(device: str) -> None:
    """Past 2^21 items a unit holds more than 256: the kernels' unit size is the one
    qtrain.ops.partition.spmm_items_per_unit says (split rows would differ in their last
    bits otherwise)."""
    ops = library(device)
    indptr, indices = csr(40_000, 5_000, 20, "powerlaw", seed=23)
    rows, nnz = indptr.numel() - 1, indices.numel()
    assert spmm_items_per_unit(rows, nnz) > 256
    q = torch.randint(-128, 128, (5_000, 2), dtype=torch.int8, generator=gen(24))
    w = torch.randn(nnz, generator=gen(25))
    want = kernel_order_weighted(indptr, indices, q, 0.5, w, None)
    ip, ix, qd, wd = _on(device, indptr, indices, q, w)
    assert_same(ops.qspmm(ip, ix, qd, 0.5, wd), want)
    assert_same(ops.qspmm(ip, ix, qd, 0.5), reference_qspmm(indptr, indices, q, 0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_incidence_form(device: str, dtype: torch.dtype) -> None:
    """Edge-to-node sums (GAT's backward over [E, H, 1] edge tensors) are the copy form over
    edge rows, indices = eids; int32 indptr with int64 eids is promoted."""
    ops = library(device)
    indptr, indices = csr(70, 70, 4, "powerlaw", seed=11, dtype=dtype)
    nnz = indices.numel()
    eids = torch.randperm(nnz, generator=gen(1))
    for edge_ids in (eids.to(dtype), eids):
        ip, ed = _on(device, indptr, edge_ids)
        for shape in [(nnz, 4, 1), (nnz, 1), (nnz, 8, 16), (nnz, 4, 2)]:
            q, scale = quantized(shape, 6, seed=len(shape))
            want = reference_qspmm(indptr, edge_ids, q, scale)
            qd = q.to(device)
            for variant in variants(device):
                assert_same(ops.qspmm(ip, ed, qd, float(scale)), want, f"{variant}, {shape}")


@pytest.mark.parametrize("device", DEVICES)
def test_edge_cases(device: str) -> None:
    ops = library(device)
    for dtype in INDEX_DTYPES:
        empty = torch.zeros(0, dtype=dtype, device=device)
        # empty graph: 0 rows, 0 entries, 0 input rows
        out = ops.qspmm(
            torch.zeros(1, dtype=dtype, device=device),
            empty,
            torch.zeros(0, 5, dtype=torch.int8, device=device),
            1.0,
        )
        assert_same(out, torch.zeros(0, 5))
        # rows but no entries: zeros, also weighted and multi-head
        indptr = torch.zeros(4, dtype=dtype, device=device)
        q = torch.ones(2, 3, 7, dtype=torch.int8, device=device)
        assert_same(ops.qspmm(indptr, empty, q, 0.5), torch.zeros(3, 3, 7))
        w = torch.zeros(0, 3, device=device)
        assert_same(ops.qspmm(indptr, empty, q, 0.5, w, empty), torch.zeros(3, 3, 7))
        # zero width, zero heads
        one = torch.tensor([0, 1], dtype=dtype, device=device)
        first = torch.zeros(1, dtype=dtype, device=device)
        out = ops.qspmm(one, first, torch.zeros(1, 0, dtype=torch.int8, device=device), 1.0)
        assert_same(out, torch.zeros(1, 0))
        out = ops.qspmm(one, first, torch.zeros(1, 0, 4, dtype=torch.int8, device=device), 1.0)
        assert_same(out, torch.zeros(1, 0, 4))
    indptr, indices = csr(40, 30, 5, "powerlaw", seed=2, dtype=torch.int32)
    ip, ix = _on(device, indptr, indices)
    for variant in variants(device):
        # all-zero input: scale 0, exactly zero out (never NaN)
        q, scale = quantize(torch.zeros(30, 17), 8)
        assert float(scale) == 0.0
        qd = q.to(device)
        assert_same(ops.qspmm(ip, ix, qd, 0.0), torch.zeros(40, 17), variant)
        w = torch.rand(indices.numel(), generator=gen(1))
        assert_same(ops.qspmm(ip, ix, qd, 0.0, w.to(device)), torch.zeros(40, 17), variant)
        # constant tensors, positive and negative: every element on the top level
        for c in (2.5, -2.5):
            q, scale = quantize(torch.full((30, 33), c), 4)
            want = reference_qspmm(indptr, indices, q, scale)
            assert_same(ops.qspmm(ip, ix, q.to(device), float(scale)), want, variant)
        # non-contiguous operands (transposed views from autograd), float64 weights
        qt = torch.randint(-127, 128, (33, 30), dtype=torch.int8, generator=gen(2)).t()
        wt = torch.randn(2, indices.numel(), generator=gen(3), dtype=torch.float64).t()
        qtd = qt.to(device).t().contiguous().t()
        wtd = wt.to(device).t().contiguous().t()
        assert not qtd.is_contiguous() and not wtd.is_contiguous()
        want = reference_qspmm(indptr, indices, qt, 0.25)
        assert_same(ops.qspmm(ip, ix, qtd, 0.25), want, variant)
        want = kernel_order_weighted(indptr, indices, qt, 0.25, wt[:, :1], None)
        assert_same(ops.qspmm(ip, ix, qtd, 0.25, wtd[:, :1]), want, variant)
    # a long row of -128s (sums far beyond int8, still int32)
    indptr = torch.tensor([0, 5000, 5000, 5003])
    indices = torch.randint(0, 100, (5003,), generator=gen(12))
    q = torch.full((100, 33), -128, dtype=torch.int8)
    want = reference_qspmm(indptr, indices, q, 0.5)
    assert_same(ops.qspmm(*_on(device, indptr, indices, q), 0.5), want)


@pytest.mark.parametrize("device", DEVICES)
def test_long_row_does_not_overflow_int32(device: str) -> None:
    """A row whose int8 sum leaves int32 is exact: its pieces (at most 2^16 entries each)
    are added in int64."""
    ops = library(device)
    deg = (1 << 31) // 128 + 1  # -128 * deg < -2^31
    out = ops.qspmm(
        torch.tensor([0, deg], dtype=torch.int32, device=device),
        torch.zeros(deg, dtype=torch.int32, device=device),
        torch.full((1, 1), -128, dtype=torch.int8, device=device),
        1.0,
    )
    assert_same(out, torch.tensor([[-128 * deg]], dtype=torch.int64).to(torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    indptr, indices = csr(20, 15, 3, "powerlaw", seed=4)
    nnz = indices.numel()
    q, _ = quantized((15, 2, 5), 8, seed=4)
    w = torch.randn(nnz, 2, generator=gen(4))
    eids = torch.randperm(nnz, generator=gen(5))
    row_scale = torch.rand(15, 2, generator=gen(6))
    ip, ix, qd, wd, ed, rd = _on(device, indptr, indices, q, w, eids, row_scale)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    for args in (
        (ip, ix, qd, 0.5, None, None),
        (ip.int(), ix, qd[:, 0], 0.25, wd[:, :1], ed),
        (ip, ix, qd, 0.125, wd, None),
        (ip[:1], empty, qd[:0], 1.0, None, None),
        (ip, ix, qd, 1.0, None, None, rd),
        (ip, ix, qd, 1.0, wd, ed, rd[:, :1]),
        (ip.int(), ix, qd[:, 0], 0.5, wd[:, :1], None, rd[:, 0]),
    ):
        opcheck(ops.qspmm.default, args)


# What every error case may use: ip (indptr [0, 2, 3]), ix (indices [0, 1, 1]), q (int8 [2, 4]),
# q3 (int8 [2, 3, 4]), w (3 weights), i64 (a helper); support defines other, a device not dev.
SETUP = (
    "i64 = lambda *v: torch.tensor(v, dtype=torch.int64, device=dev)\n"
    "ip, ix = i64(0, 2, 3), i64(0, 1, 1)\n"
    "q = torch.ones(2, 4, dtype=torch.int8, device=dev)\n"
    "q3 = torch.ones(2, 3, 4, dtype=torch.int8, device=dev)\n"
    "w = torch.ones(3, device=dev)\n"
)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    start = r"indptr(\[0\] must be 0| must start at 0)"
    end = (
        r"indptr(\[-1\] must equal the number of entries| must start at 0, never decrease and end)"
    )
    decreasing = r"indptr must (be non-decreasing|start at 0, never decrease)"
    expect_errors(
        [
            # the front: dtypes, dims, layouts, devices, shapes
            ErrorCase(
                "indptr float",
                "ops.qspmm(ip.float(), ix, q, 1.0)",
                "TypeError",
                "indptr must be int32 or int64, got float32",
            ),
            ErrorCase(
                "indptr 2-d", "ops.qspmm(ip[None], ix, q, 1.0)", "ValueError", "indptr must be 1-d"
            ),
            ErrorCase(
                "indptr sparse",
                "ops.qspmm(ip.to_sparse(), ix, q, 1.0)",
                "ValueError",
                "indptr must be a dense",
            ),
            ErrorCase(
                "indptr empty",
                "ops.qspmm(ip[:0], ix[:0], q, 1.0)",
                "ValueError",
                "indptr needs at least one entry",
            ),
            ErrorCase(
                "indices int16",
                "ops.qspmm(ip, ix.short(), q, 1.0)",
                "TypeError",
                "indices must be int32 or int64, got int16",
            ),
            ErrorCase(
                "indices 2-d",
                "ops.qspmm(ip, ix[None], q, 1.0)",
                "ValueError",
                "indices must be 1-d",
            ),
            ErrorCase(
                "indices device",
                "ops.qspmm(ip, ix.to(other), q, 1.0)",
                "ValueError",
                "indices is on .* but indptr is on",
            ),
            ErrorCase(
                "q float",
                "ops.qspmm(ip, ix, q.float(), 1.0)",
                "TypeError",
                "q must be int8, got float32",
            ),
            ErrorCase("q int32", "ops.qspmm(ip, ix, q.int(), 1.0)", "TypeError", "q must be int8"),
            ErrorCase(
                "q 1-d",
                "ops.qspmm(ip, ix, q[0], 1.0)",
                "ValueError",
                r"q must have shape \[N, D\] or \[N, H, D\]",
            ),
            ErrorCase(
                "q 4-d", "ops.qspmm(ip, ix, q3[None], 1.0)", "ValueError", r"q must have shape"
            ),
            ErrorCase(
                "q device",
                "ops.qspmm(ip, ix, q.to(other), 1.0)",
                "ValueError",
                "q is on .* but indptr is on",
            ),
            ErrorCase(
                "eids float",
                "ops.qspmm(ip, ix, q, 1.0, w, ix.float())",
                "TypeError",
                "eids must be int32 or int64",
            ),
            ErrorCase(
                "eids length",
                "ops.qspmm(ip, ix, q, 1.0, w, ix[:2])",
                "ValueError",
                "eids has 2 entries, indices 3",
            ),
            ErrorCase(
                "eids length, no weight",
                "ops.qspmm(ip, ix, q, 1.0, None, ix[:2])",
                "ValueError",
                "eids has 2 entries",
            ),
            ErrorCase(
                "eids device",
                "ops.qspmm(ip, ix, q, 1.0, w, ix.to(other))",
                "ValueError",
                "eids is on",
            ),
            ErrorCase(
                "weight complex",
                "ops.qspmm(ip, ix, q, 1.0, w.to(torch.complex64))",
                "TypeError",
                r"weight must be a real \(float32\) tensor",
            ),
            ErrorCase(
                "weight bool",
                "ops.qspmm(ip, ix, q, 1.0, w.bool())",
                "TypeError",
                "weight must be a real",
            ),
            ErrorCase(
                "weight sparse",
                "ops.qspmm(ip, ix, q, 1.0, w.to_sparse())",
                "ValueError",
                "weight must be a dense",
            ),
            ErrorCase(
                "weight device",
                "ops.qspmm(ip, ix, q, 1.0, w.to(other))",
                "ValueError",
                "weight is on",
            ),
            ErrorCase(
                "weight heads",
                "ops.qspmm(ip, ix, q3, 1.0, torch.ones(3, 2, device=dev))",
                "ValueError",
                r"weight must have shape \[E\], \[E, 1\], \[E, 3\] or \[E, 3, 1\], got \[3, 2\]",
            ),
            ErrorCase(
                "weight [E, H, 2]",
                "ops.qspmm(ip, ix, q3, 1.0, torch.ones(3, 3, 2, device=dev))",
                "ValueError",
                "weight must have shape",
            ),
            ErrorCase(
                "weight 0-d",
                "ops.qspmm(ip, ix, q, 1.0, w[0])",
                "ValueError",
                "weight must have shape",
            ),
            ErrorCase(
                "weight 4-d",
                "ops.qspmm(ip, ix, q3, 1.0, torch.ones(3, 3, 1, 1, device=dev))",
                "ValueError",
                "weight must have shape",
            ),
            ErrorCase(
                "weight per head on [N, D]",
                "ops.qspmm(ip, ix, q, 1.0, torch.ones(3, 2, device=dev))",
                "ValueError",
                r"\[E, 1\] or \[E, 1, 1\]",
            ),
            ErrorCase(
                "weight rows",
                "ops.qspmm(ip, ix, q, 1.0, w[:2])",
                "ValueError",
                "weight has 2 rows but there are 3 entries and no eids",
            ),
            # the kernels: what only the data shows
            ErrorCase("indptr start", "ops.qspmm(i64(1, 2, 3), ix, q, 1.0)", "ValueError", start),
            ErrorCase(
                "indptr negative start", "ops.qspmm(i64(-1, 2, 3), ix, q, 1.0)", "ValueError", start
            ),
            ErrorCase("indptr end", "ops.qspmm(i64(0, 2, 4), ix, q, 1.0)", "ValueError", end),
            ErrorCase("indptr short end", "ops.qspmm(i64(0, 1, 2), ix, q, 1.0)", "ValueError", end),
            ErrorCase(
                "indptr decreasing",
                "ops.qspmm(i64(0, 2, 1, 3), ix, q, 1.0)",
                "ValueError",
                decreasing,
            ),
            ErrorCase(
                "indptr decreasing int32",
                "ops.qspmm(i64(0, 3, 1, 3).int(), ix.int(), q, 1.0, w)",
                "ValueError",
                decreasing,
            ),
            ErrorCase("no rows, entries", "ops.qspmm(i64(0), ix, q, 1.0)", "ValueError", end),
            ErrorCase(
                "no rows, indptr [1]", "ops.qspmm(i64(1), ix[:0], q, 1.0)", "ValueError", start
            ),
            ErrorCase(
                "index too large",
                "ops.qspmm(ip, i64(0, 1, 2), q, 1.0)",
                "ValueError",
                r"an entry of indices is outside \[0, 2\) \(rows of q\)",
            ),
            ErrorCase(
                "index negative",
                "ops.qspmm(ip, i64(0, -1, 1), q, 1.0)",
                "ValueError",
                r"indices is outside \[0, 2\)",
            ),
            ErrorCase(
                "index int32 mixed",
                "ops.qspmm(ip.int(), i64(0, 5, 1), q, 1.0, w)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "index, per-head weight",
                "ops.qspmm(ip, i64(0, 1, 9), q3, 1.0, torch.ones(3, 3, device=dev), ix)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "index, width 0",
                "ops.qspmm(ip, i64(0, 1, 2), q[:, :0], 1.0)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "index, no heads",
                "ops.qspmm(ip, i64(0, 1, 2), q3[:, :0], 1.0)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "index, q without rows",
                "ops.qspmm(ip, ix, torch.ones(0, 4, dtype=torch.int8, device=dev), 1.0)",
                "ValueError",
                r"outside \[0, 0\)",
            ),
            ErrorCase(
                "index, wide rows",
                "ops.qspmm(ip, i64(0, 1, 2), torch.ones(2, 700, dtype=torch.int8, device=dev), 1.0)",
                "ValueError",
                "outside",
            ),
            ErrorCase(
                "eid too large",
                "ops.qspmm(ip, ix, q, 1.0, w, i64(0, 1, 3))",
                "ValueError",
                r"or of eids outside \[0, 3\) \(rows of weight\)",
            ),
            ErrorCase(
                "eid negative, per-head weight",
                "ops.qspmm(ip, ix, q3, 1.0, torch.ones(3, 3, 1, device=dev), i64(0, -2, 1))",
                "ValueError",
                "rows of weight",
            ),
            ErrorCase(
                "eid, weight without rows",
                "ops.qspmm(ip, ix, q, 1.0, torch.ones(0, device=dev), ix)",
                "ValueError",
                r"eids outside \[0, 0\)",
            ),
            ErrorCase(
                "row_scale float64",
                "ops.qspmm(ip, ix, q, 1.0, None, None, torch.ones(2, dtype=torch.float64, device=dev))",
                "TypeError",
                "row_scale must be float32, got float64",
            ),
            ErrorCase(
                "row_scale rows",
                "ops.qspmm(ip, ix, q, 1.0, w, None, torch.ones(3, device=dev))",
                "ValueError",
                r"row_scale must have shape \[2\], \[2, 1\] \(one per row of q\), got \[3\]",
            ),
            ErrorCase(
                "row_scale heads",
                "ops.qspmm(ip, ix, q3, 1.0, None, None, torch.ones(2, 2, device=dev))",
                "ValueError",
                r"\[2\], \[2, 1\] or \[2, 3\] \(one per row of q\), got \[2, 2\]",
            ),
            ErrorCase(
                "row_scale per head on [N, D]",
                "ops.qspmm(ip, ix, q, 1.0, None, None, torch.ones(2, 4, device=dev))",
                "ValueError",
                "row_scale must have shape",
            ),
            ErrorCase(
                "row_scale 3-d",
                "ops.qspmm(ip, ix, q3, 1.0, None, None, torch.ones(2, 3, 1, device=dev))",
                "ValueError",
                "row_scale must have shape",
            ),
            ErrorCase(
                "row_scale 0-d",
                "ops.qspmm(ip, ix, q, 1.0, None, None, torch.ones((), device=dev))",
                "ValueError",
                "row_scale must have shape",
            ),
            ErrorCase(
                "row_scale sparse",
                "ops.qspmm(ip, ix, q, 1.0, None, None, torch.ones(2, device=dev).to_sparse())",
                "ValueError",
                "row_scale must be a dense",
            ),
            ErrorCase(
                "row_scale device",
                "ops.qspmm(ip, ix, q, 1.0, None, None, torch.ones(2, device=other))",
                "ValueError",
                "row_scale is on",
            ),
            ErrorCase(
                "index, row_scale",
                "ops.qspmm(ip, i64(0, 1, 2), q, 1.0, None, None, torch.ones(2, device=dev))",
                "ValueError",
                r"an entry of indices is outside \[0, 2\) \(rows of q\)$",
            ),
            ErrorCase(
                "index, row_scale per head, weight",
                "ops.qspmm(ip, i64(0, -1, 1), q3, 1.0, w, ix, torch.ones(2, 3, device=dev))",
                "ValueError",
                "outside",
            ),
        ],
        device,
        SETUP,
    )
