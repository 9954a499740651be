"""torch.ops.qtrain.quantized_gemm on every device against its reference
(qtrain.ops.gemm.reference_quantized_gemm), bit for bit: every layout, both roundings,
clipping ranges, ranges on the device or the CPU, every CPU ISA variant and thread count."""

from __future__ import annotations

import pytest
import torch
from gemm_cases import (
    SHAPES,
    floats,
    int8_reference,
    operands,
    quantized_reference,
)
from support import DEVICES, ErrorCase, assert_same, expect_errors, library, opcheck, variants

from qtrain.ops.gemm import LAYOUTS, combined_scale
from qtrain.quant.quantize import quantize_symmetric
from qtrain.quant.rng import op_seed

BITS = ((8, 8), (4, 6), (2, 3))


def _run(device: str, a, b, absmax_a, absmax_b, *args, seed: int = 0, **kwargs):
    """The op on ``device``; a, b and the bias go there, the ranges stay where they are."""
    ops = library(device)
    args = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in args)
    bias = kwargs.pop("bias", None)
    if bias is not None:
        kwargs["bias"] = bias.to(device)
    c, absmax = ops.quantized_gemm(
        a.to(device), b.to(device), absmax_a, absmax_b, *args, seed=op_seed(seed), **kwargs
    )
    assert c.device.type == absmax.device.type == torch.device(device).type
    assert absmax.shape == ()
    return c, absmax


