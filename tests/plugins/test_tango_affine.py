"""tango's affine levels for signed activations (``affine``, issue 32): at 3 bits or fewer a
signed operand that a GEMM or SpMM reads by rows is quantized as ``x - m`` on the unsigned
levels (``m`` its row's minimum), and the product adds m's share, so it computes what the
dequantized operands make. Checked against a pure-PyTorch reference (the row quantizer of
``qtrain.quant.granular`` and float32 products) on random, power-law, empty and zero-degree
graphs, 2-d and 3-d (per head) operands, with the cache on and off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.functions import QuantSpMM, quant_linear
from qtrain.plugins.tango.policy import (
    COLUMNS,
    ROTATED_ROWS,
    ROWS,
    NonFiniteOperand,
    QuantPolicy,
)

from qtrain.ops import dispatch
from qtrain.ops.graph import GraphCSR, build_csr
from qtrain.quant.granular import quantize_rows_symmetric


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _policy(bits: int = 2, **kwargs: object) -> QuantPolicy:
    settings: dict = {"rounding": "nearest", "scales": "row", "unsigned": True, "affine": True}
    settings["weight_bits"] = 8
    settings.update(kwargs)
    return QuantPolicy(bits=bits, **settings)


def _rows_dequantized(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x quantized with one symmetric scale per row of its last dimension (per node and
    head for 3-d x), dequantized."""
    q, s = quantize_rows_symmetric(x.detach().reshape(-1, x.shape[-1]).contiguous(), bits)
    return (q.to(torch.float32) * s).reshape(x.shape)


