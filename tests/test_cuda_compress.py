"""ext-cuda activation compression (exact) and message quantization (adaqp) == the reference.

Every CUDA op of ``qtrain._ext_cuda`` (``ext/compress_cuda.cu``) is compared with
the pure-PyTorch reference run on CPU copies of the same inputs, bit for bit:
packed bytes, the bfloat16 zero points and ranges, dequantized floats, the
Rademacher matrix and the fused projection kernels. Shapes cover widths that are
not multiples of the pack factor (rows share bytes), wide rows (one block per
row), tiles of many rows, misaligned inputs (the scalar paths), counters that
cross 2^32 and the fallback for k > 1024. Skips where no GPU or no build exists.
"""

from __future__ import annotations

import pytest
import torch
from conftest import float_bits, varied_rows

from qtrain import backends
from qtrain.ops import compress, dispatch
from qtrain.quant import projection
from qtrain.quant import rowwise as ref
from qtrain.quant.rng import normalize_seed

if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
if not backends.available("ext-cuda"):
    pytest.skip(
        f"qtrain._ext_cuda not available: {backends.error('ext-cuda')}", allow_module_level=True
    )

CUDA = torch.device("cuda")
BITS = (1, 2, 4, 8)
ROUNDINGS = ("nearest", "stochastic")
# not multiples of any pack factor, then byte-aligned ones, then rows wider than 1024
# (one block reduces a row) with an odd width (tiles of 8 rows)
WIDTHS = (1, 3, 5, 17, 33, 127, 129, 256, 1500, 4099)
# (seed, offset): offsets next to 2^32 make the counter's high word change inside a row
STREAMS = ((0, 0), (-1, 2**32 - 50), (2**64 - 7, 12345), (5, 2**32 - 3))


