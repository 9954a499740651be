"""Activation compression (exact plugin): the reference's properties, and ext == reference.

The reference (``qtrain.quant.rowwise``, ``qtrain.quant.projection``) defines
every float32 operation, so the ext-cpu kernels must agree bit for bit: packed
bytes, the bfloat16 zero points and ranges, the dequantized floats, the
Rademacher matrix and the fused projection kernels, for every ISA variant this
CPU runs and 1 / 2 threads.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import ext_or_skip, float_bits, varied_rows

from qtrain import backends
from qtrain.ops import compress, dispatch
from qtrain.quant import projection
from qtrain.quant import rowwise as ref
from qtrain.quant.rng import normalize_seed

BITS = (1, 2, 4, 8)
ROUNDINGS = ("nearest", "stochastic")
WIDTHS = (1, 3, 5, 17, 33, 127, 129, 256)
# (seed, offset): offsets next to 2^32 make the counter's high word change inside a row
STREAMS = ((0, 0), (-1, 2**32 - 50), (2**64 - 7, 12345))


def _assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], *why: object) -> None:
    assert len(a) == len(b)
    for s, t in zip(a, b, strict=True):
        assert s.dtype == t.dtype and s.shape == t.shape, why
        if s.dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(float_bits(s), float_bits(t)), why
        else:
            assert torch.equal(s, t), why


# ------------------------------------------------------------------ reference: packing


@pytest.mark.parametrize("bits", BITS)
def test_reference_pack_round_trip(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    for n in (0, 1, 3, 7, 8, 9, 13, 31, 100, 1001):
        v = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        packed = ref.pack_bits(v, bits)
        assert packed.dtype == torch.uint8 and packed.shape == (ref.packed_size(n, bits),)
        assert packed.numel() == math.ceil(n * bits / 8)
        # values are masked to `bits` bits
        assert torch.equal(ref.unpack_bits(packed, bits, n), v & ((1 << bits) - 1))
        # a longer stream decodes to the same prefix
        longer = torch.cat([packed, torch.full((3,), 255, dtype=torch.uint8)])
        assert torch.equal(ref.unpack_bits(longer, bits, n), v & ((1 << bits) - 1))


def test_reference_pack_layout_is_little_endian_and_dense() -> None:
    v = torch.tensor([1, 0, 1, 1, 0, 0, 0, 1, 1], dtype=torch.uint8)
    assert ref.pack_bits(v, 1).tolist() == [0b10001101, 0b1]
    assert ref.pack_bits(torch.tensor([1, 2, 3, 0, 3], dtype=torch.uint8), 2).tolist() == [
        0b00111001,
        0b11,
    ]
    assert ref.pack_bits(torch.tensor([0xA, 0x5, 0xF], dtype=torch.uint8), 4).tolist() == [
        0x5A,
        0x0F,
    ]
    mask = torch.tensor([[True, False, True], [False, False, True]])
    assert ref.pack_bits(mask, 1).tolist() == [0b100101]
    # rows are not byte aligned: 3 rows of 3 two-bit values take 18 bits = 3 bytes
    p, _, _ = ref.quantize_rows(torch.ones(3, 3), 2, "nearest")
    assert p.numel() == 3


def test_reference_pack_errors() -> None:
    for bits in (0, 3, 16, True, 2.5, "4", None):
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ref.pack_bits(torch.zeros(3, dtype=torch.uint8), bits)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="uint8"):
        ref.pack_bits(torch.zeros(3, dtype=torch.int32), 2)
    with pytest.raises(TypeError, match="1-d uint8"):
        ref.unpack_bits(torch.zeros(3, dtype=torch.int32), 2, 3)
    with pytest.raises(TypeError, match="1-d uint8"):
        ref.unpack_bits(torch.zeros(2, 2, dtype=torch.uint8), 2, 3)
    with pytest.raises(ValueError, match="need"):
        ref.unpack_bits(torch.zeros(2, dtype=torch.uint8), 2, 9)


# ------------------------------------------------------------------ reference: rows


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_reference_error_within_one_level(bits: int, rounding: str) -> None:
    x = varied_rows(64, 37, seed=bits)
    packed, zero, rng = ref.quantize_rows(x, bits, rounding, seed=3)
    assert packed.shape == (ref.packed_size(x.numel(), bits),)
    assert zero.dtype == rng.dtype == torch.bfloat16 and zero.shape == rng.shape == (64,)
    z, r = zero.float(), rng.float()
    assert bool((z <= x.amin(1)).all()) and bool((z + r >= x.amax(1)).all())
    x_hat = ref.dequantize_rows(packed, zero, rng, bits, 37)
    step = r / ((1 << bits) - 1)
    frac = 0.5 if rounding == "nearest" else 1.0
    bound = (frac * step * (1 + 1e-5) + 1e-6 * (z.abs() + r))[:, None]
    assert bool(((x_hat - x).abs() <= bound).all())


@pytest.mark.parametrize("bits", (1, 4))
def test_reference_stochastic_rounding_is_unbiased(bits: int) -> None:
    # every row spans [0, 1] exactly (bfloat16 values), the rest sits between two levels
    levels = (1 << bits) - 1
    value = 0.3 / levels + 2.0 / levels if bits > 1 else 0.3
    rows, width = 40, 1001
    x = torch.full((rows, width), value)
    x[:, 0], x[:, 1] = 0.0, 1.0
    packed, zero, rng = ref.quantize_rows(x, bits, "stochastic", seed=7)
    assert torch.equal(zero.float(), torch.zeros(rows)) and torch.equal(
        rng.float(), torch.ones(rows)
    )
    x_hat = ref.dequantize_rows(packed, zero, rng, bits, width)[:, 2:]
    n = x_hat.numel()
    sd = math.sqrt(0.21 / n) / levels  # p(1 - p) / n with p = 0.3, in units of one level
    assert abs(x_hat.mean().item() - value) < 5 * sd
    near = ref.dequantize_rows(*ref.quantize_rows(x, bits, "nearest"), bits, width)[:, 2:]
    assert abs(near.mean().item() - value) > 0.2 / levels  # nearest is biased here
    # same seed, same draws; another seed, other draws
    assert torch.equal(packed, ref.quantize_rows(x, bits, "stochastic", seed=7)[0])
    assert not torch.equal(packed, ref.quantize_rows(x, bits, "stochastic", seed=8)[0])


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_reference_zero_and_constant_rows(rounding: str) -> None:
    x = torch.stack([torch.zeros(9), torch.full((9,), 2.5), torch.full((9,), -2.5)])
    packed, zero, rng = ref.quantize_rows(x, 4, rounding, seed=1)
    assert zero.float().tolist() == [0.0, 2.5, -2.5] and rng.float().tolist() == [0.0] * 3
    assert torch.equal(ref.dequantize_rows(packed, zero, rng, 4, 9), x)  # exact, never NaN
    # a constant that bfloat16 cannot hold: zero below it, zero + range above it
    for c in (0.1, -0.1, 1234.567):
        xc = torch.full((2, 5), c)
        p, z, r = ref.quantize_rows(xc, 2, rounding, seed=1)
        assert float(z[0]) <= c <= float(z[0]) + float(r[0]) and float(r[0]) > 0
        err = (ref.dequantize_rows(p, z, r, 2, 5) - xc).abs().max().item()
        assert err <= float(r[0]) / 3 * (1 + 1e-5)


def test_reference_empty_inputs() -> None:
    for rows, width in ((0, 5), (5, 0), (0, 0)):
        for bits in BITS:
            packed, zero, rng = ref.quantize_rows(torch.empty(rows, width), bits)
            assert packed.shape == (0,) and packed.dtype == torch.uint8
            assert zero.shape == rng.shape == (rows,) and zero.dtype == torch.bfloat16
            back = ref.dequantize_rows(packed, zero, rng, bits, width)
            assert back.shape == (rows, width) and back.dtype == torch.float32


def test_reference_row_errors() -> None:
    x = torch.randn(4, 3)
    for bits in (0, 3, 16, True, 2.5, None):
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ref.quantize_rows(x, bits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rounding"):
        ref.quantize_rows(x, 4, "up")
    with pytest.raises(TypeError, match="2-d float32"):
        ref.quantize_rows(x.double(), 4)
    with pytest.raises(TypeError, match="2-d float32"):
        ref.quantize_rows(x.reshape(-1), 4)
    with pytest.raises(ValueError, match="offset"):
        ref.quantize_rows(x, 4, offset=-1)
    packed, zero, rng = ref.quantize_rows(x, 4)
    with pytest.raises(TypeError, match="bfloat16"):
        ref.dequantize_rows(packed, zero.float(), rng, 4, 3)
    with pytest.raises(TypeError, match="bfloat16"):
        ref.dequantize_rows(packed, zero, rng[:2], 4, 3)
    with pytest.raises(ValueError, match="need"):
        ref.dequantize_rows(packed[:-1], zero, rng, 4, 3)


def test_reference_rademacher() -> None:
    for d, k in ((1, 1), (7, 3), (64, 16), (0, 5)):
        r = projection.rademacher(d, k, seed=4, offset=11)
        mag = float(torch.tensor(1 / math.sqrt(k), dtype=torch.float32))
        assert r.dtype == torch.float32 and r.shape == (d, k)
        assert bool((r.abs() == mag).all())
        assert torch.equal(r, projection.rademacher(d, k, seed=4, offset=11))
    r = projection.rademacher(64, 16, seed=4, offset=11)
    assert 0.4 < (r > 0).float().mean().item() < 0.6
    assert not torch.equal(r, projection.rademacher(64, 16, seed=5, offset=11))
    # entry (i, j) is counter offset + i*k + j: the stream shifted by the offset
    long = projection.rademacher(1, 64 * 16 + 11, seed=4).sign().reshape(-1)
    assert torch.equal(r.sign().reshape(-1), long[11:])
    for d, k in ((-1, 3), (3, 0)):
        with pytest.raises(ValueError, match="d >= 0"):
            projection.rademacher(d, k)


def test_reference_projection_products_are_the_matrix_products() -> None:
    """project_rows / unproject_rows are x @ R and y @ R^T, summed in their fixed order."""
    g = torch.Generator().manual_seed(1)
    for rows, d, k in ((7, 64, 8), (3, 5, 9), (1, 1, 1), (0, 4, 2)):
        x = torch.randn(rows, d, generator=g)
        r = projection.rademacher(d, k, seed=2, offset=5)
        y = projection.project_rows(x, k, seed=2, offset=5)
        torch.testing.assert_close(y, x @ r, rtol=1e-5, atol=1e-6)
        back = projection.unproject_rows(y, d, seed=2, offset=5)
        torch.testing.assert_close(back, y @ r.t(), rtol=1e-5, atol=1e-6)
    # no input columns: the empty sum
    assert torch.equal(projection.project_rows(torch.empty(3, 0), 4), torch.zeros(3, 4))
    assert projection.unproject_rows(torch.empty(3, 4), 0).shape == (3, 0)
    with pytest.raises(TypeError, match="float32"):
        projection.project_rows(torch.zeros(3, 4, dtype=torch.float64), 2)
    with pytest.raises(TypeError, match="2-d"):
        projection.unproject_rows(torch.zeros(4), 2)


def test_reference_projection_round_trip_is_unbiased() -> None:
    """E[(h R) R^T] = h over the matrix's seeds (exact-iclr22 Proposition 2)."""
    h = torch.linspace(-1.0, 2.0, 24).reshape(1, 24)
    mean = torch.zeros_like(h)
    n = 400
    for seed in range(n):
        y = projection.project_rows(h, 6, seed=seed)
        mean += projection.unproject_rows(y, 24, seed=seed) / n
    # each entry's variance is |h|^2 (D - 1) / (K D) ~ 4.4 / n over n draws: sd ~ 0.1
    assert float((mean - h).abs().max()) < 0.45
    assert float((mean - h).abs().mean()) < 0.15


