"""INT8 GEMM: the compiled kernel equals the reference bit for bit (all layouts, ISAs, threads)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import torch
from conftest import ext_or_skip

from qtrain.ops import dispatch
from qtrain.ops import quantize as quantize_op
from qtrain.ops.gemm import LAYOUTS, combined_scale, int8_gemm, reference_int8_gemm

Maker = Callable[[tuple[int, int]], torch.Tensor]

# (M, K, N): degenerate tiles, vector tails, K not a multiple of 4, several row blocks and panels
SHAPES = [
    (1, 1, 1),
    (1, 7, 1),
    (3, 1, 5),
    (5, 3, 17),
    (6, 4, 16),
    (7, 5, 33),
    (13, 17, 64),
    (17, 33, 65),
    (33, 127, 127),
    (129, 129, 129),
    (64, 250, 80),
]
EMPTY_SHAPES = [(0, 3, 4), (4, 0, 5), (5, 3, 0), (0, 0, 0), (3, 0, 1)]


@pytest.fixture
def isa_restored() -> Iterator[ModuleType]:
    """The extension, with its ISA variant restored after the test."""
    ext = ext_or_skip()
    previous = ext.info()["isa"]
    yield ext
    ext.set_isa(previous)


def _operands(
    m: int, k: int, n: int, layout: str, make: Maker
) -> tuple[torch.Tensor, torch.Tensor]:
    """qa, qb stored as ``layout`` asks for the product (M, K) @ (K, N)."""
    qa = make((k, m) if layout == "tn" else (m, k))
    qb = make((n, k) if layout == "nt" else (k, n))
    return qa, qb


def _rand(seed: int, low: int = -128, high: int = 128) -> Maker:
    g = torch.Generator().manual_seed(seed)
    return lambda shape: torch.randint(low, high, shape, generator=g, dtype=torch.int8)


def _reference(
    qa: torch.Tensor, qb: torch.Tensor, scale: float, layout: str, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference on one thread: a tiny float64 matmul on a busy machine otherwise waits
    milliseconds for its thread team (the result does not depend on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return reference_int8_gemm(qa, qb, scale, layout, bias)
    finally:
        torch.set_num_threads(before)


def _check(
    ext: ModuleType,
    qa: torch.Tensor,
    qb: torch.Tensor,
    layout: str,
    scale: float = 0.0173,
    bias: torch.Tensor | None = None,
) -> None:
    out = ext.int8_gemm(qa, qb, scale, layout, bias)
    ref = _reference(qa, qb, scale, layout, bias)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    # bit for bit, signed zeros included
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32)), (layout, tuple(ref.shape))


# ------------------------------------------------------------------ ext == reference


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ext_matches_reference_every_isa_and_thread_count(
    layout: str, isa_restored: ModuleType, threads: None
) -> None:
    ext = isa_restored
    for isa in ext.info()["isa_supported"]:
        ext.set_isa(isa)
        for nthreads in (1, 2):
            torch.set_num_threads(nthreads)
            make = _rand(100 * LAYOUTS.index(layout) + nthreads)
            for i, (m, k, n) in enumerate(SHAPES):
                qa, qb = _operands(m, k, n, layout, make)
                bias = torch.randn(n) if i % 2 else None
                _check(ext, qa, qb, layout, bias=bias)


@pytest.mark.parametrize("strategy", ["split", "rows"])
def test_ext_tn_both_strategies(
    strategy: str, isa_restored: ModuleType, threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both "tn" strategies (K split across threads, A^T packed per row block) are exact."""
    ext = isa_restored
    monkeypatch.setenv("QTRAIN_GEMM_TN", strategy)
    make = _rand(13)
    shapes = [*SHAPES, *EMPTY_SHAPES, (40, 3000, 70), (2, 70_001, 3)]
    for isa in ext.info()["isa_supported"]:
        ext.set_isa(isa)
        for nthreads in (1, 2):
            torch.set_num_threads(nthreads)
            for i, (m, k, n) in enumerate(shapes):
                qa, qb = _operands(m, k, n, "tn", make)
                _check(ext, qa, qb, "tn", bias=torch.randn(n) if i % 2 else None)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ext_long_inner_dimension(layout: str, isa_restored: ModuleType, threads: None) -> None:
    """K in the thousands: the split-K path of "tn" and many k-steps for "nn"/"nt"."""
    ext = isa_restored
    make = _rand(7)
    for isa in ext.info()["isa_supported"]:
        ext.set_isa(isa)
        for nthreads in (1, 2):
            torch.set_num_threads(nthreads)
            for m, k, n in ((19, 5003, 70), (128, 4100, 3), (2, 2049, 1)):
                qa, qb = _operands(m, k, n, layout, make)
                _check(ext, qa, qb, layout, bias=torch.randn(n))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ext_inner_dimension_beyond_int32_chunks(
    layout: str, isa_restored: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K > 65536 with all -128: partial sums go through int64 (a true sum of 2^31 and more)."""
    ext = isa_restored
    m, k, n = 2, 70_001, 3
    qa, qb = _operands(m, k, n, layout, lambda shape: torch.full(shape, -128, dtype=torch.int8))
    for strategy in ("split", "rows") if layout == "tn" else ("auto",):
        monkeypatch.setenv("QTRAIN_GEMM_TN", strategy)
        for isa in ext.info()["isa_supported"]:
            ext.set_isa(isa)
            _check(ext, qa, qb, layout, scale=1.0)
            assert ext.int8_gemm(qa, qb, 1.0, layout)[0, 0].item() == float(k * 128 * 128)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ext_empty_dimensions(layout: str, isa_restored: ModuleType) -> None:
    ext = isa_restored
    for isa in ext.info()["isa_supported"]:
        ext.set_isa(isa)
        for m, k, n in EMPTY_SHAPES:
            qa, qb = _operands(m, k, n, layout, _rand(1))
            _check(ext, qa, qb, layout)
            _check(ext, qa, qb, layout, bias=torch.randn(n))
            if m and n and not k:  # K = 0: zeros, plus bias
                bias = torch.randn(n)
                out = ext.int8_gemm(qa, qb, 0.5, layout, bias)
                assert torch.equal(out, bias.expand(m, n))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("value", [0, 1, -1, 127, -127, -128])
def test_ext_constant_and_extreme_operands(
    layout: str, value: int, isa_restored: ModuleType
) -> None:
    ext = isa_restored
    for isa in ext.info()["isa_supported"]:
        ext.set_isa(isa)
        for m, k, n in ((7, 33, 65), (1, 1, 1), (13, 130, 17)):
            const = lambda shape: torch.full(shape, value, dtype=torch.int8)  # noqa: E731
            qa, qb = _operands(m, k, n, layout, const)
            _check(ext, qa, qb, layout)
            # one operand at an extreme, the other random
            qa2, qb2 = _operands(m, k, n, layout, _rand(3))
            _check(ext, qa2, qb, layout, bias=torch.randn(n))
            _check(ext, qa, qb2, layout)
    # opposite extremes everywhere: the largest magnitudes the accumulator sees
    qa, qb = _operands(9, 257, 31, layout, lambda s: torch.full(s, -127, dtype=torch.int8))
    _check(ext, qa, -qb, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bits", range(2, 9))
def test_ext_on_quantized_float_data(layout: str, bits: int) -> None:
    """Operands as the training loop makes them: quantize() of random float data."""
    ext = ext_or_skip()
    g = torch.Generator().manual_seed(bits)
    m, k, n = 37, 65, 47
    xa = torch.randn((k, m) if layout == "tn" else (m, k), generator=g)
    xb = torch.randn((n, k) if layout == "nt" else (k, n), generator=g)
    for rounding in ("nearest", "stochastic"):
        qa, sa = quantize_op(xa, bits, rounding, seed=bits)
        qb, sb = quantize_op(xb, bits, rounding, seed=bits + 100)
        scale = combined_scale(sa, sb)
        _check(ext, qa, qb, layout, scale=scale, bias=torch.randn(n, generator=g))
        # and the dequantized product is close to the float product
        a = xa.t() if layout == "tn" else xa
        b = xb.t() if layout == "nt" else xb
        out = int8_gemm(qa, qb, sa, sb, layout)
        if bits == 8:
            assert torch.allclose(out, a @ b, atol=0.1 * k**0.5, rtol=0.05)


def test_ext_scale_edge_values(isa_restored: ModuleType) -> None:
    """Zero, negative, huge and non-finite scales follow the reference's float arithmetic."""
    ext = isa_restored
    qa, qb = _operands(5, 9, 19, "nn", _rand(5))
    for isa in ext.info()["isa_supported"]:
        ext.set_isa(isa)
        for scale in (0.0, -0.0, -2.5, 3.0e38, 1e-45, float("inf"), float("nan")):
            out = ext.int8_gemm(qa, qb, scale, "nn")
            ref = _reference(qa, qb, scale, "nn")
            assert torch.equal(out.view(torch.int32), ref.view(torch.int32)) or (
                torch.isnan(out).equal(torch.isnan(ref))
                and torch.equal(out.nan_to_num(0), ref.nan_to_num(0))
            )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ext_non_contiguous_inputs(layout: str) -> None:
    ext = ext_or_skip()
    make = _rand(11)
    m, k, n = 23, 45, 37
    qa, qb = _operands(m, k, n, layout, make)
    # transposed views and strided slices holding the same values
    qa_t = qa.t().contiguous().t()
    qb_s = torch.cat([qb, make(qb.shape)], dim=1)[:, : qb.shape[1]]
    assert not qa_t.is_contiguous() and not qb_s.is_contiguous()
    bias = torch.randn(2 * n)[::2]
    _check(ext, qa_t, qb_s, layout, bias=bias)
    # a float64 bias is taken as float32, as the reference does
    _check(ext, qa, qb, layout, bias=torch.randn(n, dtype=torch.float64))


# ------------------------------------------------------------------ dispatch and errors


def test_dispatch_countsext_or_skip() -> None:
    ext_or_skip()
    dispatch.reset()
    try:
        qa, qb = _operands(4, 5, 6, "nn", _rand(2))
        out = int8_gemm(qa, qb, torch.tensor(0.5), 0.25, "nn", bias=torch.zeros(6))
        ref = reference_int8_gemm(qa, qb, 0.125, "nn", torch.zeros(6))
        assert torch.equal(out, ref)
        int8_gemm(qa, qb, 1.0, 1.0, "nn", backend="reference")
        assert dispatch.snapshot() == {"gemm": {"ext-cpu": 1, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()


def test_ext_validates_arguments() -> None:
    ext = ext_or_skip()
    a = torch.zeros(3, 4, dtype=torch.int8)
    b = torch.zeros(4, 5, dtype=torch.int8)
    with pytest.raises(TypeError, match="qa must be int8"):
        ext.int8_gemm(a.float(), b, 1.0, "nn")
    with pytest.raises(TypeError, match="qb must be int8"):
        ext.int8_gemm(a, b.to(torch.uint8), 1.0, "nn")
    with pytest.raises(ValueError, match="2-d"):
        ext.int8_gemm(a[0], b, 1.0, "nn")
    with pytest.raises(ValueError, match="inner dimensions differ"):
        ext.int8_gemm(a, b, 1.0, "nt")
    with pytest.raises(ValueError, match="layout must be one of 'nn', 'nt', 'tn'"):
        ext.int8_gemm(a, b, 1.0, "tt")
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        ext.int8_gemm(a, b, 1.0, "nn", torch.zeros(4))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        ext.int8_gemm(a, b, 1.0, "nn", torch.zeros(1, 5))
    with pytest.raises(TypeError, match="bias must be a floating-point"):
        ext.int8_gemm(a, b, 1.0, "nn", torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown ISA"):
        ext.set_isa("avx512vnni2")


def test_wrapper_validates_arguments() -> None:
    a = torch.zeros(3, 4, dtype=torch.int8)
    b = torch.zeros(4, 5, dtype=torch.int8)
    with pytest.raises(TypeError, match="qa must be a 2-d int8"):
        int8_gemm(a.float(), b, 1.0, 1.0)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        int8_gemm(a, b, 1.0, 1.0, "tn")
    with pytest.raises(ValueError, match="layout must be one of"):
        int8_gemm(a, b, 1.0, 1.0, "NN")
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        int8_gemm(a, b, 1.0, 1.0, bias=torch.zeros(3))


def test_isa_names_report_vnni_sensibly(isa_restored: ModuleType) -> None:
    ext = isa_restored
    info = ext.info()
    assert info["isa_compiled"][0] == "avx512vnni" or info["isa_compiled"] == ["default"]
    assert info["isa_best"] == info["isa_supported"][0]
    for isa in info["isa_supported"]:
        ext.set_isa(isa)
        assert ext.info()["isa"] == isa