def ext():
    return backends.ext_cuda()


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """A contiguous CUDA copy of x whose data starts 4 bytes past an aligned address."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=CUDA)
    flat[1:] = x.reshape(-1).to(CUDA)
    out = flat[1:].view(x.shape)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


def _same_bits(got: torch.Tensor, want: torch.Tensor, *why: object) -> None:
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape, *why)
    if got.dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(float_bits(got), float_bits(want)), why
    else:
        assert torch.equal(got, want), why


def _same_quantized(got: tuple, want: tuple, *why: object) -> None:
    """Packed bytes and ranges bit for bit; a zero point of +-0 may take either sign
    (torch's amin does not define which zero it returns)."""
    _same_bits(got[0], want[0], "packed", *why)
    _same_bits(got[2], want[2], "range", *why)
    z, w = got[1].cpu(), want[1]
    assert z.dtype == w.dtype and z.shape == w.shape, why
    both_zero = (z == 0) & (w == 0)
    assert torch.equal(float_bits(z)[~both_zero], float_bits(w)[~both_zero]), ("zero", *why)


def _check_rows(x: torch.Tensor, bits: int, rounding: str, seed: int, offset: int, *why) -> None:
    """quantize_rows / dequantize_rows of CUDA x == the reference on its CPU copy."""
    xc = x.cpu()
    width = x.shape[1]
    want = ref.quantize_rows(xc, bits, rounding, seed, offset)
    got = compress.quantize_rows(x, bits, rounding, seed, offset, backend="ext-cuda")
    assert all(t.device.type == "cuda" for t in got)
    _same_quantized(got, want, bits, rounding, seed, offset, *why)
    back = compress.dequantize_rows(*got, bits, width, backend="ext-cuda")
    _same_bits(back, ref.dequantize_rows(*want, bits, width), "dequantized", bits, *why)


# ------------------------------------------------------------------ quantize / dequantize


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize_rows_matches_reference(bits: int, rounding: str) -> None:
    for width in WIDTHS:
        for rows in (0, 1, 37) if width < 1000 else (1, 9):
            x = varied_rows(rows, width, seed=width * 100 + rows).to(CUDA)
            for seed, offset in STREAMS:
                _check_rows(x, bits, rounding, normalize_seed(seed), offset, rows, width)


@pytest.mark.parametrize("bits", BITS)
def test_quantize_rows_many_tiles(bits: int) -> None:
    """Enough rows for many blocks and tiles (narrow rows: up to 1024 rows per tile)."""
    for rows, width in ((5000, 129), (3000, 1), (2600, 3), (700, 20), (40, 1025)):
        x = varied_rows(rows, width, seed=rows + width + bits).to(CUDA)
        for rounding in ROUNDINGS:
            _check_rows(x, bits, rounding, 9, 2**32 - 300_001, rows, width)


@pytest.mark.parametrize("bits", BITS)
def test_quantize_rows_misaligned_and_strided_inputs(bits: int) -> None:
    """Inputs that are not 16-byte aligned (scalar loads) or not contiguous."""
    for rows, width in ((37, 128), (9, 4096), (33, 17)):
        x = varied_rows(rows, width, seed=width)
        for rounding in ROUNDINGS:
            _check_rows(_misaligned(x), bits, rounding, 3, 7, "misaligned", rows, width)
            _check_rows(x.t().contiguous().to(CUDA).t(), bits, rounding, 3, 7, "transposed")
    # a packed stream that starts at an odd address (the dequantizer's byte loads)
    x = varied_rows(21, 19, seed=1)
    want = ref.quantize_rows(x, bits, "stochastic", 2, 0)
    buf = torch.cat([torch.zeros(1, dtype=torch.uint8), want[0]]).to(CUDA)[1:]
    got = ext().dequantize_rows(buf, want[1].to(CUDA), want[2].to(CUDA), bits, 19)
    _same_bits(got, ref.dequantize_rows(*want, bits, 19))


def test_edge_rows_match_reference() -> None:
    x = torch.zeros(8, 19)
    x[1] = 3.0  # constant, bfloat16-exact
    x[2] = -0.1  # constant, not bfloat16-exact
    x[3, ::2] = -0.0  # signed zeros only
    x[4] = torch.linspace(1e-39, 4e-39, 19)  # subnormal: fl32(B / range) overflows to inf
    x[5] = torch.linspace(-3.0, 3.0, 19) * 1e38  # max - zero overflows to inf
    x[6] = torch.linspace(-5.0, 7.0, 19)  # levels hit exactly: ties
    x[7] = 1e30
    xg = x.to(CUDA)
    for bits in BITS:
        for rounding in ROUNDINGS:
            want = ref.quantize_rows(x, bits, rounding, 3)
            got = ext().quantize_rows(xg, bits, rounding == "stochastic", 3, 0)
            _same_quantized(got, want, bits, rounding)
            a = ext().dequantize_rows(*got, bits, 19).cpu()
            b = ref.dequantize_rows(*want, bits, 19)
            # row 5 dequantizes with step = inf (q * inf is NaN): compared as packed above
            assert torch.equal(float_bits(a[:5]), float_bits(b[:5])), (bits, rounding)
            assert torch.equal(float_bits(a[6:]), float_bits(b[6:])), (bits, rounding)


def test_non_finite_rows_dequantize_to_nan_as_the_reference() -> None:
    x = varied_rows(9, 21, seed=5)
    x[1, 4] = float("nan")
    x[2, 0] = float("inf")
    x[3, 20] = -float("inf")
    x[4, :3] = torch.tensor([float("inf"), -float("inf"), float("nan")])
    x[5] = float("nan")
    x[6] = float("inf")  # inf - inf: a NaN range
    bad = torch.tensor([i in (1, 2, 3, 4, 5, 6) for i in range(9)])
    for bits in BITS:
        for rounding in ROUNDINGS:
            want = ref.quantize_rows(x, bits, rounding, 3)
            got = ext().quantize_rows(x.to(CUDA), bits, rounding == "stochastic", 3, 0)
            _same_bits(got[0], want[0], bits, rounding)
            q = ref.unpack_bits(got[0].cpu(), bits, x.numel()).reshape(9, 21)
            assert not bool(q[bad].any())  # level 0 throughout
            for g, w in zip(got[1:], want[1:], strict=True):
                # a NaN's sign and payload are the hardware's choice: compare as values
                torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)
            a = ext().dequantize_rows(*got, bits, 21).cpu()
            b = ref.dequantize_rows(*want, bits, 21)
            assert bool(a[bad].isnan().all()) and bool(b[bad].isnan().all())
            assert torch.equal(float_bits(a[~bad]), float_bits(b[~bad]))


