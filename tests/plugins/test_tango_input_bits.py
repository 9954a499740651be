"""tango's step inputs and weights at their own bit counts (``input_bits``, ``weight_bits``,
issue 32): the node features and what the model computes from them alone are quantized
at ``input_bits``, the parameters at ``weight_bits``, activations and gradients at
``bits``; an evaluation quantizes the features and weights as the steps did; a run
reports the counts and how many quantizations took each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.functions import quant_linear
from qtrain.plugins.tango.policy import COLUMNS, ROWS, QuantPolicy

import qtrain
from qtrain._compat import import_dgl
from qtrain.errors import RecipeError
from qtrain.ops import dispatch

dgl = import_dgl()


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _levels(q: torch.Tensor) -> int:
    """The largest magnitude an int8 quantization used: 2^(b-1) - 1 for b bits, rounded to
    nearest with one scale per row (each row's largest value takes the top level)."""
    return int(q.abs().max())


def _recorded_levels(policy: QuantPolicy) -> list[tuple[tuple[int, ...], int]]:
    """(shape, top level) of every quantization the policy makes from now on."""
    made: list[tuple[tuple[int, ...], int]] = []
    real = policy.fresh

    def fresh(
        t: torch.Tensor,
        constant: bool = False,
        by: str = "rows",
        bits: int | None = None,
        shifted: bool = False,
        packed: bool = False,
    ) -> Any:
        value = real(t, constant, by, bits, shifted, packed)
        q = policy.unpacked(value, policy.quantized_width(t, by))[0]  # int8, packed or not
        made.append((tuple(t.shape), _levels(q)))
        return value

    policy.fresh = fresh  # type: ignore[method-assign]
    return made


def test_a_step_input_takes_input_bits_and_the_rest_bits() -> None:
    torch.manual_seed(0)
    features = torch.randn(40, 12)  # a step input: no gradient flows to it
    w = torch.randn(6, 12, requires_grad=True)
    policy = QuantPolicy(bits=4, input_bits=8, rounding="nearest", scales="row")
    made = _recorded_levels(policy)
    y = quant_linear(policy, features, w, linear=True)
    hidden = torch.relu(y)  # an activation: it depends on the weight
    w2 = torch.randn(3, 6, requires_grad=True)
    quant_linear(policy, hidden, w2, linear=True).square().sum().backward()
    levels = dict(made)  # the shapes are distinct; a later entry would be a gradient's
    assert levels[(40, 12)] == 127  # the features, rows and columns
    assert levels[(6, 12)] == 7 and levels[(3, 6)] == 7  # weights
    assert levels[(40, 6)] == 7  # the activation forward, the gradient backward
    assert all(level == 7 for shape, level in made if shape == (40, 6))
    assert policy.step_inputs_quantized == 2  # the features' rows and columns


def test_an_evaluation_quantizes_the_features_as_the_steps_did() -> None:
    """Under no_grad every operand is a constant: the features the steps read keep
    input_bits, an activation computed in the evaluation takes bits."""
    torch.manual_seed(1)
    features = torch.randn(25, 10)
    w = torch.randn(4, 10, requires_grad=True)
    policy = QuantPolicy(bits=4, input_bits=8, rounding="nearest", scales="row", cache=None)
    quant_linear(policy, features, w, linear=True).sum().backward()  # a training step
    made = _recorded_levels(policy)
    with torch.no_grad():
        hidden = quant_linear(policy, features, w, linear=True)
        quant_linear(policy, hidden, torch.randn(3, 4), linear=True)
    assert made[0] == ((25, 10), 127)
    assert ((25, 4), 7) in made and ((4, 10), 7) in made


def test_an_evaluation_before_any_step_quantizes_everything_at_bits() -> None:
    """Nothing marks the features as a step input before a step records one."""
    torch.manual_seed(2)
    features = torch.randn(25, 10)
    policy = QuantPolicy(bits=4, input_bits=8, rounding="nearest", scales="row")
    with torch.no_grad():
        q, _ = policy.cached(features)
    assert _levels(q) == 7


@pytest.mark.parametrize("cache", [True, False])
def test_input_bits_equal_to_bits_changes_nothing(cache: bool) -> None:
    torch.manual_seed(3)
    features = torch.randn(30, 9)
    w = torch.randn(5, 9, requires_grad=True)
    grads = []
    for input_bits in (None, 4):
        policy = QuantPolicy(
            bits=4,
            input_bits=input_bits,
            scales="row",
            seed=7,
            cache=QuantCache() if cache else None,
        )
        y = quant_linear(policy, features, w, linear=True)
        (gw,) = torch.autograd.grad(y.square().sum(), w)
        grads.append((y.detach(), gw))
        assert policy.step_inputs_quantized == 0
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_the_cache_keeps_a_step_inputs_quantization_apart_from_bits() -> None:
    """The same tensor read as a step input and then (its bits remembered) again: one
    cache entry at input_bits per granularity, reused."""
    torch.manual_seed(4)
    features = torch.randn(20, 8)
    cache = QuantCache()
    policy = QuantPolicy(bits=4, input_bits=8, rounding="nearest", scales="row", cache=cache)
    first = policy.cached(features, recording=True, by=ROWS)
    again = policy.cached(features, recording=False, by=ROWS)
    assert first[0] is again[0] and _levels(first[0]) == 127
    columns = policy.cached(features, recording=True, by=COLUMNS)
    assert _levels(columns[0]) == 127
    assert cache.stats()["entries"] == 2


def test_graphconv_aggregating_first_keeps_its_scaled_input_at_input_bits() -> None:
    """GraphConv(norm="both") narrower than its output aggregates deg^-1/2 * X before the
    weight: that product of the features (its int8 copy made once) and its aggregate are
    step inputs in the steps; an evaluation reuses the copy, and its aggregate, computed
    in the evaluation, takes bits."""
    from dgl.nn import GraphConv

    torch.manual_seed(5)
    g = dgl.rand_graph(50, 260)
    conv = GraphConv(6, 32, norm="both", allow_zero_in_degree=True)
    x = torch.randn(g.num_nodes(), 6)
    with qtrain.patch(
        "tango", bits=4, input_bits=8, rounding="nearest", evaluation="quantized"
    ) as session:
        policy = session.plugins[0].policy
        made = _recorded_levels(policy)
        for _ in range(2):
            conv(g, x).square().sum().backward()
        steps = list(made)
        made.clear()
        with torch.no_grad():
            conv(g, x)
        report = session.report()["tango"]
    assert (report["bits"], report["input_bits"], report["weight_bits"]) == (4, 8, 8)
    # deg^-1/2 * X once, then each step the aggregate's rows and columns: all at 8 bits
    assert [level for shape, level in steps if shape == (50, 6)] == [127] * 5
    assert [level for shape, level in steps if shape == (6, 32)] == [127]  # W, once
    assert all(level == 7 for shape, level in steps if shape == (50, 32))  # the gradients
    assert made == [((50, 6), 7), ((6, 32), 127)]  # the aggregate's rows, the weight
    assert report["row_scaled_inputs"] == 3  # both steps and the evaluation reused the copy


def test_weights_take_weight_bits_in_steps_and_evaluations() -> None:
    torch.manual_seed(6)
    x = torch.randn(40, 12, requires_grad=True) * 1.0  # an activation: no leaf, a gradient
    w = torch.randn(6, 12, requires_grad=True)
    policy = QuantPolicy(bits=4, weight_bits=8, rounding="nearest", scales="row")
    made = _recorded_levels(policy)
    quant_linear(policy, x, w, linear=True).square().sum().backward()
    with torch.no_grad():
        quant_linear(policy, x.detach(), w, linear=True)
    levels = [level for shape, level in made if shape == (6, 12)]
    assert levels == [127, 127, 127]  # rows (forward), columns (dX), the evaluation's rows
    assert all(level == 7 for shape, level in made if shape != (6, 12))
    assert (policy.weights_quantized, policy.step_inputs_quantized) == (3, 0)


def test_a_run_reports_its_input_bits(tango_recipe: Callable[[str], Path]) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    summary = execute(load_recipe(tango_recipe("bits = 4"), []), reporter=Reporter())
    report = summary["plugin_reports"]["tango"]
    assert (report["bits"], report["input_bits"], report["weight_bits"]) == (4, 8, 8)
    assert report["step_inputs_quantized"] > 0 and report["weights_quantized"] > 0
    recipe = tango_recipe("bits = 4\ninput_bits = 4\nweight_bits = 4")
    report = execute(load_recipe(recipe, []), reporter=Reporter())["plugin_reports"]["tango"]
    assert (report["input_bits"], report["weight_bits"]) == (4, 4)
    assert (report["step_inputs_quantized"], report["weights_quantized"]) == (0, 0)


@pytest.mark.parametrize("option", ["input_bits", "weight_bits"])
@pytest.mark.parametrize("value", ["1", "9", '"8"', "4.5"])
def test_a_bit_count_out_of_range_is_refused(
    tango_recipe: Callable[[str], Path], option: str, value: str
) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match=option) as info:
        load_recipe(tango_recipe(f"{option} = {value}"), [])
    assert "\n" not in str(info.value)
