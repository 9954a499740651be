"""``torch.ops.qtrain.scatter_rows_add`` (``out[indices[k]] += x[r]`` over a block of CSR
rows) against its reference ``qtrain.ops.scatter.reference_scatter_rows_add`` on every device
and CPU variant: random graphs, an empty graph, zero-degree rows, a power-law hub, all-zero
and constant rows, odd widths, int32 / int64 indptr and indices mixed, row ranges that do not
start at 0, outputs with values in them; on the CPU bit for bit a sequential loop, whatever
the thread count; opcheck; the public wrapper's dispatch; and every error of the front and
of the kernels, after which out must be unchanged."""

from __future__ import annotations

import itertools

import pytest
import torch

from qtrain.ops import dispatch
from qtrain.ops.scatter import reference_scatter_rows_add, scatter_rows_add
from tests.ops.support import (
    DEVICES,
    ErrorCase,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)

WIDTHS = (1, 3, 7, 16, 33, 130)
INDEX_DTYPES = list(itertools.product((torch.int64, torch.int32), repeat=2))  # indptr, indices


def csr(src: torch.Tensor, dst: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 indptr [rows + 1] and indices of the entries (src[e] -> dst[e]) grouped by the
    source row, in entry order within a row."""
    order = torch.argsort(src, stable=True)
    indptr = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(src, minlength=rows), 0, out=indptr[1:])
    return indptr, dst[order]


def graph(kind: str, rows: int, n_out: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    if kind == "empty":
        none = torch.zeros(0, dtype=torch.int64)
        return csr(none, none, rows)
    if kind == "hub":
        # degrees ~ 1 / rank, row 0 with an entry for every output row; a third of all
        # entries land on output row 1
        degree = (rows * 2 / torch.arange(1, rows + 1)).long().clamp(max=n_out)
        degree[0] = n_out
        src = torch.repeat_interleave(torch.arange(rows), degree)
        dst = torch.randint(0, n_out, (src.numel(),), generator=g)
        dst[torch.rand(src.numel(), generator=g) < 1 / 3] = 1
        return csr(src, dst, rows)
    # random, sources only in the first half: the rest have degree 0
    edges = 4 * rows
    src = torch.randint(0, max(rows // 2, 1), (edges,), generator=g)
    return csr(src, torch.randint(0, n_out, (edges,), generator=g), rows)


def sequential(
    out: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """The definition as a loop, one float32 row add at a time in (r, k) order."""
    out = out.clone()
    for r in range(indptr.numel() - 1):
        for k in range(int(indptr[r]), int(indptr[r + 1])):
            out[int(indices[k])] += x[r]
    return out


def order_bound(
    out: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """How far two float32 sums of the same terms in different orders may differ, per element
    of out: each add rounds by at most half an ulp of the running sum, which is at most the sum
    of the terms' magnitudes (n adds: n * 2^-24 * sum |term|, the first-order bound). The CUDA
    kernel adds by float32 atomics in the order the hardware picks, so a hub row of out that
    gathers a hundred rows differs from the reference by more than a fixed tolerance allows."""
    ptr = indptr.to(torch.int64)
    lo, hi = int(ptr[0]), int(ptr[-1])
    used = indices[lo:hi].to(torch.int64)
    rows = x.abs().double().repeat_interleave(ptr[1:] - ptr[:-1], dim=0)
    magnitude = out.abs().double().index_add_(0, used, rows)
    adds = torch.bincount(used, minlength=out.shape[0]).double().unsqueeze(1)
    return adds * 2.0**-24 * magnitude


def _close(got: torch.Tensor, want: torch.Tensor, what: str, bound: torch.Tensor) -> None:
    """got and want within twice the order bound (each is one order's sum) and 1e-6."""
    err = (got.cpu().double() - want.cpu().double()).abs()
    excess = err - (2 * bound.reshape(err.shape) + 1e-6)
    assert bool((excess <= 0).all()), f"{what}: off by {float(err.max()):.3g}, over the bound"


def _check(
    device: str,
    out: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    x: torch.Tensor,
    what: str,
) -> None:
    """Every index dtype pair and variant against the reference (to float32 rounding) and,
    on the CPU, against the sequential loop bit for bit."""
    ops = library(device)
    want = out.clone()
    reference_scatter_rows_add(want, indptr, indices, x)
    exact = sequential(out, indptr, indices, x)
    bound = order_bound(out, indptr, indices, x)
    for ptr_dtype, idx_dtype in INDEX_DTYPES:
        for variant in variants(device):
            got = out.to(device, copy=True)
            ops.scatter_rows_add(
                got, indptr.to(device, ptr_dtype), indices.to(device, idx_dtype), x.to(device)
            )
            how = f"{what}, indptr {ptr_dtype}, indices {idx_dtype}, {variant}"
            _close(got, want, how, bound)
            if torch.device(device).type == "cpu":
                assert torch.equal(got, exact), how


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["empty", "hub", "random"])
@pytest.mark.parametrize("width", WIDTHS)
def test_graphs(device: str, kind: str, width: int) -> None:
    rows, n_out = 40, 70
    indptr, indices = graph(kind, rows, n_out, width)
    g = gen(width + 1)
    x = torch.randn(rows, width, generator=g)
    out = torch.randn(n_out, width, generator=g)  # sums land on values already there
    _check(device, out, indptr, indices, x, f"{kind}, D {width}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [0.0, 1.5, -2.0])
def test_constant_rows(device: str, value: float) -> None:
    """Constant x: every sum is exact (small multiples of 1.5 or 2), on CUDA too."""
    indptr, indices = graph("hub", 30, 50, 3)
    x = torch.full((30, 17), value)
    out = torch.full((50, 17), 0.5)
    _check(device, out, indptr, indices, x, f"x = {value}")
    got = out.to(device, copy=True)
    library(device).scatter_rows_add(got, indptr.to(device), indices.to(device), x.to(device))
    degree = torch.bincount(indices, minlength=50).to(torch.float32)
    assert torch.equal(got.cpu(), out + degree[:, None] * value)


@pytest.mark.parametrize("device", DEVICES)
def test_row_ranges(device: str) -> None:
    """indptr[a : b + 1] of a full CSR with the full indices equals the rebased slice; the
    entries outside the range (here invalid indices) are never read."""
    rows, n_out, width = 50, 40, 9
    full_ptr, full_idx = graph("hub", rows, n_out, 5)
    nnz = full_idx.numel()
    # the entries before the first range and after the last are out of range: never read
    padded = torch.cat([torch.tensor([-5, n_out]), full_idx, torch.tensor([n_out + 3, -1])])
    full_ptr = full_ptr + 2
    g = gen(6)
    x = torch.randn(rows, width, generator=g)
    ops = library(device)
    for a, b in [(0, rows), (1, 7), (10, 40), (0, 1), (49, 50), (23, 23), (0, 0), (50, 50)]:
        ptr = full_ptr[a : b + 1]
        lo, hi = int(ptr[0]), int(ptr[-1])
        assert 2 <= lo <= hi <= nnz + 2
        out = torch.randn(n_out, width, generator=g)
        want = sequential(out, ptr - lo, padded[lo:hi], x[a:b])
        rebased = out.clone()
        reference_scatter_rows_add(rebased, ptr - lo, padded[lo:hi], x[a:b])
        assert torch.equal(rebased, want)
        in_place = out.clone()
        reference_scatter_rows_add(in_place, ptr, padded, x[a:b])
        assert torch.equal(in_place, want), "the reference on the range"
        bound = order_bound(out, ptr, padded, x[a:b])
        for ptr_dtype, idx_dtype in INDEX_DTYPES:
            for variant in variants(device):
                got = out.to(device, copy=True)
                ops.scatter_rows_add(
                    got,
                    ptr.to(device, ptr_dtype),
                    padded.to(device, idx_dtype),
                    x[a:b].to(device),
                )
                how = f"rows {a}..{b}, {ptr_dtype}, {idx_dtype}, {variant}"
                _close(got, want, how, bound)
                if torch.device(device).type == "cpu":
                    assert torch.equal(got, want), how


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs(device: str) -> None:
    """indptr, indices and x as strided views; out a run of a larger tensor at an odd
    offset (contiguous, not 16-byte aligned), whose elements around it stay as they were."""
    ptr, idx = graph("random", 20, 30, 8)
    g = gen(9)
    x = torch.randn(20, 11, generator=g)
    big = torch.randn(32 * 11, generator=g)
    want = big.clone()
    want[11 : 11 + 330] = sequential(big[11 : 11 + 330].view(30, 11), ptr, idx, x).view(-1)
    bound = torch.zeros(big.shape, dtype=torch.float64)
    bound[11 : 11 + 330] = order_bound(big[11 : 11 + 330].view(30, 11), ptr, idx, x).view(-1)
    ptr_s = torch.stack([ptr, ptr], 1).reshape(-1).to(device)[::2]
    idx_s = torch.stack([idx, idx], 1).reshape(-1).int().to(device)[::2]
    x_s = torch.cat([x, x], 1).to(device)[:, :11]
    assert ptr_s.stride() == (2,) and idx_s.stride() == (2,) and not x_s.is_contiguous()
    for variant in variants(device):
        big_dev = big.to(device, copy=True)
        out = big_dev[11 : 11 + 330].view(30, 11)
        library(device).scatter_rows_add(out, ptr_s, idx_s, x_s)
        _close(big_dev, want, variant, bound)
        if torch.device(device).type == "cpu":
            assert torch.equal(big_dev, want), variant


@pytest.mark.parametrize("device", DEVICES)
def test_empty_cases(device: str) -> None:
    ops = library(device)
    g = gen(2)
    none = torch.zeros(0, dtype=torch.int64)
    out = torch.randn(5, 4, generator=g)
    cases = [
        # R = 0: one indptr entry, anywhere in indices
        (out, torch.zeros(1, dtype=torch.int64), none, torch.zeros(0, 4)),
        (out, torch.tensor([3]), torch.tensor([9, 9, 9, 9, 9]), torch.zeros(0, 4)),
        # D = 0, with entries
        (torch.zeros(5, 0), torch.tensor([0, 2, 3]), torch.tensor([4, 0, 1]), torch.zeros(2, 0)),
        # N = 0 and no entries read; rows of degree 0
        (torch.zeros(0, 4), torch.zeros(4, dtype=torch.int64), none, torch.ones(3, 4)),
        (torch.zeros(0, 0), torch.tensor([2, 2]), torch.tensor([-1, 7]), torch.ones(1, 0)),
        (out, torch.tensor([0, 0, 2, 2, 2]), torch.tensor([4, 4]), torch.ones(4, 4)),
    ]
    for i, (base, ptr, idx, x) in enumerate(cases):
        want = sequential(base, ptr, idx, x)
        reference = base.clone()
        reference_scatter_rows_add(reference, ptr, idx, x)
        assert torch.equal(reference, want), f"case {i}: the reference"
        for ptr_dtype, idx_dtype in INDEX_DTYPES:
            got = base.to(device, copy=True)
            ops.scatter_rows_add(
                got, ptr.to(device, ptr_dtype), idx.to(device, idx_dtype), x.to(device)
            )
            assert torch.equal(got.cpu(), want), f"case {i}, {ptr_dtype}, {idx_dtype}"


def test_cpu_bits_do_not_depend_on_threads_or_isa(threads: None) -> None:
    """Large enough for two threads (each owns every other 64-row chunk of out): bit for
    bit the same with 1 and 2 threads and every ISA variant, and the reference's to float32
    rounding; a hub output row and a hub source row included."""
    ops = library("cpu")
    rows, n_out, width = 3000, 5000, 33
    indptr, indices = graph("hub", rows, n_out, 11)
    assert indices.numel() * width > 4 * 2**16  # plan_threads gives it two threads
    g = gen(12)
    x = torch.randn(rows, width, generator=g)
    out = torch.randn(n_out, width, generator=g)
    want = out.clone()
    reference_scatter_rows_add(want, indptr, indices, x)
    torch.set_num_threads(1)
    one = out.clone()
    ops.scatter_rows_add(one, indptr, indices, x)
    torch.set_num_threads(2)
    two = out.clone()
    ops.scatter_rows_add(two, indptr, indices.int(), x)
    assert torch.equal(one, two)
    _close(one, want, "1 thread", order_bound(out, indptr, indices, x))
    for variant in variants("cpu"):
        got = out.clone()
        ops.scatter_rows_add(got, indptr.int(), indices, x)
        assert torch.equal(got, one), variant


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_dispatch(device: str) -> None:
    indptr, indices = graph("random", 12, 9, 4)
    x = torch.randn(12, 5, generator=gen(5))
    want = sequential(torch.ones(9, 5), indptr, indices, x)
    for backend in ("reference", "auto"):
        dispatch.reset()
        got = torch.ones(9, 5, device=device)
        scatter_rows_add(got, indptr.to(device), indices.to(device), x.to(device), backend)
        _close(got, want, backend, order_bound(torch.ones(9, 5), indptr, indices, x))
        served = "reference" if backend == "reference" else f"ext-{torch.device(device).type}"
        assert dispatch.snapshot()["scatter_rows_add"] == {served: 1}


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    g = gen(3)
    for kind, width in (("random", 5), ("hub", 16), ("empty", 3)):
        indptr, indices = graph(kind, 12, 9, 2)
        for ptr, x in (
            (indptr, torch.randn(12, width, generator=g)),
            (indptr[3:9], torch.randn(5, width, generator=g)),
        ):
            args = (torch.randn(9, width, generator=g), ptr.int(), indices, x)
            opcheck(ops.scatter_rows_add.default, tuple(t.to(device) for t in args))


# (name, code, error, match): the kernels' errors, raised before anything is added
KERNEL_ERRORS = [
    ("indptr start", "f(out, ip - 1, ix, x)", "indptr\\[0\\] must be >= 0, got -1"),
    (
        "indptr order",
        "f(out, torch.tensor([0, 3, 2]).to(dev), ix, x)",
        "indptr must be non-decreasing, but indptr\\[2\\] < indptr\\[1\\]",
    ),
    (
        "indptr end",
        "f(out, torch.tensor([0, 2, 4]).to(dev), ix, x)",
        "indptr\\[-1\\] must be at most the number of entries of indices \\(3\\), got 4",
    ),
    (
        "indptr end, no rows",
        "f(out, torch.tensor([4]).to(dev), ix, x[:0])",
        "indptr\\[-1\\] must be at most the number of entries of indices \\(3\\), got 4",
    ),
    (
        "index negative",
        "f(out, ip, torch.tensor([0, -1, 1]).to(dev), x)",
        "indices\\[1\\] = -1 is outside \\[0, 4\\) \\(the rows of out\\)",
    ),
    (
        "index N",
        "f(out, ip, torch.tensor([0, 1, 4]).to(dev, torch.int32), x)",
        "indices\\[2\\] = 4 is outside \\[0, 4\\) \\(the rows of out\\)",
    ),
    (
        "first of two indices named",
        "f(out, ip, torch.tensor([0, 7, -1]).to(dev), x)",
        "indices\\[1\\] = 7 is outside \\[0, 4\\)",
    ),
    (
        "index in a row range",
        "f(out, torch.tensor([1, 2, 3]).to(dev), torch.tensor([-9, 0, 5]).to(dev), x)",
        "indices\\[2\\] = 5 is outside \\[0, 4\\)",
    ),
    (
        "index into an out without rows",
        "f(out[:0], ip, ix, x)",
        "indices\\[0\\] = 0 is outside \\[0, 0\\)",
    ),
]

_SETUP = """
out = torch.arange(12, dtype=torch.float32).view(4, 3).to(dev)
ip = torch.tensor([0, 2, 3]).to(dev)
ix = torch.tensor([0, 3, 1]).to(dev)
x = torch.ones(2, 3).to(dev)

def unchanged(call):
    # the call must raise, and leave out as it was
    before = out.clone()
    try:
        call()
    finally:
        assert torch.equal(out, before), "out was changed"

f = ops.scatter_rows_add
"""


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    fn = "qtrain::scatter_rows_add"
    cases = [
        ErrorCase(
            "float64 out", "f(out.double(), ip, ix, x)", "TypeError", f"{fn}: out must be float32"
        ),
        ErrorCase("1-d out", "f(out.view(-1), ip, ix, x)", "ValueError", "out must have shape"),
        ErrorCase(
            "strided out",
            "f(torch.zeros(3, 4, device=dev).t(), ip, ix, x)",
            "ValueError",
            "out must be a contiguous tensor \\(it is written in place\\)",
        ),
        ErrorCase(
            "float indptr",
            "f(out, ip.float(), ix, x)",
            "TypeError",
            "indptr must be int32 or int64, got float32",
        ),
        ErrorCase("2-d indptr", "f(out, ip.view(1, 3), ix, x)", "ValueError", "indptr must be 1-d"),
        ErrorCase(
            "int8 indices",
            "f(out, ip, ix.to(torch.int8), x)",
            "TypeError",
            "indices must be int32 or int64, got int8",
        ),
        ErrorCase(
            "2-d indices", "f(out, ip, ix.view(3, 1), x)", "ValueError", "indices must be 1-d"
        ),
        ErrorCase("float64 x", "f(out, ip, ix, x.double())", "TypeError", "x must be float32"),
        ErrorCase(
            "1-d x", "f(out, ip[:2], ix, x[0])", "ValueError", "x must have shape \\[R, D\\]"
        ),
        ErrorCase(
            "empty indptr",
            "f(out, ip[:0], ix, x[:0])",
            "ValueError",
            "indptr needs at least one entry",
        ),
        ErrorCase(
            "rows of x",
            "f(out, ip, ix, torch.ones(3, 3, device=dev))",
            "ValueError",
            "x must have one row per row of indptr \\(2\\), got 3",
        ),
        ErrorCase(
            "width of x",
            "f(out, ip, ix, torch.ones(2, 5, device=dev))",
            "ValueError",
            "x and out must have one width, got 5 and 3",
        ),
        ErrorCase("indptr elsewhere", "f(out, ip.to(other), ix, x)", "ValueError", "indptr is on"),
        ErrorCase(
            "indices elsewhere", "f(out, ip, ix.to(other), x)", "ValueError", "indices is on"
        ),
        ErrorCase("x elsewhere", "f(out, ip, ix, x.to(other))", "ValueError", "x is on"),
        ErrorCase(
            "out elsewhere", "f(out.to(other), ip, ix, x)", "ValueError", "indptr is on .* but out"
        ),
    ]
    cases += [
        ErrorCase(name, f"unchanged(lambda: {code})", "ValueError", f"{fn}: {match}")
        for name, code, match in KERNEL_ERRORS
    ]
    expect_errors(cases, device, _SETUP)


@pytest.mark.parametrize(
    ("name", "code", "match"), KERNEL_ERRORS, ids=[c[0] for c in KERNEL_ERRORS]
)
def test_reference_errors(name: str, code: str, match: str) -> None:
    """The reference refuses the same data with the same messages, out untouched."""
    names: dict[str, object] = {"torch": torch, "ops": None, "dev": torch.device("cpu")}
    exec(_SETUP.replace("f = ops.scatter_rows_add", ""), names)
    names["f"] = reference_scatter_rows_add
    with pytest.raises(ValueError, match=f"^scatter_rows_add: {match}"):
        exec(f"unchanged(lambda: {code})", names)
