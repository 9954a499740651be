"""CUDA tango kernels (qtrain._ext_cuda) against the pure-PyTorch references on CPU copies.

Every op is bit-exact: quantization is elementwise with counter-based randomness,
integer sums are exact, and every float step is the reference's float32 operation.
Skipped where no GPU or no CUDA build is present. (The sparse ops' CUDA tests are in
tests/ops/test_qspmm.py and tests/ops/test_qsddmm.py, parametrized over devices.)
"""

from __future__ import annotations

import pytest
import torch

from qtrain import backends
from qtrain.ops import dispatch
from qtrain.ops import gemm as gemm_ops
from qtrain.ops import quantize as quantize_op  # the function (it shadows its submodule)
from qtrain.ops.gemm import (
    LAYOUTS,
    combined_scale,
    reference_int8_gemm,
    reference_quantized_gemm,
)
from qtrain.quant.quantize import quantize_symmetric
from qtrain.quant.rng import counter_uniform

if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
if not backends.available("ext-cuda"):
    pytest.skip(
        f"qtrain._ext_cuda not built: {backends.error('ext-cuda')}", allow_module_level=True
    )

EXT = backends.ext_cuda()
DEV = torch.device("cuda")
WIDTHS = (1, 3, 5, 17, 33, 127, 129)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _exact(got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    # bitwise, so -0.0 vs 0.0 and NaN payloads count too
    if got.dtype == torch.float32:
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (
            f"max diff {(got - want).abs().max().item() if got.numel() else 0}"
        )
    else:
        assert torch.equal(got, want)


# ---------------------------------------------------------------- quantize


QUANT_SHAPES = [(0,), (1,), (3,), (5, 17), (33, 127), (129, 3, 5), (4099,), (1 << 20) + 3]


@pytest.mark.parametrize("shape", QUANT_SHAPES)
@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantize_matches_reference(shape, bits: int, stochastic: bool) -> None:
    shape = shape if isinstance(shape, tuple) else (shape,)
    x = torch.randn(shape, generator=_gen(bits)) * 3.0
    rounding = "stochastic" if stochastic else "nearest"
    for seed, offset in ((0, 0), (12345, 77), (2**64 - 1, 2**32 - 5)):
        q, s = EXT.quantize_symmetric(x.to(DEV), bits, stochastic, seed, offset)
        rq, rs = quantize_symmetric(x, bits, rounding, seed, offset)
        assert q.device.type == "cuda" and s.device.type == "cuda" and s.dim() == 0
        _exact(q, rq)
        _exact(s, rs)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(37),
        torch.full((5, 7), -2.5),
        torch.full((64,), 1e-39),  # qmax / absmax overflows: the 2^64 pre-scale path
        torch.tensor([0.5, -0.5, 1.5, -1.5, 2.5, 127.0, -127.0]),  # ties to even
        torch.tensor([-0.0, 0.0, -0.0]),
    ],
)
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantize_edge_values(x: torch.Tensor, stochastic: bool) -> None:
    rounding = "stochastic" if stochastic else "nearest"
    for bits in (2, 5, 8):
        q, s = EXT.quantize_symmetric(x.to(DEV), bits, stochastic, 9, 3)
        rq, rs = quantize_symmetric(x, bits, rounding, 9, 3)
        _exact(q, rq)
        _exact(s, rs)


def test_quantize_unaligned_and_strided_input() -> None:
    base = torch.randn(4099, generator=_gen(1))
    for x in (base[1:], base[3:3003], base.reshape(4099, 1)[::2, 0]):
        q, s = EXT.quantize_symmetric(x.to(DEV), 6, True, 5, 11)
        rq, rs = quantize_symmetric(x, 6, "stochastic", 5, 11)
        _exact(q, rq)
        _exact(s, rs)
    # a view at an odd element offset of a CUDA tensor: the scalar (unvectorized) kernels
    xd = base.to(DEV)[1:]
    q, s = EXT.quantize_symmetric(xd, 4, False, 0, 0)
    rq, rs = quantize_symmetric(base[1:], 4, "nearest", 0, 0)
    _exact(q, rq)
    _exact(s, rs)


def test_quantize_argument_errors() -> None:
    with pytest.raises(ValueError, match="NaN or Inf"):
        EXT.quantize_symmetric(torch.tensor([1.0, float("nan")], device=DEV), 8)
    with pytest.raises(ValueError, match="NaN or Inf"):
        EXT.quantize_symmetric(torch.tensor([float("inf")], device=DEV), 8)
    with pytest.raises(ValueError, match="CUDA tensor"):
        EXT.quantize_symmetric(torch.ones(3), 8)
    with pytest.raises(TypeError, match="float32"):
        EXT.quantize_symmetric(torch.ones(3, device=DEV, dtype=torch.float64), 8)
    with pytest.raises(ValueError, match="bits"):
        EXT.quantize_symmetric(torch.ones(3, device=DEV), 9)
    with pytest.raises(ValueError, match="offset"):
        EXT.quantize_symmetric(torch.ones(3, device=DEV), 8, True, 0, -1)


