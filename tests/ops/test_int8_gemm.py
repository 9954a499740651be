"""torch.ops.qtrain.int8_gemm on every device against its reference
(qtrain.ops.gemm.reference_int8_gemm), bit for bit: every layout, CPU ISA variant and
thread count, both CPU "tn" strategies, the CUDA split-K path, long inner dimensions, and
the per-row / per-column scale vectors of the epilogue (row_scale, col_scale)."""

from __future__ import annotations

import pytest
import torch
from gemm_cases import (
    EMPTY_SHAPES,
    SHAPES,
    constant,
    floats,
    int8_reference,
    int8s,
    operands,
)
from support import DEVICES, ErrorCase, assert_same, expect_errors, library, opcheck, variants

from qtrain.ops import quantize as quantize_op  # the function (it shadows its submodule)
from qtrain.ops.gemm import LAYOUTS, combined_scale

SCALE = 0.0173


def _on(t: torch.Tensor | None, device: str) -> torch.Tensor | None:
    return None if t is None else t.to(device)


def _run(
    device: str, qa, qb, scale: float, layout: str, bias=None, row_scale=None, col_scale=None
) -> torch.Tensor:
    ops = library(device)
    if row_scale is None and col_scale is None:  # the call without the new arguments
        out = ops.int8_gemm(qa.to(device), qb.to(device), scale, layout, _on(bias, device))
    else:
        out = ops.int8_gemm(
            qa.to(device),
            qb.to(device),
            scale,
            layout,
            _on(bias, device),
            _on(row_scale, device),
            _on(col_scale, device),
        )
    assert out.device.type == torch.device(device).type
    return out


