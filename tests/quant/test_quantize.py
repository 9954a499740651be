"""Symmetric quantization and the counter RNG: properties of the references (the compiled
kernels are compared with them in tests/ops/test_quantize_symmetric.py and
tests/ops/test_fill_counter_uniform.py)."""

from __future__ import annotations

import math

import pytest
import torch

from qtrain.quant import (
    counter_uniform,
    dequantize,
    error_x,
    qmax_for,
    quantize_symmetric,
)
from qtrain.quant.rng import counter_bits, hash32, hash32_int

ROUNDINGS = ("nearest", "stochastic")


# ------------------------------------------------------------------ reference


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_reference_range_and_error_bound(bits: int, rounding: str) -> None:
    x = torch.randn(4097, generator=torch.Generator().manual_seed(bits))
    q, scale = quantize_symmetric(x, bits, rounding, seed=1)
    qmax = qmax_for(bits)
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert scale.dtype == torch.float32 and scale.dim() == 0
    assert int(q.abs().max()) == qmax  # the absmax element maps to +-qmax
    assert math.isclose(float(scale), float(x.abs().max()) / qmax, rel_tol=1e-6)
    err = (dequantize(q, scale) - x).abs().max().item()
    # nearest: half a step; stochastic: less than one step (plus float32 slack)
    bound = (0.5 if rounding == "nearest" else 1.0) * float(scale) * (1 + 1e-5) + 1e-6
    assert err <= bound


@pytest.mark.parametrize("bits", [1, 9, 0, -3, 2.5, True, "8", None])
def test_reference_bad_bits_raise(bits: object) -> None:
    with pytest.raises(ValueError, match=r"2\.\.8"):
        quantize_symmetric(torch.ones(3), bits)  # type: ignore[arg-type]


def test_reference_bad_rounding_and_dtype() -> None:
    with pytest.raises(ValueError, match="nearest"):
        quantize_symmetric(torch.ones(3), 8, "up")
    with pytest.raises(TypeError, match="floating"):
        quantize_symmetric(torch.ones(3, dtype=torch.int32), 8)
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_symmetric(torch.tensor([1.0, float("inf")]), 8)
    with pytest.raises(ValueError, match="offset"):
        quantize_symmetric(torch.ones(3), 8, "stochastic", offset=-1)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_reference_zero_empty_constant(rounding: str) -> None:
    q, s = quantize_symmetric(torch.zeros(5, 3), 4, rounding)
    assert torch.equal(q, torch.zeros(5, 3, dtype=torch.int8)) and float(s) == 0.0
    assert torch.equal(dequantize(q, s), torch.zeros(5, 3))
    q, s = quantize_symmetric(torch.empty(0, 7), 8, rounding)
    assert q.shape == (0, 7) and q.dtype == torch.int8 and float(s) == 0.0
    q, s = quantize_symmetric(torch.full((10,), -2.5), 8, rounding)
    assert torch.equal(q, torch.full((10,), -127, dtype=torch.int8))
    assert math.isclose(float(s), 2.5 / 127, rel_tol=1e-7)


def test_reference_nearest_ties_to_even_and_other_dtypes() -> None:
    # qmax = 7 for 4 bits; x * inv = [7, 0.5, 1.5, 2.5, -0.5] exactly
    x = torch.tensor([7.0, 0.5, 1.5, 2.5, -0.5])
    q, _ = quantize_symmetric(x, 4)
    assert q.tolist() == [7, 0, 2, 2, 0]
    q64, s64 = quantize_symmetric(x.double(), 4)
    assert torch.equal(q64, q) and s64.dtype == torch.float32


def test_reference_tiny_values_use_all_levels() -> None:
    # subnormal powers of two (exact); qmax / absmax overflows float32
    x = torch.tensor([2.0**-133, -(2.0**-134), 3 * 2.0**-136])
    q, _ = quantize_symmetric(x, 8)
    assert q.tolist() == [127, -64, 48]  # 127 * [1, -0.5, 0.375], ties to even