def test_empty_inputs() -> None:
    for rows, width in ((0, 5), (5, 0), (0, 0)):
        for bits in BITS:
            x = torch.empty(rows, width)
            got = ext().quantize_rows(x.to(CUDA), bits, True, 0, 0)
            want = ref.quantize_rows(x, bits)
            for g, w in zip(got, want, strict=True):
                assert g.device.type == "cuda"
                _same_bits(g, w, rows, width, bits)
            back = ext().dequantize_rows(*got, bits, width)
            assert back.shape == (rows, width) and back.dtype == torch.float32
            assert back.device.type == "cuda"
            empty = torch.empty(0, dtype=torch.uint8, device=CUDA)
            assert ext().pack_bits(empty, bits).shape == (0,)
            assert ext().unpack_bits(empty, bits, 0).shape == (0,)
    assert ext().rademacher(0, 4, 0, 0).shape == (0, 4)
    assert ext().masked_scale(
        torch.empty(0, device=CUDA), torch.empty(0, dtype=torch.uint8, device=CUDA), 2.0
    ).shape == (0,)


def test_argument_errors() -> None:
    x = torch.randn(4, 3, device=CUDA)
    for bits in (0, 3, 16):
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ext().quantize_rows(x, bits, True, 0, 0)
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ext().pack_bits(torch.zeros(3, dtype=torch.uint8, device=CUDA), bits)
        with pytest.raises(ValueError, match="1, 2, 4, 8"):
            ext().unpack_bits(torch.zeros(3, dtype=torch.uint8, device=CUDA), bits, 3)
    with pytest.raises(TypeError, match="2-d float32"):
        ext().quantize_rows(x.double(), 4, True, 0, 0)
    with pytest.raises(TypeError, match="2-d float32"):
        ext().quantize_rows(x.reshape(-1), 4, True, 0, 0)
    with pytest.raises(ValueError, match="CUDA tensor"):
        ext().quantize_rows(x.cpu(), 4, True, 0, 0)
    with pytest.raises(ValueError, match="offset"):
        ext().quantize_rows(x, 4, True, 0, -1)
    packed, zero, rng = ext().quantize_rows(x, 4, True, 0, 0)
    with pytest.raises(TypeError, match="bfloat16"):
        ext().dequantize_rows(packed, zero.float(), rng, 4, 3)
    with pytest.raises(TypeError, match="bfloat16"):
        ext().dequantize_rows(packed, zero, rng[:2], 4, 3)
    with pytest.raises(TypeError, match="1-d uint8"):
        ext().dequantize_rows(packed.to(torch.int32), zero, rng, 4, 3)
    with pytest.raises(ValueError, match="need"):
        ext().dequantize_rows(packed[:-1], zero, rng, 4, 3)
    with pytest.raises(ValueError, match="CUDA tensor"):
        ext().dequantize_rows(packed.cpu(), zero, rng, 4, 3)
    with pytest.raises(TypeError, match="uint8 or bool"):
        ext().pack_bits(torch.zeros(3, dtype=torch.int32, device=CUDA), 2)
    with pytest.raises(TypeError, match="1-d uint8"):
        ext().unpack_bits(torch.zeros(2, 2, dtype=torch.uint8, device=CUDA), 2, 3)
    with pytest.raises(ValueError, match="need"):
        ext().unpack_bits(torch.zeros(2, dtype=torch.uint8, device=CUDA), 2, 9)
    for d, k in ((-1, 3), (3, 0)):
        with pytest.raises(ValueError, match="d >= 0"):
            ext().rademacher(d, k, 0, 0)
    with pytest.raises(ValueError, match="offset"):
        ext().rademacher(3, 3, 0, -1)
    with pytest.raises(ValueError, match="k >= 1"):
        ext().project_quantize_rows(x, 0, 2, True, 0, 0, 0)
    with pytest.raises(ValueError, match="need"):
        ext().masked_scale(
            torch.randn(20, device=CUDA), torch.zeros(2, dtype=torch.uint8, device=CUDA), 1.0
        )
    with pytest.raises(TypeError, match="float32"):
        ext().masked_scale(
            torch.randn(20, device=CUDA).double(),
            torch.zeros(3, dtype=torch.uint8, device=CUDA),
            1.0,
        )


# ------------------------------------------------------------------ packing, masks, Rademacher