# ------------------------------------------------------------------ ext == reference


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_ext_quantize_rows_matches_reference(
    bits: int, rounding: str, isas: list[str], threads: None
) -> None:
    ext = ext_or_skip()
    for width in WIDTHS:
        for rows in (0, 1, 37):
            x = varied_rows(rows, width, seed=width * 100 + rows)
            for seed, offset in STREAMS:
                want = ref.quantize_rows(x, bits, rounding, seed, offset)
                back = ref.dequantize_rows(*want, bits, width)
                for i, isa in enumerate(isas):
                    ext.set_isa(isa)
                    torch.set_num_threads(1 + (i + rows) % 2)
                    got = compress.quantize_rows(x, bits, rounding, seed, offset, "ext-cpu")
                    why = (isa, torch.get_num_threads(), rows, width, seed, offset)
                    _assert_same(got, want, *why)
                    out = compress.dequantize_rows(*got, bits, width, backend="ext-cpu")
                    _assert_same((out,), (back,), *why)


@pytest.mark.parametrize("bits", BITS)
def test_ext_rows_split_across_threads(bits: int, isas: list[str], threads: None) -> None:
    """Enough elements that two threads really split the rows (width 129: blocks of 8 rows)."""
    ext = ext_or_skip()
    x = varied_rows(4201, 129, seed=bits)
    for rounding in ROUNDINGS:
        want = ref.quantize_rows(x, bits, rounding, 9, 2**32 - 300_001)
        back = ref.dequantize_rows(*want, bits, 129)
        for isa in isas:
            ext.set_isa(isa)
            for nt in (1, 2):
                torch.set_num_threads(nt)
                got = ext.quantize_rows(x, bits, rounding == "stochastic", 9, 2**32 - 300_001)
                _assert_same(got, want, isa, nt, rounding)
                _assert_same((ext.dequantize_rows(*got, bits, 129),), (back,), isa, nt, rounding)