def test_stochastic_rounding_is_unbiased() -> None:
    # bits=2 -> qmax=1; 0.3 rounds to 1 with probability 0.3, to 0 otherwise
    n = 200_000
    x = torch.full((n + 1,), 0.3)
    x[0] = 1.0
    q, s = quantize_symmetric(x, 2, "stochastic", seed=7)
    mean = dequantize(q, s)[1:].mean().item()
    assert abs(mean - 0.3) < 5 * math.sqrt(0.21 / n)
    qn, sn = quantize_symmetric(x, 2, "nearest")
    assert dequantize(qn, sn)[1:].mean().item() == 0.0  # nearest is biased here
    # different seeds give different draws, the same seed the same ones
    q2, _ = quantize_symmetric(x, 2, "stochastic", seed=8)
    q3, _ = quantize_symmetric(x, 2, "stochastic", seed=7)
    assert not torch.equal(q, q2) and torch.equal(q, q3)


def test_error_x_known_values() -> None:
    x = torch.tensor([1.0, 0.0, -2.0, 0.25])
    x_hat = torch.tensor([0.5, 0.0, -2.0, 0.5])
    eps = 5e-4
    want = (0.5 / (1.5 + eps) + 0.0 + 0.0 + 0.25 / (0.75 + eps)) / 4
    assert math.isclose(error_x(x, x_hat), want, rel_tol=1e-12)
    assert error_x(x, x) == 0.0
    assert error_x(torch.empty(0), torch.empty(0)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        error_x(x, x_hat[:2])
    # more bits -> smaller error
    y = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    errs = [error_x(y, dequantize(*quantize_symmetric(y, b))) for b in (2, 4, 8)]
    assert errs[0] > errs[1] > errs[2]


# ------------------------------------------------------------------ counter RNG


def test_hash32_torch_matches_int() -> None:
    vals = [0, 1, 2, 0xFFFFFFFF, 0x80000000, 123456789, 0xDEADBEEF]
    got = hash32(torch.tensor(vals, dtype=torch.int64)).tolist()
    assert got == [hash32_int(v) for v in vals]
    assert all(0 <= g < 2**32 for g in got)


def test_counter_uniform_range_and_moments() -> None:
    u = counter_uniform(100_000, seed=3, offset=0)
    assert u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u, bins=16, min=0.0, max=1.0)
    assert float(hist.min()) > 100_000 / 16 * 0.95
    # 24 random bits: values are multiples of 2^-24
    assert torch.equal(u * 2**24, torch.floor(u * 2**24))


def test_counter_uniform_streams() -> None:
    a = counter_uniform(1000, seed=1, offset=0)
    assert not torch.equal(a, counter_uniform(1000, seed=2, offset=0))
    assert (a == counter_uniform(1000, seed=2, offset=0)).float().mean() < 0.01
    # an offset selects a later part of the same stream
    assert torch.equal(counter_uniform(900, seed=1, offset=100), a[100:])
    # seeds are taken mod 2^64 and may exceed 2^32
    assert torch.equal(counter_uniform(10, seed=-1), counter_uniform(10, seed=2**64 - 1))
    assert not torch.equal(counter_uniform(10, seed=2**32), counter_uniform(10, seed=0))


def test_counter_uniform_beyond_2_32() -> None:
    base = 2**32 - 5  # crosses the high-word boundary
    u = counter_uniform(10, seed=9, offset=base)
    for i in (0, 4, 5, 9):  # pure function of (seed, counter)
        assert u[i] == counter_uniform(1, seed=9, offset=base + i)[0]
    far = counter_uniform(1000, seed=9, offset=6 * 10**9)
    near = counter_uniform(1000, seed=9, offset=6 * 10**9 - 2**32)
    assert not torch.equal(far, near)  # counters differing only in the high word differ
    assert float(far.min()) >= 0.0 and float(far.max()) < 1.0
    assert counter_bits(0, 1, 2**40).numel() == 0
    with pytest.raises(ValueError, match="2\\^63"):
        counter_uniform(10, offset=2**63 - 5)
