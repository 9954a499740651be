"""tango with a Hadamard rotation of each GEMM's summed dimension (``rotation = B``, issue
32): the products are the per-row quantized products of the rotated operands, the
rotation spreads an outlier feature, shorter dimensions take a smaller block, and the
recipe refuses a rotation without row scales in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.functions import RowQuantLinear, quant_linear
from qtrain.plugins.tango.policy import ROTATED_COLUMNS, ROTATED_ROWS, QuantPolicy

from qtrain.errors import RecipeError
from qtrain.ops import dispatch
from qtrain.ops.rotate import hadamard_rotate
from qtrain.quant.granular import quantize_rows_symmetric


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _rotated_rows(t: torch.Tensor, bits: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference for one operand: t's last dimension rotated, one scale per row."""
    return quantize_rows_symmetric(hadamard_rotate(t.detach(), block).contiguous(), bits)


def _nt(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The int8 product A @ B^T with A's and B's row scales, as int8_gemm defines it."""
    acc = (a[0].to(torch.float64) @ b[0].to(torch.float64).t()).to(torch.float32)
    return acc * (a[1] * b[1].reshape(1, -1))


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("linear", [True, False])
def test_rotated_linear_is_the_product_of_rotated_per_row_quantizations(
    linear: bool, cache: bool
) -> None:
    """Forward, dX and dW each equal the int8 product of the per-row quantizations of both
    operands rotated along the dimension the product sums over (round to nearest: no
    stream to replay). Odd sizes: every rotated dimension is padded."""
    torch.manual_seed(0)
    bits, block = 4, 8
    x = torch.randn(30, 13, requires_grad=True)
    w = torch.randn(7, 13) if linear else torch.randn(13, 7)
    w.requires_grad_(True)
    b = torch.randn(7, requires_grad=True)
    policy = QuantPolicy(
        bits=bits,
        rounding="nearest",
        scales="row",
        rotation=block,
        cache=QuantCache() if cache else None,
    )
    y = quant_linear(policy, x, w, b, linear=linear)
    g = torch.randn(30, 7)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), g)
    w_nk = w if linear else w.t()  # [7, 13]: a row per output feature
    assert torch.equal(y, _nt(_rotated_rows(x, bits, 8), _rotated_rows(w_nk, bits, 8)) + b)
    # dX sums over the 7 output features: a block of 8 covers them
    assert torch.equal(dx, _nt(_rotated_rows(g, bits, 8), _rotated_rows(w_nk.t(), bits, 8)))
    dw_nk = _nt(_rotated_rows(g.t(), bits, 8), _rotated_rows(x.t(), bits, 8))  # sums over 30
    assert torch.equal(dw, dw_nk if linear else dw_nk.t())
    assert torch.equal(db, g.sum(0))
    assert sum(dispatch.snapshot()["gemm"].values()) == 3
    assert sum(dispatch.snapshot()["hadamard_rotate"].values()) >= 6


def test_rotation_without_quantization_error_is_the_plain_product() -> None:
    """At 8 bits the rotated product is the float product within 8-bit error, in all
    three passes, for a block wider than some dimensions and narrower than others."""
    torch.manual_seed(1)
    x = torch.randn(100, 70, requires_grad=True)
    w = torch.randn(40, 70, requires_grad=True)
    policy = QuantPolicy(bits=8, rounding="nearest", scales="row", rotation=32)
    y = quant_linear(policy, x, w, linear=True)
    g = torch.randn(100, 40)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    want = x @ w.t()
    want_dx, want_dw = torch.autograd.grad(want, (x, w), g)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    y, want = y.detach(), want.detach()
    assert rel(y, want) < 0.02 and rel(dx, want_dx) < 0.02 and rel(dw, want_dw) < 0.02


def test_rotation_spreads_an_outlier_feature() -> None:
    """One feature 10x the others sets each row's 4-bit scale, so the other features get
    steps as large as themselves; rotated, the outlier is shared by its block, each row's
    largest value (so its step) shrinks, and the product loses far less."""
    torch.manual_seed(2)
    x = torch.randn(256, 64)
    x[:, 5] *= 10.0
    w = torch.randn(32, 64)
    want = x @ w.t()
    errors = {}
    for rotation in (0, 32):
        policy = QuantPolicy(bits=4, rounding="nearest", scales="row", rotation=rotation)
        y = quant_linear(policy, x, w, linear=True)
        errors[rotation] = float((y - want).norm() / want.norm())
    assert errors[32] * 1.5 < errors[0], errors  # measured 0.15 against 0.27


def test_a_short_dimension_takes_a_smaller_block() -> None:
    policy = QuantPolicy(rotation=32)
    assert [policy.rotation_block(n) for n in (0, 1, 2, 7, 8, 9, 32, 33, 1000)] == [
        1,
        1,
        2,
        8,
        8,
        16,
        32,
        32,
        32,
    ]
    x = torch.randn(10, 7)
    q, scale = policy.fresh(x, True, ROTATED_ROWS)
    assert q.shape == (10, 8) and scale.shape == (10, 1)
    q, scale = policy.fresh(x, True, ROTATED_COLUMNS)
    assert q.shape == (7, 16) and scale.shape == (7, 1)


def test_stochastic_rounding_takes_the_padded_count_of_counters() -> None:
    """A rotated operand quantizes its padded shape: the stream moves by that many
    counters, so the next tensor's draws do not overlap it."""
    policy = QuantPolicy(bits=4, scales="row", rotation=16, cache=None)
    policy.fresh(torch.randn(10, 20), False, ROTATED_ROWS)
    assert policy._offset == 10 * 32


def test_a_non_finite_gradient_runs_the_float32_backward() -> None:
    """NaN in the incoming gradient: the backward runs in float32 (the rotated X the
    forward kept rotated back), and the gradients are float32's."""
    torch.manual_seed(3)
    x = torch.randn(20, 11, requires_grad=True)
    w = torch.randn(5, 11, requires_grad=True)
    told: list[tuple[str, str]] = []
    policy = QuantPolicy(
        bits=8, scales="row", rotation=8, on_fp32=lambda p, why: told.append((p, why))
    )
    y = RowQuantLinear.apply(policy, x, w, None, True, True)
    g = torch.randn(20, 5)
    g[3, 1] = float("nan")
    dx, dw = torch.autograd.grad(y, (x, w), g)
    assert told == [("gemm", "gradient not finite")]
    want_dx, want_dw = g @ w.detach(), g.t() @ x.detach()
    assert torch.equal(dx.isnan(), want_dx.isnan()) and torch.equal(dw.isnan(), want_dw.isnan())
    finite = ~want_dw.isnan().any(1)  # output feature 1 took the NaN
    assert finite.sum() == 4
    # the forward kept X rotated and at 8 bits: its float32 backward is within that error
    assert torch.allclose(
        dw[finite], want_dw[finite], rtol=0.02, atol=0.02 * float(want_dw[finite].abs().max())
    )
    assert torch.allclose(dx[~dx.isnan()], want_dx[~want_dx.isnan()])


def test_a_run_with_a_rotation_reports_it_and_runs_the_kernels(
    tango_recipe: Callable[[str], Path],
) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    recipe = load_recipe(tango_recipe("bits = 4\nrotation = 16"), [])
    summary = execute(recipe, reporter=Reporter())
    report = summary["plugin_reports"]["tango"]
    assert (report["scales"], report["rotation"]) == ("row", 16)
    kernels = summary["kernels"]
    for name in ("gemm", "spmm", "quantize_rows", "hadamard_rotate"):
        assert kernels[name].get("ext-cpu", 0) > 0, kernels


@pytest.mark.parametrize("rotation", ["12", "3", "true", '"16"', "512"])
def test_a_rotation_that_is_not_a_block_is_refused(
    tango_recipe: Callable[[str], Path], rotation: str
) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match="rotation") as info:
        load_recipe(tango_recipe(f"rotation = {rotation}"), [])
    assert "\n" not in str(info.value)


def test_a_rotation_with_one_scale_per_tensor_is_refused(
    tango_recipe: Callable[[str], Path],
) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match="rotation = 16 needs one scale per row") as info:
        load_recipe(tango_recipe('rotation = 16\nscales = "tensor"'), [])
    assert "\n" not in str(info.value)


def test_calibration_measures_the_rotated_quantization() -> None:
    """bits = "auto" with a rotation: Error_X of x against its rotated, per-row quantized,
    rotated-back self (the operand the run's rotated GEMM reads), odd width padded."""
    from qtrain.plugins.tango.calibrate import error_x_by_bits

    from qtrain.ops.quantize import quantize_per_row
    from qtrain.quant.quantize import dequantize, error_x

    torch.manual_seed(5)
    x = torch.randn(50, 21)
    x[:, 3] *= 30.0
    rotated = error_x_by_bits(x, "nearest", 0, "auto", 16)
    for bits in (2, 4, 8):
        q, scale = quantize_per_row(hadamard_rotate(x, 16), bits)
        back = hadamard_rotate(dequantize(q, scale), 16)[:, :21]
        assert rotated[bits] == error_x(x, back)
    assert rotated != error_x_by_bits(x, "nearest", 0, "row")
