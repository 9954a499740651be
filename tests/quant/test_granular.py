"""Tile-wise symmetric quantization and the Hadamard rotation (qtrain.quant.granular): each
tile is quantize_symmetric of its own values at its elements' counters; the rotation is
orthonormal and leaves a product unchanged."""

from __future__ import annotations

import pytest
import torch

from qtrain.quant import counter_uniform, qmax_for, quantize_symmetric
from qtrain.quant.granular import (
    dequantize_tiles,
    hadamard_matrix,
    hadamard_rotate,
    quantize_cols_symmetric,
    quantize_rows_symmetric,
    quantize_tiles,
)

ROUNDINGS = ("nearest", "stochastic")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _outliers(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random rows with a few rows and one column 1000x larger (hub nodes, one feature)."""
    x = torch.randn(rows, cols, generator=_gen(seed))
    x[:: max(rows // 3, 1)] *= 1000.0
    x[:, cols // 2] *= 1000.0
    return x


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits", range(2, 9))
def test_one_tile_is_quantize_symmetric(bits: int, rounding: str) -> None:
    x = _outliers(37, 13, bits)
    q, scale = quantize_tiles(x, bits, (37, 13), rounding, seed=5, offset=11)
    want_q, want_scale = quantize_symmetric(x, bits, rounding, seed=5, offset=11)
    assert torch.equal(q, want_q) and scale.shape == (1, 1)
    assert torch.equal(scale.reshape(()), want_scale)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("cols", [1, 7, 64, 129])
def test_a_row_tile_is_quantize_symmetric_of_the_row(bits: int, rounding: str, cols: int) -> None:
    """One scale a row: row i is quantize_symmetric of that row at counter offset + i * cols."""
    x = _outliers(9, cols, cols)
    q, scale = quantize_tiles(x, bits, (1, cols), rounding, seed=3, offset=100)
    assert scale.shape == (9, 1)
    for i in range(9):
        want_q, want_scale = quantize_symmetric(x[i], bits, rounding, 3, 100 + i * cols)
        assert torch.equal(q[i], want_q), i
        assert torch.equal(scale[i, 0], want_scale), i


@pytest.mark.parametrize("tile", [(5, 1), (1, 4), (2, 3), (100, 100)])
def test_tiles_nearest_and_stochastic(tile: tuple[int, int]) -> None:
    """Columns, blocks along a row (the last block shorter: 11 = 2 * 4 + 3) and 2 x 3 tiles:
    nearest is quantize_symmetric of the tile; stochastic uses the element's flat counter."""
    x = _outliers(10, 11, 4)
    q, scale = quantize_tiles(x, 4, tile, "nearest")
    tr, tc = min(tile[0], 10), min(tile[1], 11)
    assert scale.shape == (-(-10 // tr), -(-11 // tc))
    for a in range(0, 10, tr):
        for b in range(0, 11, tc):
            want_q, want_scale = quantize_symmetric(x[a : a + tr, b : b + tc], 4)
            assert torch.equal(q[a : a + tr, b : b + tc], want_q)
            assert torch.equal(scale[a // tr, b // tc], want_scale)
    qs, _ = quantize_tiles(x, 4, tile, "stochastic", seed=9, offset=7)
    u = counter_uniform(x.numel(), 9, 7).reshape(x.shape)
    v = x / dequantize_tiles(torch.ones_like(qs), scale, tile)
    want = torch.clamp(torch.floor(v + u), -7, 7).to(torch.int8)
    # v here divides instead of multiplying by the float32 inverse: equal but for ties
    assert float((qs != want).float().mean()) < 0.01


def test_finer_tiles_lose_less_on_outliers() -> None:
    """What the tiles are for: at 4 bits, with a few rows 1000x the rest (hub nodes), one
    scale for the tensor rounds every ordinary row to zero; one scale a row keeps them."""
    x = torch.randn(64, 32, generator=_gen(1))
    x[::21] *= 1000.0
    ordinary = torch.arange(64) % 21 != 0
    errors = {}
    for tile in [(64, 32), (1, 32), (1, 8)]:
        q, scale = quantize_tiles(x, 4, tile)
        errors[tile] = float((dequantize_tiles(q, scale, tile) - x)[ordinary].abs().mean())
    assert errors[(1, 32)] < errors[(64, 32)] / 4
    assert errors[(1, 8)] <= errors[(1, 32)]


def test_edge_cases() -> None:
    # all-zero tiles: scale 0, q 0, never NaN; the other tiles unaffected
    x = torch.zeros(4, 6)
    x[1] = torch.arange(6.0)
    q, scale = quantize_tiles(x, 3, (1, 6))
    assert torch.equal(scale[:, 0], torch.tensor([0.0, 5.0 / 3, 0.0, 0.0]))
    assert int(q[0].abs().sum()) == 0 and torch.equal(q[1], quantize_symmetric(x[1], 3)[0])
    assert bool(torch.isfinite(dequantize_tiles(q, scale, (1, 6))).all())
    # constant rows, negative too: every element on the top level
    q, _ = quantize_tiles(torch.full((3, 5), -2.5), 4, (1, 5))
    assert bool((q == -qmax_for(4)).all())
    # tiny values (qmax / absmax overflows float32): still every level used
    tiny = torch.tensor([[1e-40, -2e-40, 3e-40]])
    q, scale = quantize_tiles(tiny, 8, (1, 3))
    assert torch.equal(q, quantize_symmetric(tiny, 8)[0]) and int(q.abs().max()) == 127
    # empty: int8 of the shape, scales of the tiles there are
    q, scale = quantize_tiles(torch.zeros(0, 5), 4, (1, 5))
    assert q.shape == (0, 5) and q.dtype == torch.int8 and scale.shape == (0, 1)
    # a tile larger than the tensor is the whole dimension
    x = torch.randn(3, 4, generator=_gen(2))
    assert torch.equal(quantize_tiles(x, 5, (1, 99))[0], quantize_tiles(x, 5, (1, 4))[0])


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: quantize_tiles(torch.ones(3), 4, (1, 3)), ValueError, "2-d tensor"),
        (lambda: quantize_tiles(torch.ones(2, 2), 4, (0, 2)), ValueError, "positive ints"),
        (lambda: quantize_tiles(torch.ones(2, 2), 4, (1, 2.0)), ValueError, "positive ints"),
        (lambda: quantize_tiles(torch.ones(2, 2), 4, [1, 2]), ValueError, "positive ints"),
        (lambda: quantize_tiles(torch.ones(2, 2), 1, (1, 2)), ValueError, "bits must be"),
        (lambda: quantize_tiles(torch.ones(2, 2), 4, (1, 2), "up"), ValueError, "rounding"),
        (
            lambda: quantize_tiles(torch.ones(2, 2, dtype=torch.int32), 4, (1, 2)),
            TypeError,
            "float",
        ),
        (
            lambda: quantize_tiles(torch.tensor([[1.0, float("nan")]]), 4, (1, 2)),
            ValueError,
            "NaN or Inf",
        ),
        (lambda: hadamard_matrix(12), ValueError, "power of two"),
        (lambda: hadamard_rotate(torch.ones(2, 4), 0), ValueError, "power of two"),
        (lambda: hadamard_rotate(torch.ones(2, 4, dtype=torch.int64), 2), TypeError, "float"),
    ],
)
def test_errors(call, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("n", [1, 2, 4, 32, 128])
def test_hadamard_is_orthonormal(n: int) -> None:
    h = hadamard_matrix(n).double()
    assert torch.allclose(h @ h.t(), torch.eye(n, dtype=torch.float64), atol=1e-6)
    assert bool((h.abs() == h[0, 0].abs()).all())  # every entry +-1 / sqrt(n)


@pytest.mark.parametrize("block", [1, 4, 16, 64])
@pytest.mark.parametrize("inner", [1, 7, 16, 100])
def test_rotating_both_operands_keeps_the_product(block: int, inner: int) -> None:
    """(A H)(H^T B) = A B with the inner dimension padded to a multiple of the block."""
    a = torch.randn(9, inner, generator=_gen(inner)).double()
    b = torch.randn(inner, 5, generator=_gen(block)).double()
    ra, rb = hadamard_rotate(a, block), hadamard_rotate(b.t(), block)
    assert ra.shape[-1] == -(-inner // block) * block and ra.dtype == torch.float32
    assert torch.allclose(ra.double() @ rb.double().t(), a @ b, atol=1e-4)


def test_rotation_spreads_an_outlier() -> None:
    """One column 20x the others' spread: after a 64-block rotation its magnitude is shared
    by the whole block, so a 4-bit row loses far less (squared error) than without it."""
    x = torch.randn(32, 64, generator=_gen(4))
    x[:, 5] = 20.0
    plain_q, plain_s = quantize_tiles(x, 4, (1, 64))
    plain = dequantize_tiles(plain_q, plain_s, (1, 64))
    rot_q, rot_s = quantize_tiles(hadamard_rotate(x, 64), 4, (1, 64))
    back = hadamard_rotate(dequantize_tiles(rot_q, rot_s, (1, 64)), 64)  # H is its own inverse
    assert float(((back - x) ** 2).mean()) < float(((plain - x) ** 2).mean()) / 4


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_rows_and_columns_are_their_tiles(rounding: str) -> None:
    """quantize_rows_symmetric / quantize_cols_symmetric are the (1, cols) / (rows, 1) tiles,
    column j's counters those of its elements in x (offset + i * cols + j)."""
    x = _outliers(11, 6, 4)
    q, scale = quantize_rows_symmetric(x, 3, rounding, 2, 40)
    want = quantize_tiles(x, 3, (1, 6), rounding, 2, 40)
    assert torch.equal(q, want[0]) and torch.equal(scale, want[1]) and scale.shape == (11, 1)
    q, scale = quantize_cols_symmetric(x, 3, rounding, 2, 40)
    want = quantize_tiles(x, 3, (11, 1), rounding, 2, 40)
    assert torch.equal(q, want[0]) and torch.equal(scale, want[1]) and scale.shape == (1, 6)
    if rounding == "nearest":  # no counters: a column is quantize_symmetric of the column
        for j in range(6):
            want_q, want_scale = quantize_symmetric(x[:, j].contiguous(), 3)
            assert torch.equal(q[:, j], want_q) and torch.equal(scale[0, j], want_scale)


def test_rows_and_columns_of_empty_tensors() -> None:
    q, scale = quantize_rows_symmetric(torch.zeros(3, 0), 4)
    assert q.shape == (3, 0) and torch.equal(scale, torch.zeros(3, 1))
    q, scale = quantize_cols_symmetric(torch.zeros(0, 5), 4)
    assert q.shape == (0, 5) and torch.equal(scale, torch.zeros(1, 5))
    q, scale = quantize_rows_symmetric(torch.zeros(0, 5), 4)
    assert q.shape == (0, 5) and scale.shape == (0, 1)
    with pytest.raises(ValueError, match="x must be a 2-d tensor"):
        quantize_cols_symmetric(torch.zeros(4), 4)
    with pytest.raises(ValueError, match="bits"):
        quantize_rows_symmetric(torch.zeros(3, 0), 9)