def test_ext_edge_rows_match_reference(isas: list[str]) -> None:
    ext = ext_or_skip()
    x = torch.zeros(8, 19)
    x[1] = 3.0  # constant, bfloat16-exact
    x[2] = -0.1  # constant, not bfloat16-exact
    x[3, ::2] = -0.0  # signed zeros only
    x[4] = torch.linspace(1e-39, 4e-39, 19)  # subnormal: fl32(B / range) overflows to inf
    x[5] = torch.linspace(-3.0, 3.0, 19) * 1e38  # max - zero overflows to inf
    x[6] = torch.linspace(-5.0, 7.0, 19)  # levels hit exactly: ties
    x[7] = 1e30
    noncontig = torch.randn(19, 8).t()  # a transposed view from autograd
    for isa in isas:
        ext.set_isa(isa)
        for bits in BITS:
            for rounding in ROUNDINGS:
                want = ref.quantize_rows(x, bits, rounding, 3)
                got = ext.quantize_rows(x, bits, rounding == "stochastic", 3, 0)
                assert torch.equal(got[0], want[0]), (isa, bits, rounding)
                # a zero point of +-0 may take either sign (torch's amin does not define it)
                assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
                a = ext.dequantize_rows(*got, bits, 19)
                b = ref.dequantize_rows(*want, bits, 19)
                # row 5 dequantizes with step = inf (q * inf is NaN): compared as packed above
                assert torch.equal(a[:5], b[:5]) and torch.equal(a[6:], b[6:])
                want = ref.quantize_rows(noncontig, bits, rounding, 3)
                got = ext.quantize_rows(noncontig, bits, rounding == "stochastic", 3, 0)
                _assert_same(got, want, isa, bits, rounding)