@pytest.mark.parametrize("n", [0, 1, 5, 1001, (1 << 18) + 1])
def test_counter_uniform_matches_reference(n: int) -> None:
    for seed, offset in ((0, 0), (7, 2**32 - 3), (2**40 + 1, 123)):
        got = EXT.counter_uniform(n, seed, offset)
        assert got.device.type == "cuda"
        _exact(got, counter_uniform(n, seed, offset))
    with pytest.raises(ValueError):
        EXT.counter_uniform(-1)


def test_quantize_wrapper_dispatches_to_cuda() -> None:
    dispatch.reset()
    x = torch.randn(100, generator=_gen(3))
    q, s = quantize_op(x.to(DEV), 4, "stochastic", seed=2, offset=5)
    assert dispatch.snapshot()["quantize"] == {"ext-cuda": 1}
    rq, rs = quantize_symmetric(x, 4, "stochastic", 2, 5)
    _exact(q, rq)
    _exact(s, rs)


# ---------------------------------------------------------------- GEMM

# (M, K, N): tails of the 64 x 256 tile and of the 32-wide k-step, K % 4 != 0
# (the unvectorized loads), several row blocks and column blocks
GEMM_SHAPES = [
    (1, 1, 1),
    (3, 5, 17),
    (5, 33, 1),
    (17, 127, 129),
    (33, 129, 3),
    (64, 32, 256),
    (65, 64, 257),
    (127, 96, 128),
    (200, 250, 80),
    (513, 256, 256),
]


def _operands(m: int, k: int, n: int, layout: str, g: torch.Generator, dtype=torch.int8):
    sa = (k, m) if layout == "tn" else (m, k)
    sb = (n, k) if layout == "nt" else (k, n)
    if dtype == torch.int8:
        return (
            torch.randint(-128, 128, sa, generator=g, dtype=torch.int8),
            torch.randint(-128, 128, sb, generator=g, dtype=torch.int8),
        )
    return torch.randn(sa, generator=g) * 2.0, torch.randn(sb, generator=g)