@pytest.mark.parametrize("bits", BITS)
def test_pack_unpack_bit_exact(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    big = 4 * (1 << 20) + 13
    for n in (1, 3, 7, 8, 9, 13, 31, 32, 33, 63, 100, 1001, big):
        v = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        want = ref.pack_bits(v, bits)
        values = ref.unpack_bits(want, bits, n)
        _same_bits(ext().pack_bits(v.to(CUDA), bits), want, n)
        _same_bits(ext().unpack_bits(want.to(CUDA), bits, n), values, n)
        # a longer buffer (as a caller may keep) decodes the same prefix
        longer = torch.cat([want, torch.full((5,), 255, dtype=torch.uint8)]).to(CUDA)
        _same_bits(ext().unpack_bits(longer, bits, n), values, n, "longer")
        if n < 5000:  # misaligned inputs: the scalar paths
            vm = torch.cat([torch.zeros(1, dtype=torch.uint8), v]).to(CUDA)[1:]
            _same_bits(ext().pack_bits(vm, bits), want, n, "misaligned")
            wm = torch.cat([torch.zeros(1, dtype=torch.uint8), want]).to(CUDA)[1:]
            _same_bits(ext().unpack_bits(wm, bits, n), values, n, "misaligned")
    mask = torch.rand(5, 7, generator=g) > 0.5
    _same_bits(ext().pack_bits(mask.to(CUDA), 1), ref.pack_bits(mask, 1))
    _same_bits(ext().pack_bits(mask.to(CUDA).t(), 1), ref.pack_bits(mask.t(), 1))
    big_mask = torch.rand(1000, 333, generator=g) > 0.3
    got = compress.pack_mask(big_mask.to(CUDA), backend="ext-cuda")
    _same_bits(got, ref.pack_bits(big_mask, 1))
    back = compress.unpack_mask(got, big_mask.numel(), backend="ext-cuda")
    assert back.dtype == torch.bool and torch.equal(back.cpu(), big_mask.reshape(-1))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 63, 1000, 300_001])
@pytest.mark.parametrize("scale", [1.0, 1.0 / 0.3, 2.0])
def test_masked_scale_matches_reference(n: int, scale: float) -> None:
    g = torch.Generator().manual_seed(n)
    grad = torch.randn(n, generator=g)
    grad[0] = float("nan")  # a kept NaN stays NaN, a dropped one becomes +0
    mask = torch.rand(n, generator=g) > 0.4
    packed = ref.pack_bits(mask, 1)
    want = ref.masked_scale(grad, packed, scale)
    for gr in (grad.to(CUDA), _misaligned(grad)):
        got = compress.masked_scale(gr, packed.to(CUDA), scale, backend="ext-cuda").cpu()
        assert torch.equal(float_bits(got.nan_to_num(7.0)), float_bits(want.nan_to_num(7.0)))
    # any shape, taken flat
    if n == 1000:
        got = ext().masked_scale(grad.reshape(40, 25).to(CUDA), packed.to(CUDA), scale)
        assert got.shape == (40, 25)
        assert torch.equal(got.cpu().reshape(-1).nan_to_num(7.0), want.nan_to_num(7.0))


def test_rademacher_matches_reference() -> None:
    for seed, offset in STREAMS:
        for d, k in ((1, 1), (3, 5), (17, 4), (256, 32), (1200, 600)):
            want = projection.rademacher(d, k, seed, offset)
            got = compress.rademacher(d, k, seed, offset, backend="ext-cuda", device=CUDA)
            assert got.device.type == "cuda"
            _same_bits(got, want, d, k, seed, offset)
    _same_bits(ext().rademacher(3, 5, normalize_seed(-1), 7), projection.rademacher(3, 5, -1, 7))


# ------------------------------------------------------------------ fused projection kernels

# (rows, d, k): odd widths, k above d, 1 x 1, no rows, no input columns; several tiles;
# items beyond one block (k = 200, 300: several batches); d beyond one x stage
# (d = 3000, 2000: several chunks); k > 1024 (the unfused fallback)
PROJECTION_SHAPES = (
    (37, 256, 32),
    (5, 17, 3),
    (9, 33, 40),
    (1, 1, 1),
    (70, 64, 8),
    (130, 100, 33),
    (0, 16, 4),
    (6, 0, 5),
    (300, 128, 16),
    (20, 40, 200),
    (11, 2000, 300),
    (70, 3000, 8),
    (3, 40, 1100),
)