def _check(
    device: str,
    qa,
    qb,
    layout: str,
    scale: float = SCALE,
    bias=None,
    row_scale=None,
    col_scale=None,
) -> None:
    """The op equals the reference in every kernel variant of ``device``."""
    want = int8_reference(qa, qb, scale, layout, bias, row_scale, col_scale)
    vectors = f"row_scale={row_scale is not None}, col_scale={col_scale is not None}"
    for variant in variants(device):
        got = _run(device, qa, qb, scale, layout, bias, row_scale, col_scale)
        what = f"{layout} {tuple(qa.shape)} x {tuple(qb.shape)}, {vectors}, {variant}"
        assert_same(got, want, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(device: str, layout: str) -> None:
    make = int8s(100 * LAYOUTS.index(layout))
    for i, (m, k, n) in enumerate(SHAPES):
        qa, qb = operands(m, k, n, layout, make)
        bias = torch.randn(n) if i % 2 else None
        _check(device, qa, qb, layout, scale=combined_scale(0.0123, 0.456), bias=bias)


@pytest.mark.parametrize("strategy", ["split", "rows"])
def test_cpu_tn_both_strategies(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both CPU "tn" strategies (K split across threads, A^T packed per row block) are exact."""
    monkeypatch.setenv("QTRAIN_GEMM_TN", strategy)
    make = int8s(13)
    for i, (m, k, n) in enumerate([*SHAPES, *EMPTY_SHAPES, (40, 3000, 70), (2, 70_001, 3)]):
        qa, qb = operands(m, k, n, "tn", make)
        _check("cpu", qa, qb, "tn", bias=torch.randn(n) if i % 2 else None)


@pytest.mark.parametrize("n", [128, 144, 130])
def test_cpu_output_beyond_the_caches(n: int) -> None:
    """An output of 32 MiB or more (65,536 x 128 floats) is written with non-temporal stores
    when its rows are 64-byte aligned (128 and 144 columns, the last panel partial), with
    normal stores otherwise (130: unaligned rows): bit for bit the reference either way."""
    make = int8s(n)
    qa, qb = operands(65_536, 12, n, "nn", make)
    _check("cpu", qa, qb, "nn", bias=torch.randn(n))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_long_inner_dimension(device: str, layout: str) -> None:
    """K in the thousands: the split-K paths (CPU "tn", CUDA few output tiles or K beyond one
    int32 chunk) and many k-steps; the first rows at -128, so an int32 overflow would show."""
    make = int8s(7)
    shapes = [(19, 5003, 70), (128, 4100, 3), (2, 2049, 1), (8, 5000, 8), (3, 70_001, 5)]
    for m, k, n in [*shapes, (40, 9000, 300)]:
        qa, qb = operands(m, k, n, layout, make)
        qa[: min(2, qa.shape[0])] = -128
        qb[: min(2, qb.shape[0])] = -128
        _check(device, qa, qb, layout, scale=1e-4, bias=torch.randn(n))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_inner_dimension_beyond_int32_chunks(
    device: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K > 65536 with all -128: partial sums go through int64 (a true sum of 2^31 and more)."""
    m, k, n = 2, 70_001, 3
    qa, qb = operands(m, k, n, layout, constant(-128))
    cpu_tn = device == "cpu" and layout == "tn"
    for strategy in ("split", "rows") if cpu_tn else ("auto",):
        monkeypatch.setenv("QTRAIN_GEMM_TN", strategy)
        _check(device, qa, qb, layout, scale=1.0)
        assert _run(device, qa, qb, 1.0, layout)[0, 0].item() == float(k * 128 * 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_dimensions(device: str, layout: str) -> None:
    for m, k, n in EMPTY_SHAPES:
        qa, qb = operands(m, k, n, layout, int8s(1))
        _check(device, qa, qb, layout)
        bias = torch.randn(n)
        _check(device, qa, qb, layout, bias=bias)
        if m and n and not k:  # K = 0: zeros, plus bias
            assert_same(_run(device, qa, qb, 0.5, layout, bias), bias.expand(m, n).contiguous())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("value", [0, 1, -1, 127, -127, -128])
def test_constant_and_extreme_operands(device: str, layout: str, value: int) -> None:
    for m, k, n in ((7, 33, 65), (1, 1, 1), (13, 130, 17)):
        qa, qb = operands(m, k, n, layout, constant(value))
        _check(device, qa, qb, layout)
        # one operand at an extreme, the other random
        qa2, qb2 = operands(m, k, n, layout, int8s(3))
        _check(device, qa2, qb, layout, bias=torch.randn(n))
        _check(device, qa, qb2, layout)
    # opposite extremes everywhere: the largest magnitudes the accumulator sees
    qa, qb = operands(9, 257, 31, layout, constant(-127))
    _check(device, qa, -qb, layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bits", range(2, 9))
def test_on_quantized_float_data(device: str, layout: str, bits: int) -> None:
    """Operands as the training loop makes them: quantize() of random float data."""
    m, k, n = 37, 65, 47
    xa, xb = operands(m, k, n, layout, floats(bits))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(bits))
    for rounding in ("nearest", "stochastic"):
        qa, sa = quantize_op(xa.to(device), bits, rounding, seed=bits)
        qb, sb = quantize_op(xb.to(device), bits, rounding, seed=bits + 100)
        scale = combined_scale(sa, sb)
        _check(device, qa, qb, layout, scale=scale, bias=bias)
        if bits == 8:  # and the dequantized product is close to the float product
            a = xa.t() if layout == "tn" else xa
            b = xb.t() if layout == "nt" else xb
            out = _run(device, qa, qb, scale, layout).cpu()
            assert torch.allclose(out, a @ b, atol=0.1 * k**0.5, rtol=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_scale_edge_values(device: str) -> None:
    """Zero, negative, huge and non-finite scales follow the reference's float arithmetic."""
    qa, qb = operands(5, 9, 19, "nn", int8s(5))
    for scale in (0.0, -0.0, -2.5, 3.0e38, 1e-45, float("inf"), float("nan")):
        want = int8_reference(qa, qb, scale, "nn")
        for variant in variants(device):
            got = _run(device, qa, qb, scale, "nn").cpu()
            if torch.isnan(want).any():  # NaN payloads differ between CPU and GPU
                assert torch.isnan(got).equal(torch.isnan(want)), (scale, variant)
                assert_same(got.nan_to_num(0), want.nan_to_num(0), f"{scale}, {variant}")
            else:
                assert_same(got, want, f"{scale}, {variant}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_contiguous_and_unaligned_inputs(device: str, layout: str) -> None:
    make = int8s(11)
    m, k, n = 23, 45, 37
    qa, qb = operands(m, k, n, layout, make)
    # transposed views and strided slices holding the same values
    qa_t = qa.t().contiguous().t()
    qb_s = torch.cat([qb, make(qb.shape)], dim=1)[:, : qb.shape[1]]
    assert not qa_t.is_contiguous() and not qb_s.is_contiguous()
    _check(device, qa_t, qb_s, layout, bias=torch.randn(2 * n)[::2])
    # float64 and float16 biases are taken as float32, as the reference does
    _check(device, qa, qb, layout, bias=torch.randn(n, dtype=torch.float64))
    _check(device, qa, qb, layout, bias=torch.randn(n).half())
    # views at an odd byte offset of tensors already on the device: the unvectorized loads
    ops = library(device)
    for mm, kk, nn in ((23, 44, 36), (70, 64, 260)):
        qa, qb = operands(mm, kk, nn, layout, make)
        base_a = torch.zeros(qa.numel() + 1, dtype=torch.int8, device=device)
        base_b = torch.zeros(qb.numel() + 1, dtype=torch.int8, device=device)
        base_a[1:] = qa.reshape(-1).to(device)
        base_b[1:] = qb.reshape(-1).to(device)
        got = ops.int8_gemm(base_a[1:].view(qa.shape), base_b[1:].view(qb.shape), SCALE, layout)
        assert_same(got, int8_reference(qa, qb, SCALE, layout))


# ------------------------------------------------------------------ row / column scales

# sizes around the CPU micro-tiles (6 rows; 16 / 64 columns) and the CUDA 64 x 256 tile
EDGES = (1, 7, 15, 16, 17, 33, 65, 129)
VECTOR_SHAPES = [
    *((m, 17, 33) for m in EDGES),
    *((7, 17, n) for n in EDGES),
    *((16, k, 65) for k in EDGES),
    (129, 129, 129),
    (33, 65, 15),
    (65, 7, 129),
    (17, 1, 16),
    (0, 5, 7),
    (5, 0, 7),
    (5, 7, 0),
    (0, 0, 0),
]
VECTOR_MODES = ("row", "col", "both")


def _vector(n: int, seed: int) -> torch.Tensor:
    """Scales over six decades, a quarter of them negative."""
    g = torch.Generator().manual_seed(seed)
    v = 10.0 ** (torch.rand(n, generator=g) * 6 - 4)
    return torch.where(torch.rand(n, generator=g) < 0.25, -v, v)


def _vectors(mode: str, m: int, n: int, seed: int) -> tuple[torch.Tensor | None, ...]:
    row = _vector(m, seed) if mode in ("row", "both") else None
    col = _vector(n, seed + 1) if mode in ("col", "both") else None
    return row, col


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", VECTOR_MODES)
def test_scale_vectors_match_reference(device: str, layout: str, mode: str) -> None:
    make = int8s(200 + LAYOUTS.index(layout))
    for i, (m, k, n) in enumerate(VECTOR_SHAPES):
        qa, qb = operands(m, k, n, layout, make)
        row, col = _vectors(mode, m, n, i)
        bias = torch.randn(n) if i % 2 else None
        _check(device, qa, qb, layout, scale=0.0173, bias=bias, row_scale=row, col_scale=col)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_scale_vectors_long_inner_dimension(
    device: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int64 epilogues with vectors: the CPU's K beyond one int32 chunk (per tile) and
    its split-K "tn" (the whole output at once), the CUDA split-K finalize kernel."""
    make = int8s(17)
    cpu_tn = device == "cpu" and layout == "tn"
    for strategy in ("split", "rows") if cpu_tn else ("auto",):
        monkeypatch.setenv("QTRAIN_GEMM_TN", strategy)
        for m, k, n in ((19, 5003, 70), (3, 70_001, 5), (40, 3000, 70)):
            qa, qb = operands(m, k, n, layout, make)
            row, col = _vectors("both", m, n, k)
            bias = torch.randn(n)
            _check(device, qa, qb, layout, 1e-4, bias, row_scale=row, col_scale=col)
            _check(device, qa, qb, layout, 1e-4, row_scale=row)
            _check(device, qa, qb, layout, 1e-4, bias, col_scale=col)


_SPECIAL = [0.0, -0.0, 1e-45, 1e-40, 1.2e-38, 7e-30, 1.0, -2.5, 3e-3, 6e35, 3e38, -3.4e38]


def _special(n: int, shift: int, nonfinite: bool) -> torch.Tensor:
    values = [*_SPECIAL, *([float("inf"), float("nan"), -float("inf")] if nonfinite else [])]
    return torch.tensor([values[(i + shift) % len(values)] for i in range(n)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_scale_vectors_edge_values(device: str, layout: str) -> None:
    """Zero (both signs), subnormal, tiny, huge, negative (and infinite, NaN) scales in the
    vectors, with zero, tiny and huge scalar scales: each product of f rounds (overflows to
    inf, underflows to a subnormal or zero) exactly as the reference's."""
    m, k, n = 19, 21, 35  # a partial last row tile and column vector
    qa, qb = operands(m, k, n, layout, int8s(5))
    qa[0] = 0  # zero sums: 0 * inf is NaN
    for nonfinite in (False, True):
        row, col = _special(m, 0, nonfinite), _special(n, 5, nonfinite)
        for scale in (0.0173, 0.0, -0.0, 1e-45, 3.0e38, -2.5):
            _check(device, qa, qb, layout, scale, row_scale=row, col_scale=col)
            _check(device, qa, qb, layout, scale, torch.randn(n), row_scale=row)
            _check(device, qa, qb, layout, scale, col_scale=col)


@pytest.mark.parametrize("device", DEVICES)
def test_scale_vectors_strided_and_absent(device: str) -> None:
    """Strided vectors; vectors of ones and absent vectors (None passed) give the per-tensor
    product bit for bit."""
    ops = library(device)
    for layout in LAYOUTS:
        m, k, n = 23, 45, 37
        qa, qb = operands(m, k, n, layout, int8s(11))
        row = _vector(2 * m, 1)[::2]
        col = _vector(3 * n, 2)[1::3]
        assert not row.is_contiguous() and not col.is_contiguous()
        _check(device, qa, qb, layout, SCALE, torch.randn(n), row_scale=row, col_scale=col)
        bias = torch.randn(n)
        want = int8_reference(qa, qb, SCALE, layout, bias)
        args = (qa.to(device), qb.to(device), SCALE, layout, bias.to(device))
        ones_m = torch.ones(m, device=device)
        ones_n = torch.ones(n, device=device)
        assert_same(ops.int8_gemm(*args, None, None), want, layout)
        assert_same(ops.int8_gemm(*args, ones_m, None), want, layout)
        assert_same(ops.int8_gemm(*args, None, ones_n), want, layout)
        assert_same(ops.int8_gemm(*args, ones_m, ones_n), want, layout)
        assert_same(ops.int8_gemm(*args, row_scale=ones_m, col_scale=ones_n), want, layout)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    qa, qb = operands(9, 13, 5, "nn", int8s(2))
    qa, qb = qa.to(device), qb.to(device)
    bias = torch.randn(5, device=device)
    for args in (
        (qa, qb, 0.5, "nn", None),
        (qa, qb.t().contiguous(), 0.25, "nt", bias),
        (qa.t(), qb, -1.5, "tn", None),
        (qa[:0], qb, 1.0, "nn", bias),
        (qa, qb, 0.5, "nn", None, torch.rand(9, device=device), None),
        (qa, qb, 0.5, "nn", bias, None, torch.rand(5, device=device)),
        (qa.t(), qb, -1.5, "tn", bias, torch.rand(9, device=device), torch.rand(5, device=device)),
        (qa[:0], qb, 1.0, "nn", bias, torch.rand(0, device=device), torch.rand(5, device=device)),
    ):
        opcheck(ops.int8_gemm.default, args)


# the other device of a device mismatch: meta next to the CPU, the CPU next to a GPU
_OTHER = "(torch.device('meta') if dev.type == 'cpu' else torch.device('cpu'))"
_QA = "torch.zeros(3, 4, dtype=torch.int8, device=dev)"
_QB = "torch.zeros(4, 5, dtype=torch.int8, device=dev)"


def _call(
    qa: str = _QA,
    qb: str = _QB,
    layout: str = "'nn'",
    bias: str = "None",
    row: str | None = None,
    col: str | None = None,
) -> str:
    if row is None and col is None:
        return f"ops.int8_gemm({qa}, {qb}, 1.0, {layout}, {bias})"
    return f"ops.int8_gemm({qa}, {qb}, 1.0, {layout}, {bias}, {row}, {col})"


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    cases = [
        ErrorCase(
            "layout", _call(layout="'tt'"), "ValueError", "layout must be one of 'nn', 'nt', 'tn'"
        ),
        ErrorCase("layout case", _call(layout="'NN'"), "ValueError", "layout must be one of"),
        ErrorCase(
            "qa float32", _call(qa=f"{_QA}.float()"), "TypeError", "qa must be int8, got float32"
        ),
        ErrorCase(
            "qb uint8",
            _call(qb=f"{_QB}.to(torch.uint8)"),
            "TypeError",
            "qb must be int8, got uint8",
        ),
        ErrorCase("qa 1-d", _call(qa=f"{_QA}[0]"), "ValueError", "qa must be 2-d"),
        ErrorCase("qb 3-d", _call(qb=f"{_QB}[None]"), "ValueError", "qb must be 2-d"),
        ErrorCase(
            "qa sparse",
            _call(qa="torch.eye(3, 4, device=dev).to(torch.int8).to_sparse()"),
            "ValueError",
            "qa must be a dense",
        ),
        ErrorCase("qb device", _call(qb=f"{_QB}.to({_OTHER})"), "ValueError", "qb is on"),
        ErrorCase("inner nn", _call(qb=f"{_QB}.t()"), "ValueError", "inner dimensions differ"),
        ErrorCase("inner nt", _call(layout="'nt'"), "ValueError", "inner dimensions differ"),
        ErrorCase("inner tn", _call(layout="'tn'"), "ValueError", "inner dimensions differ"),
        ErrorCase(
            "bias int32",
            _call(bias="torch.zeros(5, dtype=torch.int32, device=dev)"),
            "TypeError",
            "bias must be a floating-point",
        ),
        ErrorCase(
            "bias length",
            _call(bias="torch.zeros(4, device=dev)"),
            "ValueError",
            r"bias must have shape \(5,\)",
        ),
        ErrorCase(
            "bias 2-d",
            _call(bias="torch.zeros(1, 5, device=dev)"),
            "ValueError",
            r"bias must have shape \(5,\)",
        ),
        ErrorCase(
            "bias sparse",
            _call(bias="torch.zeros(5, device=dev).to_sparse()"),
            "ValueError",
            "bias must be a dense",
        ),
        ErrorCase(
            "bias device",
            _call(bias=f"torch.zeros(5, device={_OTHER})"),
            "ValueError",
            "bias is on",
        ),
        # row_scale (M = 3) and col_scale (N = 5): the reference's _check_scale_vector errors
        ErrorCase(
            "row_scale float64",
            _call(row="torch.ones(3, dtype=torch.float64, device=dev)"),
            "TypeError",
            "row_scale must be float32, got float64",
        ),
        ErrorCase(
            "col_scale float16",
            _call(col="torch.ones(5, dtype=torch.float16, device=dev)"),
            "TypeError",
            "col_scale must be float32, got float16",
        ),
        ErrorCase(
            "row_scale int32",
            _call(row="torch.ones(3, dtype=torch.int32, device=dev)", col="None"),
            "TypeError",
            "row_scale must be float32, got int32",
        ),
        ErrorCase(
            "row_scale length",
            _call(row="torch.ones(4, device=dev)"),
            "ValueError",
            r"row_scale must have shape \(3,\), got \[4\]",
        ),
        ErrorCase(
            "row_scale 2-d",
            _call(row="torch.ones(3, 1, device=dev)"),
            "ValueError",
            r"row_scale must have shape \(3,\), got \[3, 1\]",
        ),
        ErrorCase(
            "row_scale 0-d",
            _call(row="torch.ones((), device=dev)"),
            "ValueError",
            r"row_scale must have shape \(3,\), got \[\]",
        ),
        ErrorCase(
            "row_scale tn is M = qa.shape[1]",
            _call(
                qa="torch.zeros(4, 3, dtype=torch.int8, device=dev)",
                layout="'tn'",
                row="torch.ones(4, device=dev)",
            ),
            "ValueError",
            r"row_scale must have shape \(3,\), got \[4\]",
        ),
        ErrorCase(
            "col_scale length",
            _call(col="torch.ones(3, device=dev)"),
            "ValueError",
            r"col_scale must have shape \(5,\), got \[3\]",
        ),
        ErrorCase(
            "col_scale nt is N = qb.shape[0]",
            _call(
                qb="torch.zeros(5, 4, dtype=torch.int8, device=dev)",
                layout="'nt'",
                col="torch.ones(4, device=dev)",
            ),
            "ValueError",
            r"col_scale must have shape \(5,\), got \[4\]",
        ),
        ErrorCase(
            "col_scale 2-d",
            _call(col="torch.ones(1, 5, device=dev)"),
            "ValueError",
            r"col_scale must have shape \(5,\), got \[1, 5\]",
        ),
        ErrorCase(
            "row_scale device",
            _call(row=f"torch.ones(3, device={_OTHER})"),
            "ValueError",
            "row_scale is on .* but qa is on",
        ),
        ErrorCase(
            "col_scale device",
            _call(col=f"torch.ones(5, device={_OTHER})"),
            "ValueError",
            "col_scale is on .* but qa is on",
        ),
        ErrorCase(
            "row_scale sparse",
            _call(row="torch.ones(3, device=dev).to_sparse()"),
            "ValueError",
            "row_scale must be a dense",
        ),
        ErrorCase(
            "col_scale sparse",
            _call(col="torch.ones(5, device=dev).to_sparse()"),
            "ValueError",
            "col_scale must be a dense",
        ),
        ErrorCase(
            "row_scale checked after bias",
            _call(bias="torch.zeros(4, device=dev)", row="torch.ones(3, 1, device=dev)"),
            "ValueError",
            r"bias must have shape \(5,\)",
        ),
    ]
    if device == "cuda":  # the grid's y size: at most 65535 column blocks of 256
        cases.append(
            ErrorCase(
                "N beyond the CUDA grid",
                _call(
                    qa="torch.zeros(1, 0, dtype=torch.int8, device=dev)",
                    qb="torch.zeros(0, 65535 * 256 + 1, dtype=torch.int8, device=dev)",
                ),
                "ValueError",
                "too large for the CUDA kernel",
            )
        )
    expect_errors(cases, device)