def test_ext_empty_inputs(isas: list[str]) -> None:
    ext = ext_or_skip()
    for isa in isas[:1] + isas[-1:]:
        ext.set_isa(isa)
        for rows, width in ((0, 5), (5, 0), (0, 0)):
            for bits in BITS:
                x = torch.empty(rows, width)
                got = ext.quantize_rows(x, bits, True, 0, 0)
                _assert_same(got, ref.quantize_rows(x, bits), rows, width)
                back = ext.dequantize_rows(*got, bits, width)
                _assert_same((back,), (ref.dequantize_rows(*got, bits, width),))
                assert ext.pack_bits(torch.empty(0, dtype=torch.uint8), bits).shape == (0,)
                assert ext.unpack_bits(torch.empty(0, dtype=torch.uint8), bits, 0).shape == (0,)
        assert ext.rademacher(0, 4, 0, 0).shape == (0, 4)


def test_ext_non_finite_rows_dequantize_to_nan_as_the_reference(isas: list[str]) -> None:
    """x should be finite; a NaN or Inf must not crash, and gives NaN rows as the reference."""
    ext = ext_or_skip()
    x = varied_rows(9, 21, seed=5)
    x[1, 4] = float("nan")
    x[2, 0] = float("inf")
    x[3, 20] = -float("inf")
    x[4, :3] = torch.tensor([float("inf"), -float("inf"), float("nan")])
    x[5] = float("nan")
    bad = torch.tensor([i in (1, 2, 3, 4, 5) for i in range(9)])
    for isa in isas:
        ext.set_isa(isa)
        for bits in BITS:
            for rounding in ROUNDINGS:
                want = ref.quantize_rows(x, bits, rounding, 3)
                got = ext.quantize_rows(x, bits, rounding == "stochastic", 3, 0)
                assert torch.equal(got[0], want[0]), (isa, bits, rounding)
                q = ref.unpack_bits(got[0], bits, x.numel()).reshape(9, 21)
                assert not bool(q[bad].any())  # level 0 throughout
                for g, w in zip(got[1:], want[1:], strict=True):
                    # a NaN's sign and payload are torch's choice: compare as values
                    torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
                a = ext.dequantize_rows(*got, bits, 21)
                b = ref.dequantize_rows(*want, bits, 21)
                assert bool(a[bad].isnan().all()) and bool(b[bad].isnan().all())
                assert torch.equal(a[~bad], b[~bad])