@pytest.mark.parametrize("shape", GEMM_SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_gemm_matches_reference(shape, layout: str, with_bias: bool) -> None:
    m, k, n = shape
    g = _gen(m * 7 + k * 3 + n)
    qa, qb = _operands(m, k, n, layout, g)
    bias = torch.randn(n, generator=g) if with_bias else None
    scale = combined_scale(0.0123, 0.456)
    got = EXT.int8_gemm(
        qa.to(DEV), qb.to(DEV), scale, layout, None if bias is None else bias.to(DEV)
    )
    _exact(got, reference_int8_gemm(qa, qb, scale, layout, bias))


@pytest.mark.parametrize(
    "shape,layout",
    [
        ((8, 5000, 8), "tn"),  # few output tiles, long K: split-K with int64 partials
        ((3, 70001, 5), "nn"),  # K beyond one int32 chunk
        ((40, 9000, 300), "nt"),
    ],
)
def test_int8_gemm_split_k(shape, layout: str) -> None:
    m, k, n = shape
    g = _gen(k)
    qa, qb = _operands(m, k, n, layout, g)
    # all -128: the largest products, so an int32 overflow would show
    qa[: min(2, qa.shape[0])] = -128
    qb[: min(2, qb.shape[0])] = -128
    bias = torch.randn(n, generator=g)
    got = EXT.int8_gemm(qa.to(DEV), qb.to(DEV), 1e-4, layout, bias.to(DEV))
    _exact(got, reference_int8_gemm(qa, qb, 1e-4, layout, bias))


def test_int8_gemm_empty_and_errors() -> None:
    for m, k, n in ((0, 3, 4), (4, 0, 5), (5, 3, 0)):
        qa = torch.zeros((m, k), dtype=torch.int8)
        qb = torch.zeros((k, n), dtype=torch.int8)
        bias = torch.randn(n)
        got = EXT.int8_gemm(qa.to(DEV), qb.to(DEV), 0.5, "nn", bias.to(DEV))
        _exact(got, reference_int8_gemm(qa, qb, 0.5, "nn", bias))
    a = torch.zeros((2, 3), dtype=torch.int8, device=DEV)
    with pytest.raises(TypeError):
        EXT.int8_gemm(a.float(), a.t().contiguous(), 1.0, "nn")
    with pytest.raises(ValueError, match="CUDA"):
        EXT.int8_gemm(a.cpu(), a.t().contiguous().cpu(), 1.0, "nn")
    with pytest.raises(ValueError, match="inner"):
        EXT.int8_gemm(a, a, 1.0, "nn")
    with pytest.raises(ValueError, match="layout"):
        EXT.int8_gemm(a, a, 1.0, "tt")
    with pytest.raises(ValueError, match="bias"):
        EXT.int8_gemm(a, a.t().contiguous(), 1.0, "nn", torch.zeros(5, device=DEV))


@pytest.mark.parametrize("shape", GEMM_SHAPES[1:8])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_quantized_gemm_matches_reference(shape, layout, stochastic, with_bias) -> None:
    m, k, n = shape
    g = _gen(m + 31 * k + n)
    a, b = _operands(m, k, n, layout, g, torch.float32)
    bias = torch.randn(n, generator=g) if with_bias else None
    for bits_a, bits_b in ((8, 8), (4, 6), (2, 3)):
        amax_a, amax_b = a.abs().max(), b.abs().max() * 0.75  # b's range clips: clamping
        args = (bits_a, bits_b, layout)
        got, got_max = EXT.quantized_gemm(
            a.to(DEV),
            b.to(DEV),
            amax_a.to(DEV),
            amax_b,
            *args,
            None if bias is None else bias.to(DEV),
            stochastic,
            99,
            5,
            2**32 - 7,
        )
        want, want_max = reference_quantized_gemm(
            a, b, amax_a, amax_b, *args, bias, stochastic, 99, 5, 2**32 - 7
        )
        _exact(got, want)
        _exact(got_max, want_max)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantized_gemm_equals_quantize_then_int8_gemm(layout: str) -> None:
    m, k, n = 300, 72, 40
    a, b = _operands(m, k, n, layout, _gen(4), torch.float32)
    got, got_max = EXT.quantized_gemm(
        a.to(DEV), b.to(DEV), a.abs().max(), b.abs().max(), 8, 8, layout, None, True, 3, 10, 20
    )
    qa, sa = quantize_symmetric(a, 8, "stochastic", 3, 10)
    qb, sb = quantize_symmetric(b, 8, "stochastic", 3, 20)
    want = reference_int8_gemm(qa, qb, combined_scale(sa, sb), layout)
    _exact(got, want)
    _exact(got_max, want.abs().max())
    # through the wrapper, chained: the returned device absmax is the next range
    w = torch.randn(n, 8, generator=_gen(6))
    dispatch.reset()
    c2, m2 = gemm_ops.quantized_gemm(got, w.to(DEV), got_max, w.abs().max(), rounding="stochastic")
    assert dispatch.snapshot()["quantized_gemm"] == {"ext-cuda": 1}
    want2, wm2 = reference_quantized_gemm(
        got.cpu(), w, got_max.cpu(), w.abs().max(), stochastic=True
    )
    _exact(c2, want2)
    _exact(m2, wm2)


def test_quantized_gemm_split_k_and_zero_range() -> None:
    a, b = _operands(8, 6000, 8, "tn", _gen(8), torch.float32)
    got, got_max = EXT.quantized_gemm(
        a.to(DEV), b.to(DEV), a.abs().max(), b.abs().max(), 8, 8, "tn"
    )
    want, want_max = reference_quantized_gemm(a, b, a.abs().max(), b.abs().max(), 8, 8, "tn")
    _exact(got, want)
    _exact(got_max, want_max)
    z = torch.zeros(5, 7)
    got, got_max = EXT.quantized_gemm(
        z.to(DEV),
        b[:7, :3].contiguous().to(DEV),
        torch.tensor(0.0),
        torch.tensor(1.0),
        8,
        8,
        "nn",
        None,
        True,
        0,
        0,
        0,
    )
    want, want_max = reference_quantized_gemm(
        z, b[:7, :3].contiguous(), 0.0, 1.0, 8, 8, "nn", None, True
    )
    _exact(got, want)
    _exact(got_max, want_max)


def test_quantized_gemm_errors() -> None:
    a = torch.ones(4, 3, device=DEV)
    b = torch.ones(3, 2, device=DEV)
    one = torch.tensor(1.0)
    with pytest.raises(TypeError):
        EXT.quantized_gemm(a.to(torch.int8), b, one, one)
    with pytest.raises(ValueError, match="CUDA"):
        EXT.quantized_gemm(a.cpu(), b.cpu(), one, one)
    with pytest.raises(ValueError, match="finite"):
        EXT.quantized_gemm(a, b, torch.tensor(float("nan")), one)
    with pytest.raises(ValueError, match="bits_a"):
        EXT.quantized_gemm(a, b, one, one, 1)
    with pytest.raises(TypeError):
        EXT.quantized_gemm(a, b, torch.tensor(1.0, dtype=torch.float64), one)


def test_gemm_wrapper_dispatches_to_cuda() -> None:
    dispatch.reset()
    qa, qb = _operands(9, 10, 11, "nn", _gen(5))
    got = gemm_ops.int8_gemm(qa.to(DEV), qb.to(DEV), 0.5, 0.25, "nn")
    assert dispatch.snapshot()["gemm"] == {"ext-cuda": 1}
    _exact(got, reference_int8_gemm(qa, qb, combined_scale(0.5, 0.25), "nn"))
