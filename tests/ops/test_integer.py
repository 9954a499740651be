"""GCINT's integer numerics (qtrain.ops.integer) against scalar definitions written out
here: the MSB histogram, DyQ's window, requantization, Q_w, and the exact int32
products, on random inputs and edge cases, on every device present."""

from __future__ import annotations

import math

import pytest
import torch

from qtrain.ops import dispatch, integer
from qtrain.ops.graph import group_rows
from tests.ops.support import DEVICES, WIDTHS

EDGE_VALUES = [0, 1, -1, 2, -2, 127, 128, -129, 255, 2**24, -(2**24) - 1, 2**31 - 1, -(2**31)]


def _msb(v: int) -> int | None:
    return None if v == 0 else abs(v).bit_length() - 1


def _requantize(v: int, shift: int) -> int:
    m = abs(v)
    if shift:
        m = (m + (1 << (shift - 1))) >> shift
    m = min(m, 127)
    return -m if v < 0 else m


def _random_int32(n: int, seed: int, spread: int = 31) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, spread, (n,), generator=g)
    mags = torch.randint(0, 2**31 - 1, (n,), generator=g, dtype=torch.int64) >> (31 - bits)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    return (mags * sign).to(torch.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_msb_histogram_counts_leading_ones(device: str) -> None:
    x = torch.cat([torch.tensor(EDGE_VALUES, dtype=torch.int32), _random_int32(500, 0)])
    hist = integer.msb_histogram(x.to(device)).cpu()
    expected = [0] * 32
    for v in x.tolist():
        if (bit := _msb(v)) is not None:
            expected[bit] += 1
    assert hist.tolist() == expected
    assert hist[31] == 1  # only -2^31 reaches bit 31


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_dyq_shift_is_the_fullest_window(device: str, seed: int) -> None:
    x = _random_int32(300, seed, spread=12 + 4 * seed)
    counts = [0] * 32
    for v in x.tolist():
        if (bit := _msb(v)) is not None:
            counts[bit] += 1
    windows = [sum(counts[k : k + 7]) for k in range(26)]
    assert integer.dyq_shift(x.to(device)) == windows.index(max(windows))


@pytest.mark.parametrize("device", DEVICES)
def test_dyq_shift_edge_cases(device: str) -> None:
    zeros = torch.zeros(5, 3, dtype=torch.int32, device=device)
    assert integer.dyq_shift(zeros) == 0
    assert integer.dyq_shift(torch.zeros(0, 4, dtype=torch.int32, device=device)) == 0
    # every value in bits 0..6: every window from k = 0 holds all of them, the lowest wins
    small = torch.tensor([1, -5, 100, 127], dtype=torch.int32, device=device)
    assert integer.dyq_shift(small) == 0
    # one large constant: the windows that contain bit 20 tie; the lowest is 14
    constant = torch.full((7,), 2**20 + 3, dtype=torch.int32, device=device)
    assert integer.dyq_shift(constant) == 14
    # the top window is k = 25 (bits 25..31)
    top = torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32, device=device)
    assert integer.dyq_shift(top) == 25


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shift", [0, 1, 6, 7, 13, 25])
def test_requantize_rounds_saturates_and_keeps_the_sign(device: str, shift: int) -> None:
    x = torch.cat([torch.tensor(EDGE_VALUES, dtype=torch.int32), _random_int32(400, shift)])
    got = integer.requantize(x.to(device), shift)
    assert got.dtype == torch.int8 and got.device.type == torch.device(device).type
    assert got.cpu().tolist() == [_requantize(v, shift) for v in x.tolist()]
    assert int(got.abs().max()) <= 127


@pytest.mark.parametrize("device", DEVICES)
def test_divide_pow2_rounds_halves_away_from_zero_without_saturating(device: str) -> None:
    x = torch.tensor([0, 1, 2, 3, -1, -2, -3, 5, -5, 127 * 2**16], dtype=torch.int32)
    halved = integer.divide_pow2(x.to(device), 1)
    assert halved.dtype == torch.int32
    assert halved.cpu().tolist() == [0, 1, 1, 2, -1, -1, -2, 3, -3, 127 * 2**15]
    assert integer.divide_pow2(x.to(device), 0).cpu().tolist() == x.tolist()
    # 127 * 2^16 / 2^12 = 2032, far past int8: nothing saturates
    assert int(integer.divide_pow2(x, 12)[-1]) == 2032


@pytest.mark.parametrize("device", DEVICES)
def test_dyq_and_stq_are_requantize_at_their_windows(device: str) -> None:
    x = _random_int32(64, 7, spread=18).view(8, 8).to(device)
    for backend in ("reference", "auto"):
        q, shift = integer.dyq(x, backend)
        assert int(shift) == integer.dyq_shift(x)
        assert torch.equal(q, integer.requantize(x, int(shift), backend))
    assert torch.equal(integer.stq(x), integer.requantize(x, 7))