def test_ext_argument_errors() -> None:
    ext = ext_or_skip()
    x = torch.randn(4, 3)
    for bits in (0, 3, 16):
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ext.quantize_rows(x, bits, True, 0, 0)
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ext.pack_bits(torch.zeros(3, dtype=torch.uint8), bits)
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ext.unpack_bits(torch.zeros(3, dtype=torch.uint8), bits, 3)
    with pytest.raises(TypeError, match="2-d float32"):
        ext.quantize_rows(x.double(), 4, True, 0, 0)
    with pytest.raises(TypeError, match="2-d float32"):
        ext.quantize_rows(x.reshape(-1), 4, True, 0, 0)
    with pytest.raises(ValueError, match="offset"):
        ext.quantize_rows(x, 4, True, 0, -1)
    packed, zero, rng = ext.quantize_rows(x, 4, True, 0, 0)
    with pytest.raises(TypeError, match="bfloat16"):
        ext.dequantize_rows(packed, zero.float(), rng, 4, 3)
    with pytest.raises(TypeError, match="bfloat16"):
        ext.dequantize_rows(packed, zero, rng[:2], 4, 3)
    with pytest.raises(TypeError, match="1-d uint8"):
        ext.dequantize_rows(packed.to(torch.int32), zero, rng, 4, 3)
    with pytest.raises(ValueError, match="need"):
        ext.dequantize_rows(packed[:-1], zero, rng, 4, 3)
    with pytest.raises(TypeError, match="uint8 or bool"):
        ext.pack_bits(torch.zeros(3, dtype=torch.int32), 2)
    with pytest.raises(TypeError, match="1-d uint8"):
        ext.unpack_bits(torch.zeros(2, 2, dtype=torch.uint8), 2, 3)
    with pytest.raises(ValueError, match="need"):
        ext.unpack_bits(torch.zeros(2, dtype=torch.uint8), 2, 9)
    for d, k in ((-1, 3), (3, 0)):
        with pytest.raises(ValueError, match="d >= 0"):
            ext.rademacher(d, k, 0, 0)
    with pytest.raises(ValueError, match="offset"):
        ext.rademacher(3, 3, 0, -1)
    # the wrapper refuses bad bits / rounding / seeds before any backend runs
    with pytest.raises(ValueError, match="rounding"):
        compress.quantize_rows(x, 4, "up", backend="ext-cpu")
    with pytest.raises(TypeError, match="seed"):
        compress.quantize_rows(x, 4, seed=1.5, backend="ext-cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", BITS)
def test_ext_pack_unpack_match_reference(bits: int, isas: list[str], threads: None) -> None:
    ext = ext_or_skip()
    g = torch.Generator().manual_seed(bits)
    big = 4 * (1 << 20) + 13  # enough 8-value groups for two threads
    for n in (1, 3, 7, 8, 9, 13, 100, 1001, big):
        v = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        want = ref.pack_bits(v, bits)
        values = ref.unpack_bits(want, bits, n)
        for i, isa in enumerate(isas):
            ext.set_isa(isa)
            for nt in (1, 2) if n == big else (1 + i % 2,):
                torch.set_num_threads(nt)
                got = ext.pack_bits(v, bits)
                assert torch.equal(got, want), (isa, nt, n)
                assert torch.equal(ext.unpack_bits(want, bits, n), values), (isa, nt, n)
                # a longer buffer (as a caller may keep) decodes the same prefix
                if n < 100:
                    longer = torch.cat([want, torch.full((5,), 255, dtype=torch.uint8)])
                    assert torch.equal(ext.unpack_bits(longer, bits, n), values)
    mask = torch.rand(5, 7, generator=g) > 0.5
    assert torch.equal(ext.pack_bits(mask, 1), ref.pack_bits(mask, 1))
    assert torch.equal(ext.pack_bits(mask.t(), 1), ref.pack_bits(mask.t(), 1))


def test_ext_rademacher_matches_reference(isas: list[str], threads: None) -> None:
    ext = ext_or_skip()
    shapes = ((1, 1), (3, 5), (17, 4), (256, 32), (1200, 600))
    for seed, offset in STREAMS:
        for d, k in shapes:
            want = projection.rademacher(d, k, seed, offset)
            for i, isa in enumerate(isas):
                ext.set_isa(isa)
                for nt in (1, 2) if d * k > 500_000 else (1 + i % 2,):
                    torch.set_num_threads(nt)
                    got = compress.rademacher(d, k, seed, offset, backend="ext-cpu")
                    assert torch.equal(float_bits(got), float_bits(want)), (isa, nt, d, k, seed)
    assert torch.equal(
        ext.rademacher(3, 5, normalize_seed(-1), 7), projection.rademacher(3, 5, -1, 7)
    )


def test_auto_dispatch_picks_ext_cpu() -> None:
    ext_or_skip()
    x = varied_rows(10, 6, seed=0)
    dispatch.reset()
    try:
        packed, zero, rng = compress.quantize_rows(x, 2, "nearest")
        compress.dequantize_rows(packed, zero, rng, 2, 6)
        mask = x > 0
        assert torch.equal(
            compress.unpack_mask(compress.pack_mask(mask), mask.numel()), mask.reshape(-1)
        )
        compress.rademacher(6, 2, seed=1)
        counts = dispatch.snapshot()
        for prim in ("compress", "decompress", "pack", "unpack", "rademacher"):
            assert counts[prim] == {"ext-cpu": 1}, (prim, counts)
        assert dispatch.fallbacks() == []
        dispatch.reset()
        want = compress.quantize_rows(x, 2, "nearest", backend="reference")
        assert dispatch.snapshot() == {"compress": {"reference": 1}}
        _assert_same((packed, zero, rng), want)
    finally:
        dispatch.reset()