def _fused_reference(x, k, bits, rounding, seed, offset, proj):
    y = projection.project_rows(x, k, seed, proj)
    want = ref.quantize_rows(y, bits, rounding, seed, offset)
    back = projection.unproject_rows(ref.dequantize_rows(*want, bits, k), x.shape[1], seed, proj)
    return want, back


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_fused_projection_matches_reference(bits: int, rounding: str) -> None:
    for rows, d, k in PROJECTION_SHAPES:
        x = varied_rows(rows, d, seed=rows * 7 + d) if d else torch.empty(rows, 0)
        for seed, offset in STREAMS[:2]:
            seed = normalize_seed(seed)
            proj = offset // 3
            want, back = _fused_reference(x, k, bits, rounding, seed, offset, proj)
            inputs = [x.to(CUDA)] + ([_misaligned(x)] if rows * d > 0 else [])
            for xg in inputs:
                why = (rows, d, k, seed, xg.data_ptr() % 16)
                got = compress.project_quantize_rows(
                    xg, k, bits, rounding, seed, offset, proj, backend="ext-cuda"
                )
                _same_quantized(got, want, *why)
                out = compress.dequantize_unproject_rows(
                    *got, bits, k, d, seed, proj, backend="ext-cuda"
                )
                _same_bits(out, back, *why)


def test_fused_projection_of_zero_constant_and_non_finite_rows() -> None:
    x = torch.zeros(6, 40)
    x[1] = 3.0
    x[2, ::3] = -0.0
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    x[5] = torch.linspace(-2.0, 2.0, 40)
    finite = torch.tensor([True, True, True, False, False, True])
    want, back = _fused_reference(x, 8, 2, "stochastic", 1, 0, 0)
    got = ext().project_quantize_rows(x.to(CUDA), 8, 2, True, 1, 0, 0)
    _same_bits(got[0], want[0])
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)
    out = ext().dequantize_unproject_rows(*got, 2, 8, 40, 1, 0).cpu()
    assert torch.equal(float_bits(out[finite]), float_bits(back[finite]))
    assert bool(out[~finite].isnan().all()) and bool(back[~finite].isnan().all())


# ------------------------------------------------------------------ dispatch


def test_auto_dispatch_picks_ext_cuda() -> None:
    x = varied_rows(10, 6, seed=0).to(CUDA)
    dispatch.reset()
    try:
        packed, zero, rng = compress.quantize_rows(x, 2, "nearest")
        compress.dequantize_rows(packed, zero, rng, 2, 6)
        mask = x > 0
        assert torch.equal(
            compress.unpack_mask(compress.pack_mask(mask), mask.numel()), mask.reshape(-1)
        )
        compress.masked_scale(x, compress.pack_mask(mask), 2.0)
        got = compress.project_quantize_rows(x, 3, 2, "stochastic", 1, 0, 9)
        compress.dequantize_unproject_rows(*got, 2, 3, 6, 1, 9)
        compress.rademacher(6, 2, seed=1, device=CUDA)
        counts = dispatch.snapshot()
        for prim in (
            "compress",
            "decompress",
            "rademacher",
            "project+compress",
            "decompress+unproject",
        ):
            assert counts[prim] == {"ext-cuda": 1}, (prim, counts)
        assert counts["pack"] == {"ext-cuda": 2} and counts["unpack"] == {"ext-cuda": 2}, counts
        assert dispatch.fallbacks() == []
        dispatch.reset()
        want = compress.quantize_rows(x.cpu(), 2, "nearest", backend="reference")
        _same_quantized((packed, zero, rng), want)
    finally:
        dispatch.reset()


@pytest.mark.parametrize("bits", BITS)
def test_message_segments_match_reference(bits: int) -> None:
    """quantize_rows_into / dequantize_rows_into on CUDA tensors (the compiled row kernel,
    the gather, layout and scatter in torch) == the reference on CPU copies."""
    g = torch.Generator().manual_seed(bits)
    x = varied_rows(300, 129, seed=bits)
    index = torch.randperm(300, generator=g)[:97]
    where = torch.randperm(120, generator=g)[:97]
    base = torch.randn(120, 129, generator=g)
    want = torch.empty(ref.segment_bytes(97, 129, bits), dtype=torch.uint8)
    ref.quantize_rows_into(x, index, bits, "stochastic", 3, 2**32 - 50, want)
    got = torch.empty_like(want, device=CUDA)
    compress.quantize_rows_into(x.to(CUDA), index.to(CUDA), bits, 3, 2**32 - 50, got)
    _same_bits(got, want, bits)
    for add in (False, True):
        expect = base.clone()
        ref.dequantize_rows_into(want, 97, bits, expect, where, add)
        into = base.to(CUDA)
        compress.dequantize_rows_into(got, 97, bits, into, where.to(CUDA), add)
        _same_bits(into, expect, bits, add)