def _check(device: str, a, b, absmax_a, absmax_b, *args, what: str = "", **kwargs) -> None:
    """The op equals the reference in every kernel variant of ``device``."""
    want, want_max = quantized_reference(a, b, absmax_a, absmax_b, *args, **kwargs)
    for variant in variants(device):
        got, got_max = _run(device, a, b, absmax_a, absmax_b, *args, **kwargs)
        assert_same(got, want, f"{what}, {variant}")
        assert_same(got_max, want_max, f"{what} absmax, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_matches_reference(device: str, layout: str, stochastic: bool) -> None:
    for i, (m, k, n) in enumerate(SHAPES[3:17]):
        a, b = operands(m, k, n, layout, floats(m + 31 * k + n, 2.0))
        bias = torch.randn(n) if i % 2 else None
        for bits_a, bits_b in BITS:
            # a's range on a's device, b's on the CPU and clipping (values beyond it clamp)
            amax_a, amax_b = a.abs().max().to(device), b.abs().max() * 0.75
            _check(
                device,
                a,
                b,
                amax_a,
                amax_b,
                bits_a,
                bits_b,
                layout,
                bias=bias,
                stochastic=stochastic,
                seed=99,
                offset_a=5,
                offset_b=2**32 - 7,
                what=f"{layout} {(m, k, n)} bits {bits_a}/{bits_b}",
            )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_equals_quantize_then_int8_gemm(device: str, layout: str) -> None:
    """With the operands' true ranges: quantize_symmetric of each, then int8_gemm."""
    m, k, n = 300, 72, 40
    a, b = operands(m, k, n, layout, floats(4, 2.0))
    qa, sa = quantize_symmetric(a, 8, "stochastic", 3, 10)
    qb, sb = quantize_symmetric(b, 8, "stochastic", 3, 20)
    want = int8_reference(qa, qb, combined_scale(sa, sb), layout)
    for variant in variants(device):
        got, got_max = _run(
            device, a, b, a.abs().max(), b.abs().max(), 8, 8, layout, None, True,
            seed=3, offset_a=10, offset_b=20,
        )  # fmt: skip
        assert_same(got, want, variant)
        assert_same(got_max, want.abs().max(), variant)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_long_inner_dimension(device: str, layout: str) -> None:
    """The split-K paths (CPU "tn", CUDA few output tiles or K beyond one int32 chunk)."""
    for m, k, n in ((8, 6000, 8), (3, 70_001, 5), (40, 5000, 70)):
        a, b = operands(m, k, n, layout, floats(k))
        for stochastic in (False, True):
            _check(device, a, b, a.abs().max(), b.abs().max(), 8, 7, layout, torch.randn(n),
                   stochastic, seed=1, what=f"{(m, k, n)}")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stochastic", [False, True])
def test_edge_ranges_and_values(device: str, stochastic: bool) -> None:
    """Zero ranges, ranges far below the values (every value clamps, |x / range| beyond
    int32), tiny ranges (the 2^64 pre-scale), zero, constant and huge operands."""
    g = torch.Generator().manual_seed(8)
    a = torch.randn(9, 13, generator=g)
    b = torch.randn(13, 6, generator=g)
    huge = (torch.rand(9, 13, generator=g) * 2 - 1) * 3.4e38
    tiny = torch.randn(13, 6, generator=g) * 1e-39
    cases = [
        (a, b, 0.0, 0.0),
        (a, b, 0.0, 1.0),
        (a, b, 1e-30, 1e-3),  # v = x / range far beyond int32: clamps to +-qmax
        (a, b, 1e-42, 2.0),  # a subnormal range: qmax / range overflows, the 2^64 path
        (huge, b, 3.4e38, 1.0),
        (huge, tiny, 1e30, float(tiny.abs().max())),
        (torch.zeros(9, 13), b, 0.0, float(b.abs().max())),
        (torch.full((9, 13), -2.5), torch.full((13, 6), 0.75), 2.5, 0.75),
        (torch.tensor([[-0.0, 0.0], [0.0, -0.0]]), torch.tensor([[-0.0], [0.0]]), 1.0, 1.0),
    ]
    for i, (x, y, ra, rb) in enumerate(cases):
        for bits_a, bits_b in BITS:
            _check(device, x, y, torch.tensor(ra), torch.tensor(rb), bits_a, bits_b, "nn",
                   None, stochastic, seed=i, what=f"case {i}")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_empty_operands(device: str) -> None:
    for m, k, n in ((0, 3, 4), (4, 0, 5), (5, 3, 0), (0, 0, 0)):
        a, b = operands(m, k, n, "nn", floats(1))
        _check(device, a, b, torch.tensor(1.0), torch.tensor(2.0), 8, 8, "nn", torch.randn(n),
               True, what=f"{(m, k, n)}")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ranges_of_any_one_element_shape_and_place(device: str, layout: str) -> None:
    """A range is a 0-d or one-element tensor, on a's device or the CPU, any view of one."""
    a, b = operands(33, 70, 65, layout, floats(6))
    ra, rb = a.abs().max(), b.abs().max() * 0.5
    want = quantized_reference(a, b, ra, rb, 6, 8, layout)
    for range_a, range_b in (
        (ra, rb),
        (ra.to(device), rb.to(device)),
        (ra.reshape(1), rb.reshape(1, 1).to(device)),
        (torch.stack([rb, ra]).to(device)[1:], torch.stack([ra, rb])[1]),  # views at offset 1
    ):
        got = _run(device, a, b, range_a, range_b, 6, 8, layout)
        assert_same(got[0], want[0])
        assert_same(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_contiguous_and_unaligned_inputs(device: str, layout: str) -> None:
    make = floats(11)
    m, k, n = 23, 45, 37
    a, b = operands(m, k, n, layout, make)
    a_t = a.t().contiguous().t()
    b_s = torch.cat([b, make(b.shape)], dim=1)[:, : b.shape[1]]
    assert not a_t.is_contiguous() and not b_s.is_contiguous()
    bias = torch.randn(2 * n)[::2]
    _check(device, a_t, b_s, a.abs().max(), b.abs().max(), 8, 5, layout, bias, True, seed=2)
    _check(device, a, b, a.abs().max(), b.abs().max(), 8, 8, layout,
           torch.randn(n, dtype=torch.float64))  # fmt: skip
    # views at an odd element offset of tensors already on the device: the unvectorized loads
    ops = library(device)
    for mm, kk, nn in ((23, 44, 36), (70, 64, 260)):
        a, b = operands(mm, kk, nn, layout, make)
        base_a = torch.zeros(a.numel() + 1, device=device)
        base_b = torch.zeros(b.numel() + 1, device=device)
        base_a[1:] = a.reshape(-1).to(device)
        base_b[1:] = b.reshape(-1).to(device)
        ra, rb = a.abs().max(), b.abs().max()
        got, got_max = ops.quantized_gemm(
            base_a[1:].view(a.shape), base_b[1:].view(b.shape), ra, rb, 7, 8, layout, None, True, 4
        )
        want, want_max = quantized_reference(a, b, ra, rb, 7, 8, layout, None, True, 4)
        assert_same(got, want)
        assert_same(got_max, want_max)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    a, b = operands(9, 13, 5, "nn", floats(2))
    a, b = a.to(device), b.to(device)
    ra, rb = a.abs().max(), b.abs().max().cpu()
    bias = torch.randn(5, device=device)
    for args in (
        (a, b, ra, rb),
        (a, b.t().contiguous(), ra, rb, 4, 6, "nt", bias, True, 3, 7, 2**32 - 3),
        (a.t(), b, ra.reshape(1), rb, 8, 8, "tn", None, True, -1, 0, 0),
        (a[:0], b, ra, rb, 8, 8, "nn", bias, False, 0, 0, 0),
    ):
        opcheck(ops.quantized_gemm.default, args)


# the other device of a device mismatch: meta next to the CPU, the CPU next to a GPU
_OTHER = "(torch.device('meta') if dev.type == 'cpu' else torch.device('cpu'))"
_A = "torch.ones(4, 3, device=dev)"
_B = "torch.ones(3, 2, device=dev)"
_ONE = "torch.tensor(1.0)"


def _call(
    a: str = _A,
    b: str = _B,
    ra: str = _ONE,
    rb: str = _ONE,
    bits_a: int = 8,
    bits_b: int = 8,
    layout: str = "'nn'",
    bias: str = "None",
    offsets: tuple[int, int] = (0, 0),
) -> str:
    return (
        f"ops.quantized_gemm({a}, {b}, {ra}, {rb}, {bits_a}, {bits_b}, {layout}, {bias}, True, 0,"
        f" {offsets[0]}, {offsets[1]})"
    )


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    cases = [
        ErrorCase("layout", _call(layout="'tt'"), "ValueError", "layout must be one of"),
        ErrorCase(
            "bits_a 1", _call(bits_a=1), "ValueError", r"bits_a must be an integer in 2\.\.8"
        ),
        ErrorCase(
            "bits_b 9", _call(bits_b=9), "ValueError", r"bits_b must be an integer in 2\.\.8"
        ),
        ErrorCase(
            "a int8", _call(a=f"{_A}.to(torch.int8)"), "TypeError", "a must be float32, got int8"
        ),
        ErrorCase(
            "b float64", _call(b=f"{_B}.double()"), "TypeError", "b must be float32, got float64"
        ),
        ErrorCase("a 1-d", _call(a=f"{_A}[0]"), "ValueError", "a must be 2-d"),
        ErrorCase("b 3-d", _call(b=f"{_B}[None]"), "ValueError", "b must be 2-d"),
        ErrorCase("a sparse", _call(a=f"{_A}.to_sparse()"), "ValueError", "a must be a dense"),
        ErrorCase("b device", _call(b=f"{_B}.to({_OTHER})"), "ValueError", "b is on"),
        ErrorCase("inner", _call(layout="'nt'"), "ValueError", "inner dimensions differ"),
        ErrorCase(
            "absmax_a float64",
            _call(ra="torch.tensor(1.0, dtype=torch.float64)"),
            "TypeError",
            "absmax_a must be float32, got float64",
        ),
        ErrorCase(
            "absmax_b two values",
            _call(rb="torch.ones(2, device=dev)"),
            "ValueError",
            "absmax_b must hold one value",
        ),
        ErrorCase(
            "absmax_a empty",
            _call(ra="torch.ones(0, device=dev)"),
            "ValueError",
            "absmax_a must hold one value",
        ),
        ErrorCase(
            "absmax_a sparse",
            _call(ra="torch.ones(1).to_sparse()"),
            "ValueError",
            "absmax_a must be a dense",
        ),
        ErrorCase(
            "absmax_b device",
            _call(rb="torch.tensor(1.0, device='meta')"),
            "ValueError",
            "absmax_b is on meta but must be on a's device",
        ),
        ErrorCase(
            "bias int32",
            _call(bias="torch.zeros(2, dtype=torch.int32, device=dev)"),
            "TypeError",
            "bias must be a floating-point",
        ),
        ErrorCase(
            "bias length",
            _call(bias="torch.zeros(3, device=dev)"),
            "ValueError",
            r"bias must have shape \(2,\)",
        ),
        ErrorCase(
            "bias device",
            _call(bias=f"torch.zeros(2, device={_OTHER})"),
            "ValueError",
            "bias is on",
        ),
        ErrorCase(
            "offset_a negative", _call(offsets=(-1, 0)), "ValueError", "offset_a must be >= 0"
        ),
        ErrorCase(
            "offset_b overflow",
            _call(offsets=(0, 2**63 - 5)),
            "ValueError",
            r"offset_b \+ numel of b must stay below 2\^63",
        ),
        # value checks, made by the kernels (a range on the CPU is read on every device)
        ErrorCase(
            "absmax_a NaN",
            _call(ra="torch.tensor(float('nan'))"),
            "ValueError",
            "absmax_a must be finite and >= 0",
        ),
        ErrorCase(
            "absmax_b Inf",
            _call(rb="torch.tensor([float('inf')])"),
            "ValueError",
            "absmax_b must be finite and >= 0",
        ),
        ErrorCase(
            "absmax_b negative",
            _call(rb="torch.tensor(-1.0)"),
            "ValueError",
            "absmax_b must be finite and >= 0",
        ),
        ErrorCase(
            "absmax_a NaN, empty product",
            _call(a="torch.ones(0, 3, device=dev)", ra="torch.tensor(float('nan'))"),
            "ValueError",
            "absmax_a must be finite and >= 0",
        ),
    ]
    if device == "cpu":  # on the CPU a's device is the CPU: the kernel reads every range
        cases.append(
            ErrorCase(
                "absmax_a negative on a's device",
                _call(ra="torch.tensor([-0.5], device=dev)"),
                "ValueError",
                "absmax_a must be finite and >= 0",
            )
        )
    if device == "cuda":  # the grid's y size: at most 65535 column blocks of 256
        cases.append(
            ErrorCase(
                "N beyond the CUDA grid",
                _call(
                    a="torch.zeros(1, 0, device=dev)",
                    b="torch.zeros(0, 65535 * 256 + 1, device=dev)",
                ),
                "ValueError",
                "too large for the CUDA kernel",
            )
        )
    expect_errors(cases, device)