def _affine(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The reference: x - m (m each row's minimum) on the unsigned levels of ``bits`` (the
    symmetric ones of bits + 1), plus m."""
    low = x.detach().amin(-1, keepdim=True)
    return _rows_dequantized(x.detach() - low, bits + 1) + low


def _activation(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(leaf, activation): a signed tensor computed from a leaf (not a weight)."""
    leaf = torch.randn(*shape, requires_grad=True)
    return leaf, leaf * 1.0


@pytest.mark.parametrize("bits", [2, 3])
@pytest.mark.parametrize("shape", [(30, 17), (12, 3, 5), (7, 1)])
def test_a_signed_activation_takes_levels_from_its_row_minimum(
    bits: int, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(bits)
    x = torch.randn(*shape)
    policy = _policy(bits)
    value = policy.fresh(x, by=ROWS, shifted=True)
    q, s = value
    assert value.shift is not None and torch.equal(value.shift, x.amin(-1, keepdim=True))
    assert int(q.min()) >= 0 and int(q.max()) <= 2**bits - 1
    torch.testing.assert_close(q * s + value.shift, _affine(x, bits))
    assert policy.affine_quantized == 1
    if shape[-1] > 1:  # a row of one value is its own minimum, exactly
        symmetric = policy.fresh(x, by=ROWS)
        assert symmetric.shift is None
        error = float((q * s + value.shift - x).norm())
        assert error < 0.8 * float((symmetric[0] * symmetric[1] - x).norm())


def test_a_constant_row_is_kept_exactly() -> None:
    x = torch.randn(6, 9)
    x[2] = -2.5
    x[4] = 0.0
    value = _policy().fresh(x, by=ROWS, shifted=True)
    got = value[0] * value[1] + value.shift
    assert torch.equal(got[2], x[2]) and torch.equal(got[4], x[4])


def test_what_keeps_the_symmetric_or_unsigned_levels() -> None:
    """4 bits, affine = false, a weight, a gradient, columns, a rotated row and a
    nonnegative tensor take no zero point; nor does an operand whose product does not
    ask for one (``shifted`` false)."""
    torch.manual_seed(1)
    x = torch.randn(20, 8)
    assert _policy(4).fresh(x, by=ROWS, shifted=True).shift is None
    assert _policy(affine=False).fresh(x, by=ROWS, shifted=True).shift is None
    weight = torch.randn(20, 8, requires_grad=True)
    assert _policy().fresh(weight, by=ROWS, shifted=True).shift is None
    assert _policy().gradient(x).shift is None
    assert _policy().fresh(x, by=COLUMNS, shifted=True).shift is None
    rotated = _policy(rotation=8).fresh(x, by=ROTATED_ROWS, shifted=True)
    assert rotated.shift is None
    relu = x.clamp(min=0)
    policy = _policy()
    value = policy.fresh(relu, by=ROWS, shifted=True)
    assert value.shift is None and policy.unsigned_quantized == 1
    assert policy.affine_quantized == 0
    assert _policy().fresh(torch.zeros(4, 0), by=ROWS, shifted=True).shift is None


def test_a_nan_is_refused_as_without_affine_levels() -> None:
    x = torch.randn(5, 6)
    x[3, 2] = float("nan")
    with pytest.raises(NonFiniteOperand):
        _policy().fresh(x, by=ROWS, shifted=True)


def test_packing_and_the_cache_keep_the_zero_points() -> None:
    """Packed rows carry the zero points and unpack to the int8 values; a GEMM and an SpMM
    reading one activation share one quantization, an SDDMM (no correction) makes its own."""
    torch.manual_seed(2)
    policy = _policy(packed=True, cache=QuantCache())
    _, x = _activation(15, 9)
    packed = policy.cached(x, True, ROWS, packed=True, shifted=True)
    assert packed[0].dtype == torch.uint8 and packed.shift is not None
    rows = policy.cached(x, True, ROWS, shifted=True)  # the int8 form, from the packed one
    unpacked = policy.unpacked(packed, 9)
    assert torch.equal(rows[0], unpacked[0]) and torch.equal(rows.shift, unpacked.shift)
    assert policy.affine_quantized == 1  # one quantization, two forms
    assert torch.equal(policy.cached(x, True, ROWS, packed=True, shifted=True)[0], packed[0])
    plain = policy.cached(x, True, ROWS)
    assert plain.shift is None and policy.affine_quantized == 1
    assert set(plain[0].unique().tolist()) <= {-1, 0, 1}


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("linear", [True, False])
@pytest.mark.parametrize("bits", [2, 3])
def test_a_gemm_of_an_affine_operand_is_the_dequantized_product(
    bits: int, linear: bool, cache: bool
) -> None:
    """Forward: X's affine levels times W at weight_bits (8, one scale per row of what the
    product reads), plus the bias. dX reads no X: the same as without affine levels."""
    torch.manual_seed(3)
    leaf, x = _activation(41, 13)
    w = (torch.randn(7, 13) if linear else torch.randn(13, 7)).requires_grad_(True)
    bias = torch.randn(7)
    g = torch.randn(41, 7)
    results = {}
    for affine in (True, False):
        policy = _policy(bits, affine=affine, cache=QuantCache() if cache else None)
        x = leaf * 1.0
        y = quant_linear(policy, x, w, bias, linear=linear)
        results[affine] = (y, *torch.autograd.grad(y, (leaf, w), g))
        assert (policy.affine_quantized > 0) == affine
    w_rows = w.detach() if linear else w.detach().t()
    want = _affine(x, bits) @ _rows_dequantized(w_rows, 8).t() + bias
    torch.testing.assert_close(results[True][0], want, rtol=1e-5, atol=1e-4)
    assert torch.equal(results[True][1], results[False][1])  # dX = dY W
    assert torch.isfinite(results[True][2]).all()


def _graph(kind: str) -> tuple[GraphCSR, torch.Tensor, torch.Tensor, int]:
    torch.manual_seed(4)
    if kind == "power-law":  # hubs: a few nodes take most edges
        n = 60
        dst = torch.multinomial(torch.arange(1, n + 1.0) ** -1.5, 400, replacement=True)
        src = torch.randint(0, n, (400,))
    elif kind == "empty":
        n, src, dst = 20, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    else:  # zero-degree: half the nodes receive nothing
        n, src, dst = 40, torch.randint(0, 40, (150,)), torch.randint(0, 20, (150,))
    return build_csr(src, dst, n, n), src, dst, n


@pytest.mark.parametrize("kind", ["power-law", "empty", "zero-degree"])
@pytest.mark.parametrize("heads", [0, 3])
@pytest.mark.parametrize("bits", [2, 3])
def test_an_spmm_of_an_affine_operand_is_the_dequantized_sum(
    kind: str, heads: int, bits: int
) -> None:
    """Forward: each destination's edge-weighted sum of the affine rows; the weights'
    gradient: each edge's dot of its source's affine row with its destination's gradient
    row (symmetric levels); dX: the transposed sum of the gradient, as without affine."""
    csr, src, dst, n = _graph(kind)
    feature = (heads, 5) if heads else (11,)
    leaf, x = _activation(n, *feature)
    weight = torch.rand(src.numel(), *((heads, 1) if heads else (1,)), requires_grad=True)
    g = torch.randn(n, *feature)
    results = {}
    for affine in (True, False):
        policy = _policy(bits, affine=affine)
        x = leaf * 1.0
        out = QuantSpMM.apply(policy, csr, x, weight, True)
        results[affine] = (out, *torch.autograd.grad(out, (leaf, weight), g))
    x_hat = _affine(x, bits)
    want = torch.zeros(n, *feature).index_add_(0, dst, x_hat[src] * weight.detach())
    torch.testing.assert_close(results[True][0], want, rtol=1e-5, atol=1e-4)
    assert torch.equal(results[True][1], results[False][1])
    g_hat = _rows_dequantized(g, bits)
    dw = (x_hat[src] * g_hat[dst]).sum(-1, keepdim=True)
    torch.testing.assert_close(results[True][2], dw, rtol=1e-5, atol=1e-4)


def test_a_nan_gradient_reads_the_affine_rows_in_float32() -> None:
    """The float32 backward (a gradient holding NaN) takes x with its zero points: the
    weights' gradient of the edges whose destination gradient is finite is the float
    dot of the affine rows."""
    csr, src, dst, n = _graph("power-law")
    _, x = _activation(n, 3, 5)
    weight = torch.rand(src.numel(), 3, 1, requires_grad=True)
    fallbacks: list[tuple[str, str]] = []
    policy = _policy(2, on_fp32=lambda primitive, why: fallbacks.append((primitive, why)))
    out = QuantSpMM.apply(policy, csr, x, weight, True)
    g = torch.randn(n, 3, 5)
    g[dst[0]] = float("nan")
    (dw,) = torch.autograd.grad(out, (weight,), g)
    want = (_affine(x, 2)[src] * g[dst]).sum(-1, keepdim=True)
    finite = torch.isfinite(want)
    assert fallbacks and fallbacks[0][0] == "spmm" and not finite.all()
    torch.testing.assert_close(dw[finite], want[finite])


@pytest.mark.parametrize("bits", [2, 4])
def test_a_gat_run_reports_its_affine_levels(tango_recipe: Callable[..., Path], bits: int) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    recipe = load_recipe(tango_recipe(f"bits = {bits}", model="gat"), ["model.layers=3"])
    summary = execute(recipe, reporter=Reporter())
    report = summary["plugin_reports"]["tango"]
    assert report["affine"] is True
    assert (report["affine_quantized"] > 0) == (bits == 2), report
    assert summary["kernels"]["spmm"].get("ext-cpu", 0) > 0


def test_a_bad_affine_value_is_refused(tango_recipe: Callable[..., Path]) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(Exception, match="affine"):
        load_recipe(tango_recipe('affine = "yes"'), [])


def test_calibration_measures_the_affine_levels_the_run_uses() -> None:
    """Error_X of a signed first-layer output at 2 and 3 bits is that of its affine levels
    (the reference's), and from 4 bits on what it is without them."""
    from qtrain.plugins.tango.calibrate import error_x_by_bits

    from qtrain.quant.quantize import error_x

    torch.manual_seed(6)
    x = torch.randn(400, 24) + 0.5
    on = error_x_by_bits(x, "nearest", 0, "block", unsigned=True, affine=True)
    off = error_x_by_bits(x, "nearest", 0, "block", unsigned=True, affine=False)
    for bits in (2, 3):
        assert on[bits] == pytest.approx(error_x(x, _affine(x, bits)), rel=1e-6)
    assert all(on[b] == off[b] for b in range(4, 9))