def test_requantize_refuses_bad_arguments() -> None:
    x = torch.ones(3, dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"requantize: shift must be an integer in 0\.\.25, got 26"
    ):
        integer.requantize(x, 26)
    with pytest.raises(ValueError, match="got -1"):
        integer.requantize(x, -1)
    with pytest.raises(TypeError, match=r"requantize: expects an int32 tensor, got torch\.float32"):
        integer.requantize(torch.ones(3), 7)
    with pytest.raises(TypeError, match="msb_histogram: expects an int32 tensor"):
        integer.msb_histogram(torch.ones(3, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_weights_is_the_ceiling_of_w_times_127_over_max(device: str) -> None:
    w = torch.tensor([[300, -300, 1, -1], [0, 150, -151, 7]], dtype=torch.int32)
    got = integer.quantize_weights(w.to(device)).cpu()
    expected = [[math.ceil(v * 127 / 300) for v in row] for row in w.tolist()]
    assert got.tolist() == expected
    assert got.dtype == torch.int8 and int(got.abs().max()) == 127
    zero = torch.zeros(3, 2, dtype=torch.int32, device=device)
    assert integer.quantize_weights(zero).abs().sum() == 0
    assert integer.quantize_weights(torch.zeros(0, 2, dtype=torch.int32)).shape == (0, 2)
    constant = torch.full((2, 3), -9, dtype=torch.int32, device=device)
    assert integer.quantize_weights(constant).cpu().unique().tolist() == [-127]


def _row_window(row: list[int]) -> list[int]:
    """Each row's own window, written out: the lowest shift that brings the row's largest
    magnitude under 2^7, then ``_requantize``."""
    row = [max(v, -(2**31 - 1)) for v in row]  # -2^31 is read as -(2^31 - 1)
    top = max((abs(v) for v in row), default=0)
    shift = max(0, top.bit_length() - 7)
    return [_requantize(v, shift) for v in row]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [1, 3, 47])
@pytest.mark.parametrize("spread", [1, 8, 20, 31])
def test_row_window_gives_each_row_its_own_window(device: str, width: int, spread: int) -> None:
    rows = 40
    x = _random_int32(rows * width, seed=width * spread, spread=spread).view(rows, width)
    x[0] = 0  # a row of zeros stays zero
    x[1] = -9  # a constant row
    x[2, 0] = 2**31 - 1  # the largest magnitudes: the top rounds up to 128 and saturates
    x[3, 0] = -(2**31)  # read as -(2^31 - 1): saturates to -127 like its mirror
    x[4] = 127  # fits already: no shift
    x[5, 0] = 128  # the smallest value that needs one
    got = integer.row_window(x.to(device)).cpu()
    assert got.dtype == torch.int8
    assert got.tolist() == [_row_window(row) for row in x.tolist()]
    # every row that is not all zeros uses its top bits: its largest magnitude is >= 64
    tops = got.abs().amax(dim=1)
    assert bool(((tops >= 64) | (x.abs().amax(dim=1) < 64)).all())


@pytest.mark.parametrize("device", DEVICES)
def test_row_window_empty_shapes(device: str) -> None:
    for shape in [(0, 5), (3, 0), (0, 0)]:
        got = integer.row_window(torch.zeros(shape, dtype=torch.int32, device=device))
        assert got.shape == shape and got.dtype == torch.int8


def test_row_window_refuses_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"row_window: expects an int32 tensor, got torch\.int8"):
        integer.row_window(torch.ones(2, 3, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"row_window: x must be a matrix \[rows, C\], got 1"):
        integer.row_window(torch.ones(3, dtype=torch.int32))


def _int8(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)


BACKENDS = ("reference", "auto")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_int_gemm_is_exact(device: str, width: int, layout: str) -> None:
    a, b = _int8((37, width), width), _int8((width, 11), width + 1)
    expected = a.to(torch.int64) @ b.to(torch.int64)
    stored_a = a.t().contiguous() if layout == "tn" else a
    stored_b = b.t().contiguous() if layout == "nt" else b
    for backend in BACKENDS:
        dispatch.reset()
        got = integer.int_gemm(stored_a.to(device), stored_b.to(device), layout, backend)
        assert got.dtype == torch.int32 and got.shape == (37, 11)
        assert torch.equal(got.cpu().to(torch.int64), expected)
        served = "reference" if backend == "reference" else f"ext-{torch.device(device).type}"
        assert dispatch.snapshot()["int_gemm"] == {served: 1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("m", "k", "n"), [(0, 4, 3), (4, 0, 3), (4, 3, 0), (1, 1, 1), (5, 9, 7)])
def test_int_gemm_edge_shapes(device: str, m: int, k: int, n: int) -> None:
    a, b = _int8((m, k), 0), _int8((k, n), 1)
    for backend in BACKENDS:
        got = integer.int_gemm(a.to(device), b.to(device), backend=backend).cpu()
        assert torch.equal(got.to(torch.int64), a.to(torch.int64) @ b.to(torch.int64))


def test_int_gemm_refuses_bad_operands() -> None:
    with pytest.raises(TypeError, match=r"int_gemm: expects an int8 tensor, got torch\.float32"):
        integer.int_gemm(torch.ones(2, 2), _int8((2, 2), 0))
    with pytest.raises(
        ValueError,
        match=r"int_gemm: inner dimensions differ for layout 'nn': \[2, 3\] and \[2, 2\]",
    ):
        integer.int_gemm(_int8((2, 3), 0), _int8((2, 2), 0))
    with pytest.raises(ValueError, match="int_gemm: layout must be one of nn, nt, tn, got 'tt'"):
        integer.int_gemm(_int8((2, 2), 0), _int8((2, 2), 0), "tt")
    with pytest.raises(ValueError, match="int_gemm: b is on meta but a is on cpu"):
        integer.int_gemm(_int8((2, 2), 0), _int8((2, 2), 0).to("meta"))


def _dense(src: torch.Tensor, dst: torch.Tensor, values: torch.Tensor, rows: int, cols: int):
    a = torch.zeros(rows, cols, dtype=torch.int64)
    for s, d, v in zip(src.tolist(), dst.tolist(), values.tolist(), strict=True):
        a[d, s] += v
    return a


def _graph(kind: str, nodes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if kind == "empty":
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    if kind == "hub":  # a power-law-like hub: every node points at node 0, plus a few more
        src = torch.cat([torch.arange(nodes), torch.randint(0, nodes, (nodes,), generator=g)])
        dst = torch.cat(
            [torch.zeros(nodes, dtype=torch.int64), torch.randint(0, nodes, (nodes,), generator=g)]
        )
        return src, dst
    # random with zero-in-degree nodes: destinations only in the first half
    src = torch.randint(0, nodes, (3 * nodes,), generator=g)
    dst = torch.randint(0, nodes // 2, (3 * nodes,), generator=g)
    return src, dst


def _csr(src: torch.Tensor, dst: torch.Tensor, values: torch.Tensor, rows: int):
    entries = torch.arange(src.numel())
    indptr, indices, order = group_rows(dst, src, entries, rows, torch.int64)
    return indptr, indices, values[order]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["empty", "hub", "random"])
@pytest.mark.parametrize("width", [1, 3, 16, 33])
def test_int_spmm_is_exact(device: str, kind: str, width: int) -> None:
    nodes = 40
    src, dst = _graph(kind, nodes, width)
    values = _int8((src.numel(),), width + 5)
    x = _int8((nodes, width), width + 6)
    indptr, indices, ordered = _csr(src, dst, values, nodes)
    expected = _dense(src, dst, values, nodes, nodes) @ x.to(torch.int64)
    for backend in BACKENDS:
        dispatch.reset()
        args = (indptr.to(device), indices.to(device), ordered.to(device), x.to(device))
        got = integer.int_spmm(*args, backend=backend)
        assert got.dtype == torch.int32 and got.shape == (nodes, width)
        assert torch.equal(got.cpu().to(torch.int64), expected)
        served = "reference" if backend == "reference" else f"ext-{torch.device(device).type}"
        assert dispatch.snapshot()["int_spmm"] == {served: 1}
        if kind == "random":  # nodes without in-edges get zero rows
            assert got[nodes // 2 :].abs().sum() == 0


def test_int_spmm_refuses_bad_operands() -> None:
    ptr, idx = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="int_spmm: indices and values must be 1-d and of one"):
        integer.int_spmm(ptr, idx, _int8((3,), 0), _int8((2, 2), 0))
    with pytest.raises(TypeError, match=r"int_spmm: expects an int8 tensor, got torch\.float32"):
        integer.int_spmm(ptr, idx, torch.ones(2), _int8((2, 2), 0))
    with pytest.raises(TypeError, match=r"int_spmm: expects an int32 or int64 tensor"):
        integer.int_spmm(ptr.float(), idx, _int8((2,), 0), _int8((2, 2), 0))
    with pytest.raises(
        ValueError, match=r"int_spmm: needs indptr \[rows \+ 1\] and x \[N, width\]"
    ):
        integer.int_spmm(ptr, idx, _int8((2,), 0), _int8((2,), 0))
