"""Activation compression (exact plugin): the reference's properties and the Python fronts.

The reference (``qtrain.quant.rowwise``, ``qtrain.quant.projection``) defines
every float32 operation; the compiled ops ``torch.ops.qtrain.*`` agree with it bit for
bit, which ``tests/ops/test_<op>.py`` checks op by op on every device. Here: the
reference's own properties, and the fronts of ``qtrain.ops.compress`` (the backend
choice and its counting, the arguments they hand to the ops, and that every backend
refuses the same inputs with the same exception).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from conftest import float_bits, varied_rows

from qtrain.ops import backends, compress, dispatch
from qtrain.quant import projection
from qtrain.quant import rowwise as ref

BITS = (1, 2, 4, 8)
ROUNDINGS = ("nearest", "stochastic")
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


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


def test_reference_masked_scale_refuses_a_short_mask_and_wrong_types() -> None:
    grad = torch.randn(20)
    with pytest.raises(ValueError, match="need"):
        ref.masked_scale(grad, torch.zeros(2, dtype=torch.uint8), 1.0)
    with pytest.raises(TypeError, match="float32"):
        ref.masked_scale(grad.double(), torch.zeros(3, dtype=torch.uint8), 1.0)


def test_reference_segments_are_quantize_rows_laid_out() -> None:
    """A segment is quantize_rows's packed values, then its bfloat16 zeros, then its
    ranges; decoding it onto indexed rows is dequantize_rows, then a scatter (or add)."""
    g = torch.Generator().manual_seed(0)
    x = varied_rows(50, 17, seed=1)
    index = torch.randperm(50, generator=g)[:21]
    packed, zero, rng = ref.quantize_rows(x[index], 2, "stochastic", 3, 2**32 - 5)
    out = torch.full((ref.segment_bytes(21, 17, 2),), 7, dtype=torch.uint8)
    ref.quantize_rows_into(x, index, 2, "stochastic", 3, 2**32 - 5, out)
    assert torch.equal(out, torch.cat([packed, zero.view(torch.uint8), rng.view(torch.uint8)]))
    back = ref.dequantize_rows(packed, zero, rng, 2, 17)
    where = torch.randperm(30, generator=g)[:21]
    for add in (False, True):
        base = torch.randn(30, 17, generator=g)
        got = base.clone()
        ref.dequantize_rows_into(out, 21, 2, got, where, add)
        expect = base.clone()
        expect[where] = base[where] + back if add else back
        assert torch.equal(float_bits(got), float_bits(expect))
    twice = torch.cat([where[:20], where[:1]])
    with pytest.raises(ValueError, match="index names a row twice"):
        ref.dequantize_rows_into(out, 21, 2, torch.zeros(30, 17), twice, False)


# ------------------------------------------------------------------ the Python fronts


def _compiled(device: str) -> str:
    """The compiled backend of ``device``; a missing build fails (it never skips)."""
    backend = "ext-cuda" if device == "cuda" else "ext-cpu"
    assert backends.available(backend), backends.error(backend)
    return backend


@pytest.mark.parametrize("device", DEVICES)
def test_auto_dispatch_picks_the_compiled_kernel(device: str) -> None:
    backend = _compiled(device)
    x = varied_rows(10, 6, seed=0).to(device)
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
        compress.rademacher(6, 2, seed=1, device=device)
        counts = dispatch.snapshot()
        for prim in (
            "compress",
            "decompress",
            "rademacher",
            "project+compress",
            "decompress+unproject",
        ):
            assert counts[prim] == {backend: 1}, (prim, counts)
        assert counts["pack"] == {backend: 2} and counts["unpack"] == {backend: 2}, counts
        assert dispatch.fallbacks() == []
        dispatch.reset()
        want = compress.quantize_rows(x.cpu(), 2, "nearest", backend="reference")
        assert dispatch.snapshot() == {"compress": {"reference": 1}}
        assert torch.equal(packed.cpu(), want[0]) and torch.equal(rng.cpu(), want[2])
    finally:
        dispatch.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_fronts_agree_across_backends(device: str) -> None:
    """Every front gives the reference's bits with the compiled backend: the seeds (any
    64-bit value), rounding names, offsets and shapes reach the ops as they should."""
    backend = _compiled(device)
    x = varied_rows(40, 19, seed=2).to(device)
    index = torch.tensor([3, 0, 39, 7, 7], device=device)
    where = torch.tensor([5, 1, 2, 0, 9], device=device)

    def same(a: object, b: object) -> None:
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        _assert_same(tuple(t.cpu() for t in a), tuple(t.cpu() for t in b))

    for seed in (0, -1, 2**64 - 7, 2**40 + 3):
        for rounding in ROUNDINGS:
            args = (x, 4, rounding, seed, 2**32 - 100)
            q = compress.quantize_rows(*args, backend=backend)
            same(q, compress.quantize_rows(*args, backend="reference"))
            for b in (backend, "reference"):
                same(
                    compress.dequantize_rows(*q, 4, 19, backend=b),
                    ref.dequantize_rows(*(t.cpu() for t in q), 4, 19),
                )
            args = (x, 5, 2, rounding, seed, 7, 2**32 - 30)
            p = compress.project_quantize_rows(*args, backend=backend)
            same(p, compress.project_quantize_rows(*args, backend="reference"))
            back = (*p, 2, 5, 19, seed, 2**32 - 30)
            same(
                compress.dequantize_unproject_rows(*back, backend=backend),
                compress.dequantize_unproject_rows(*back, backend="reference"),
            )
            outs = []
            for b in (backend, "reference"):
                out = torch.zeros(ref.segment_bytes(5, 19, 2), dtype=torch.uint8, device=device)
                compress.quantize_rows_into(x, index, 2, seed, 11, out, rounding, backend=b)
                outs.append(out)
            same(outs[0], outs[1])
            for add in (False, True):
                into = [torch.ones(10, 19, device=device) for _ in range(2)]
                compress.dequantize_rows_into(outs[0], 5, 2, into[0], where, add, backend)
                compress.dequantize_rows_into(outs[0], 5, 2, into[1], where, add, "reference")
                same(into[0], into[1])
        same(
            compress.rademacher(7, 3, seed, 2**32 - 10, backend=backend, device=device),
            compress.rademacher(7, 3, seed, 2**32 - 10, backend="reference"),
        )
    mask = x > 0.3
    packed = compress.pack_mask(mask, backend=backend)
    same(packed, compress.pack_mask(mask, backend="reference"))
    for b in (backend, "reference"):
        unpacked = compress.unpack_mask(packed, mask.numel(), backend=b)
        assert unpacked.dtype == torch.bool and torch.equal(unpacked.cpu(), mask.reshape(-1).cpu())
    same(
        compress.masked_scale(x, packed, 1 / 0.3, backend=backend),
        compress.masked_scale(x, packed, 1 / 0.3, backend="reference"),
    )


def _bad_calls(device: str) -> list[tuple[str, type[Exception], str, Callable[[str], object]]]:
    """(name, exception, match, call(backend)): inputs every backend of a front refuses."""
    x = varied_rows(4, 6, seed=3).to(device)
    q = compress.quantize_rows(x, 4, backend="reference")
    p = compress.project_quantize_rows(x, 3, 2, backend="reference")
    u8 = torch.zeros(3, dtype=torch.uint8, device=device)
    seg = torch.zeros(ref.segment_bytes(3, 6, 4), dtype=torch.uint8, device=device)
    into = torch.zeros(4, 6, device=device)
    idx = torch.tensor([0, 1, 2], device=device)
    return [
        (
            "rows bits 3",
            ValueError,
            "1, 2, 4, 8",
            lambda b: compress.quantize_rows(x, 3, backend=b),
        ),
        (
            "rows rounding",
            ValueError,
            "rounding",
            lambda b: compress.quantize_rows(x, 4, "up", backend=b),
        ),
        (
            "rows seed",
            TypeError,
            "seed",
            lambda b: compress.quantize_rows(x, 4, seed=1.5, backend=b),
        ),
        (
            "rows float64",
            TypeError,
            "2-d float32",
            lambda b: compress.quantize_rows(x.double(), 4, backend=b),
        ),
        (
            "rows 1-d",
            TypeError,
            "2-d float32",
            lambda b: compress.quantize_rows(x[0], 4, backend=b),
        ),
        (
            "rows offset",
            ValueError,
            "offset",
            lambda b: compress.quantize_rows(x, 4, offset=-1, backend=b),
        ),
        (
            "dequantize bits 3",
            ValueError,
            "1, 2, 4, 8",
            lambda b: compress.dequantize_rows(*q, 3, 6, b),
        ),
        (
            "dequantize float zero",
            TypeError,
            "bfloat16",
            lambda b: compress.dequantize_rows(q[0], q[1].float(), q[2], 4, 6, b),
        ),
        (
            "dequantize short",
            ValueError,
            "need",
            lambda b: compress.dequantize_rows(q[0][:-1], q[1], q[2], 4, 6, b),
        ),
        (
            "project k 0",
            ValueError,
            "k >= 1",
            lambda b: compress.project_quantize_rows(x, 0, 2, backend=b),
        ),
        (
            "project bits 3",
            ValueError,
            "1, 2, 4, 8",
            lambda b: compress.project_quantize_rows(x, 2, 3, backend=b),
        ),
        (
            "project rounding",
            ValueError,
            "rounding",
            lambda b: compress.project_quantize_rows(x, 2, 2, "up", backend=b),
        ),
        (
            "project float64",
            TypeError,
            "2-d float32",
            lambda b: compress.project_quantize_rows(x.double(), 2, 2, backend=b),
        ),
        (
            "project offset",
            ValueError,
            "offset",
            lambda b: compress.project_quantize_rows(x, 2, 2, projection_offset=-1, backend=b),
        ),
        (
            "unproject k 0",
            ValueError,
            "k >= 1",
            lambda b: compress.dequantize_unproject_rows(*p, 2, 0, 6, backend=b),
        ),
        (
            "unproject d -1",
            ValueError,
            "d >= 0",
            lambda b: compress.dequantize_unproject_rows(*p, 2, 3, -1, backend=b),
        ),
        (
            "unproject bits 3",
            ValueError,
            "1, 2, 4, 8",
            lambda b: compress.dequantize_unproject_rows(*p, 3, 3, 6, backend=b),
        ),
        ("pack int32", TypeError, "uint8 or bool", lambda b: compress.pack_mask(u8.int(), b)),
        ("unpack 2-d", TypeError, "1-d uint8", lambda b: compress.unpack_mask(u8[None], 3, b)),
        ("unpack short", ValueError, "need", lambda b: compress.unpack_mask(u8, 25, b)),
        (
            "masked float64",
            TypeError,
            "float32",
            lambda b: compress.masked_scale(x.double(), u8, 1.0, b),
        ),
        ("masked short", ValueError, "need", lambda b: compress.masked_scale(x, u8[:2], 1.0, b)),
        (
            "rademacher d -1",
            ValueError,
            "d >= 0",
            lambda b: compress.rademacher(-1, 3, backend=b, device=device),
        ),
        (
            "rademacher k 0",
            ValueError,
            "k >= 1",
            lambda b: compress.rademacher(3, 0, backend=b, device=device),
        ),
        (
            "rademacher offset",
            ValueError,
            "offset",
            lambda b: compress.rademacher(3, 3, 0, -1, backend=b, device=device),
        ),
        (
            "into bits 3",
            ValueError,
            "1, 2, 4, 8",
            lambda b: compress.quantize_rows_into(x, idx, 3, 0, 0, seg, backend=b),
        ),
        (
            "into float64",
            TypeError,
            "2-d float32",
            lambda b: compress.quantize_rows_into(x.double(), idx, 4, 0, 0, seg, backend=b),
        ),
        (
            "into short segment",
            ValueError,
            "",
            lambda b: compress.quantize_rows_into(x, idx, 4, 0, 0, seg[:-1], backend=b),
        ),
        (
            "into index outside",
            IndexError,
            "",
            lambda b: compress.quantize_rows_into(x, idx + 2, 4, 0, 0, seg, backend=b),
        ),
        (
            "from bits 3",
            ValueError,
            "1, 2, 4, 8",
            lambda b: compress.dequantize_rows_into(seg, 3, 3, into, idx, backend=b),
        ),
        (
            "from short segment",
            ValueError,
            "segment has",
            lambda b: compress.dequantize_rows_into(seg[:-1], 3, 4, into, idx, backend=b),
        ),
        (
            "from row twice",
            ValueError,
            "twice",
            lambda b: compress.dequantize_rows_into(seg, 3, 4, into, idx * 0, backend=b),
        ),
        (
            "from index outside",
            IndexError,
            "",
            lambda b: compress.dequantize_rows_into(seg, 3, 4, into, idx + 2, backend=b),
        ),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_every_backend_refuses_the_same_inputs(device: str) -> None:
    """The compiled ops' C++ fronts and the references refuse the same inputs with the
    same Python exception (the fronts no longer check what the ops check)."""
    backend = _compiled(device)
    wrong = []
    for name, error, match, call in _bad_calls(device):
        for b in (backend, "reference"):
            try:
                call(b)
            except Exception as exc:
                if type(exc) is not error or match not in str(exc):
                    wrong.append(f"{name} [{b}]: {type(exc).__name__}: {exc}")
            else:
                wrong.append(f"{name} [{b}]: returned")
    assert not wrong, "\n".join(wrong)


def test_fused_projection_dispatch_is_counted() -> None:
    _compiled("cpu")
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


def test_segments_of_rows_without_values() -> None:
    """Width 0: each row still carries its (zero) zero point and range, as the reference."""
    _compiled("cpu")
    x = torch.empty(5, 0)
    for backend in ("ext-cpu", "reference"):
        out = torch.full((ref.segment_bytes(3, 0, 2),), 9, dtype=torch.uint8)
        compress.quantize_rows_into(x, torch.tensor([4, 0, 2]), 2, 0, 0, out, backend=backend)
        assert torch.equal(out, torch.zeros(12, dtype=torch.uint8)), backend
        into = torch.empty(3, 0)
        compress.dequantize_rows_into(out, 3, 2, into, backend=backend)