# ------------------------------------------------------------------ masked_scale


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 1000, 300_001])
@pytest.mark.parametrize("scale", [1.0, 1.0 / 0.3, 2.0])
def test_masked_scale_ext_matches_reference(n: int, scale: float, threads: None) -> None:
    ext = ext_or_skip()
    g = torch.Generator().manual_seed(n)
    grad = torch.randn(n, generator=g)
    if n:
        grad[0] = float("nan")  # a kept NaN stays NaN, a dropped one becomes 0
    mask = torch.rand(n, generator=g) > 0.4
    packed = ref.pack_bits(mask, 1)
    want = ref.masked_scale(grad, packed, scale)
    assert torch.equal(want[~mask], torch.zeros(int((~mask).sum())))
    kept = grad[mask] * torch.tensor(scale, dtype=torch.float32)
    assert torch.equal(want[mask].nan_to_num(7.0), kept.nan_to_num(7.0))
    for t in (1, 2):
        torch.set_num_threads(t)
        got = ext.masked_scale(grad, packed, scale)
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


def test_masked_scale_refuses_a_short_mask_and_wrong_types() -> None:
    grad = torch.randn(20)
    with pytest.raises(ValueError, match="need"):
        ref.masked_scale(grad, torch.zeros(2, dtype=torch.uint8), 1.0)
    with pytest.raises(TypeError, match="float32"):
        ref.masked_scale(grad.double(), torch.zeros(3, dtype=torch.uint8), 1.0)
    ext = ext_or_skip()
    with pytest.raises(ValueError, match="need"):
        ext.masked_scale(grad, torch.zeros(2, dtype=torch.uint8), 1.0)
    with pytest.raises(TypeError, match="float32"):
        ext.masked_scale(grad.double(), torch.zeros(3, dtype=torch.uint8), 1.0)


# ------------------------------------------------------------------ fused projection kernels

# (rows, d, k): odd widths, k above d, k not a multiple of any vector width, 1 x 1,
# no rows, no input columns; enough rows for several 4-row tiles and 64-row stages
PROJECTION_SHAPES = (
    (37, 256, 32),
    (5, 17, 3),
    (9, 33, 40),
    (1, 1, 1),
    (70, 64, 8),
    (130, 100, 33),
    (0, 16, 4),
    (6, 0, 5),
)


def _fused_reference(
    x: torch.Tensor, k: int, bits: int, rounding: str, seed: int, offset: int, proj: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    y = projection.project_rows(x, k, seed, proj)
    want = ref.quantize_rows(y, bits, rounding, seed, offset)
    back = projection.unproject_rows(ref.dequantize_rows(*want, bits, k), x.shape[1], seed, proj)
    return want, back


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_ext_fused_projection_matches_reference(
    bits: int, rounding: str, isas: list[str], threads: None
) -> None:
    ext_or_skip()
    for rows, d, k in PROJECTION_SHAPES:
        x = varied_rows(rows, d, seed=rows * 7 + d) if d else torch.empty(rows, 0)
        for seed, offset in STREAMS[:2]:
            proj = offset // 3
            want, back = _fused_reference(x, k, bits, rounding, seed, offset, proj)
            for i, isa in enumerate(isas):
                backends.ext_cpu().set_isa(isa)
                torch.set_num_threads(1 + (i + rows) % 2)
                got = compress.project_quantize_rows(
                    x, k, bits, rounding, seed, offset, proj, backend="ext-cpu"
                )
                why = (isa, torch.get_num_threads(), rows, d, k, seed)
                _assert_same(got, want, *why)
                out = compress.dequantize_unproject_rows(
                    *got, bits, k, d, seed, proj, backend="ext-cpu"
                )
                _assert_same((out,), (back,), *why)


def test_ext_fused_projection_split_across_threads(isas: list[str], threads: None) -> None:
    """Enough rows that two threads split them (k = 17: blocks of 8 rows), zero and constant rows."""
    ext = ext_or_skip()
    x = varied_rows(3001, 129, seed=4)
    for bits in (1, 2):
        want, back = _fused_reference(x, 17, bits, "stochastic", 9, 2**32 - 30_001, 77)
        for isa in isas:
            ext.set_isa(isa)
            for nt in (1, 2):
                torch.set_num_threads(nt)
                got = ext.project_quantize_rows(x, 17, bits, True, 9, 2**32 - 30_001, 77)
                _assert_same(got, want, isa, nt, bits)
                out = ext.dequantize_unproject_rows(*got, bits, 17, 129, 9, 77)
                _assert_same((out,), (back,), isa, nt, bits)


def test_ext_fused_projection_of_zero_constant_and_non_finite_rows(isas: list[str]) -> None:
    ext = ext_or_skip()
    x = torch.zeros(6, 40)
    x[1] = 3.0
    x[2, ::3] = -0.0
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    x[5] = torch.linspace(-2.0, 2.0, 40)
    finite = torch.tensor([True, True, True, False, False, True])
    want, back = _fused_reference(x, 8, 2, "stochastic", 1, 0, 0)
    assert torch.equal(back[0], torch.zeros(40))  # a zero row projects and comes back as zeros
    for isa in isas:
        ext.set_isa(isa)
        got = ext.project_quantize_rows(x, 8, 2, True, 1, 0, 0)
        assert torch.equal(got[0], want[0]), isa
        for g, w in zip(got[1:], want[1:], strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        out = ext.dequantize_unproject_rows(*got, 2, 8, 40, 1, 0)
        assert torch.equal(out[finite], back[finite]), isa
        assert bool(out[~finite].isnan().all()) and bool(back[~finite].isnan().all())


def test_ext_fused_projection_argument_errors() -> None:
    ext = ext_or_skip()
    x = torch.randn(4, 6)
    with pytest.raises(ValueError, match="k >= 1"):
        ext.project_quantize_rows(x, 0, 2, True, 0, 0, 0)
    with pytest.raises(ValueError, match="bits must be one of"):
        ext.project_quantize_rows(x, 2, 3, True, 0, 0, 0)
    with pytest.raises(TypeError, match="float32"):
        ext.project_quantize_rows(x.double(), 2, 2, True, 0, 0, 0)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        ext.project_quantize_rows(x, 2, 2, True, 0, 0, -1)
    packed, zero, rng = ext.project_quantize_rows(x, 3, 2, True, 0, 0, 0)
    with pytest.raises(ValueError, match="need"):
        ext.dequantize_unproject_rows(packed[:1], zero, rng, 2, 3, 6, 0, 0)
    with pytest.raises(ValueError, match="k >= 1"):
        ext.dequantize_unproject_rows(packed, zero, rng, 2, 0, 6, 0, 0)
    with pytest.raises(ValueError, match="d >= 0"):
        ext.dequantize_unproject_rows(packed, zero, rng, 2, 3, -1, 0, 0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        compress.project_quantize_rows(x, 0, 2)
    with pytest.raises(ValueError, match="rounding must be one of"):
        compress.project_quantize_rows(x, 2, 2, "up")


def test_fused_projection_dispatch_is_counted() -> None:
    ext_or_skip()
    x = varied_rows(12, 16, seed=3)
    dispatch.reset()
    try:
        got = compress.project_quantize_rows(x, 4, 2, "nearest", 1, 0, 9)
        compress.dequantize_unproject_rows(*got, 2, 4, 16, 1, 9)
        assert dispatch.snapshot() == {
            "project+compress": {"ext-cpu": 1},
            "decompress+unproject": {"ext-cpu": 1},
        }
        dispatch.reset()
        want = compress.project_quantize_rows(x, 4, 2, "nearest", 1, 0, 9, backend="reference")
        assert dispatch.snapshot() == {"project+compress": {"reference": 1}}
        _assert_same(got, want)
    finally:
        dispatch.reset()


# ------------------------------------------------------------------ message segments


def _segment_reference(
    x: torch.Tensor, index: torch.Tensor | None, bits: int, seed: int, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment bytes, dequantized rows) of x[index] by the reference row kernels."""
    rows = x if index is None else x[index]
    packed, zero, rng = ref.quantize_rows(rows, bits, "stochastic", seed, offset)
    segment = torch.cat([packed, zero.view(torch.uint8), rng.view(torch.uint8)])
    if rows.shape[0] == 0:
        segment = segment[:0]
    return segment, ref.dequantize_rows(packed, zero, rng, bits, x.shape[1])


@pytest.mark.parametrize("bits", BITS)
def test_ext_segments_match_reference(bits: int, isas: list[str], threads: None) -> None:
    """Gathered, quantized and laid out in one pass == gather, quantize_rows, concatenate;
    decoded into (or added onto) indexed rows == dequantize_rows, then scatter."""
    ext = ext_or_skip()
    g = torch.Generator().manual_seed(bits)
    for width in (1, 5, 17, 129, 256):
        x = varied_rows(300, width, seed=width + bits)
        for index in (
            None,
            torch.randperm(300, generator=g)[:97],
            torch.tensor([4, 4, 0]),
            torch.empty(0, dtype=torch.int64),
        ):
            for seed, offset in STREAMS:
                want, back = _segment_reference(x, index, bits, seed, offset)
                rows = back.shape[0]
                where = torch.randperm(rows + 11, generator=g)[:rows]
                base = torch.randn(rows + 11, width, generator=g)
                for i, isa in enumerate(isas):
                    ext.set_isa(isa)
                    torch.set_num_threads(1 + i % 2)
                    why = (isa, width, None if index is None else index.numel(), seed, offset)
                    out = torch.full((ref.segment_bytes(rows, width, bits),), 7, dtype=torch.uint8)
                    compress.quantize_rows_into(
                        x, index, bits, seed, offset, out, backend="ext-cpu"
                    )
                    assert torch.equal(out, want), why
                    ref_out = torch.empty_like(out)
                    compress.quantize_rows_into(
                        x, index, bits, seed, offset, ref_out, backend="reference"
                    )
                    assert torch.equal(ref_out, want), why
                    for add in (False, True):
                        for backend in ("ext-cpu", "reference"):
                            got = base.clone()
                            compress.dequantize_rows_into(out, rows, bits, got, where, add, backend)
                            expect = base.clone()
                            expect[where] = base[where] + back if add else back
                            assert torch.equal(float_bits(got), float_bits(expect)), (
                                *why,
                                add,
                                backend,
                            )
                    in_order = torch.empty(rows, width)
                    compress.dequantize_rows_into(out, rows, bits, in_order, backend="ext-cpu")
                    assert torch.equal(float_bits(in_order), float_bits(back)), why


def test_ext_segments_split_across_threads_and_at_odd_bytes(threads: None) -> None:
    """Enough rows for two threads; a segment whose zero points start at an odd byte."""
    ext = ext_or_skip()
    x = varied_rows(5000, 129, seed=5)
    index = torch.randperm(5000)[:4321]
    for bits in BITS:
        want, back = _segment_reference(x, index, bits, 3, 2**32 - 77)
        for nt in (1, 2):
            torch.set_num_threads(nt)
            out = torch.empty(want.numel() + 1, dtype=torch.uint8)[1:]  # an odd address
            ext.quantize_rows_into(x, index, bits, True, 3, 2**32 - 77, out)
            assert torch.equal(out, want), (bits, nt)
            into = torch.zeros(4321, 129)
            ext.dequantize_rows_into(out, 4321, bits, into, None, True)
            assert torch.equal(float_bits(into), float_bits(back + 0.0)), (bits, nt)


def test_ext_segment_argument_errors() -> None:
    ext = ext_or_skip()
    x = torch.randn(6, 5)
    out = torch.empty(ref.segment_bytes(3, 5, 4), dtype=torch.uint8)
    with pytest.raises(IndexError, match=r"index\[1\] = 6 is outside \[0, 6\)"):
        ext.quantize_rows_into(x, torch.tensor([0, 6, 1]), 4, True, 0, 0, out)
    with pytest.raises(ValueError, match="the segment has 20 bytes, its rows need 33"):
        ext.quantize_rows_into(x, torch.tensor([0, 1, 2, 3, 4]), 4, True, 0, 0, out[:20].clone())
    with pytest.raises(TypeError, match="index must be a 1-d int64 tensor"):
        ext.quantize_rows_into(x, torch.tensor([0.0]), 4, True, 0, 0, out)
    ext.quantize_rows_into(x, torch.tensor([0, 1, 2]), 4, True, 0, 0, out)
    into = torch.zeros(4, 5)
    with pytest.raises(ValueError, match="index names row 1 twice"):
        ext.dequantize_rows_into(out, 3, 4, into, torch.tensor([1, 0, 1]), False)
    with pytest.raises(ValueError, match="index names a row twice"):
        ref.dequantize_rows_into(out, 3, 4, into, torch.tensor([1, 0, 1]), False)
    with pytest.raises(ValueError, match="without an index the segment's 3 rows must fill out's 4"):
        ext.dequantize_rows_into(out, 3, 4, into, None, False)
    with pytest.raises(ValueError, match="out must be a contiguous CPU tensor"):
        ext.dequantize_rows_into(out, 3, 4, torch.zeros(5, 3).t(), torch.tensor([0, 1, 2]), False)
    with pytest.raises(ValueError, match="bits"):
        ext.quantize_rows_into(x, None, 3, True, 0, 0, out)


def test_segments_of_rows_without_values() -> None:
    """Width 0: each row still carries its (zero) zero point and range, as the reference."""
    ext_or_skip()
    x = torch.empty(5, 0)
    for backend in ("ext-cpu", "reference"):
        out = torch.full((ref.segment_bytes(3, 0, 2),), 9, dtype=torch.uint8)
        compress.quantize_rows_into(x, torch.tensor([4, 0, 2]), 2, 0, 0, out, backend=backend)
        assert torch.equal(out, torch.zeros(12, dtype=torch.uint8)), backend
        into = torch.empty(3, 0)
        compress.dequantize_rows_into(out, 3, 2, into, backend=backend)
