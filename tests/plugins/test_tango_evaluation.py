"""tango's evaluations (``evaluation``, issue 32): by default a forward that records no
gradient runs DGL's float32 primitives on the float32 weights (the accuracy of the model
training made); ``"quantized"`` runs it at the training bit count. DGL's own backward
passes, which call the primitives with grad mode off, stay quantized either way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dgl
import pytest
import torch
from qtrain.plugins.tango import EVALUATION, payoff

import qtrain
from qtrain.ops import dispatch


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _model() -> tuple[Any, Any, Any, torch.Tensor]:
    from dgl.nn import GATConv, GraphConv

    torch.manual_seed(0)
    g = dgl.rand_graph(60, 400)
    conv = GraphConv(8, 12, norm="both", allow_zero_in_degree=True)
    gat = GATConv(12, 5, num_heads=3, allow_zero_in_degree=True)
    return g, conv, gat, torch.randn(60, 8)


def _evaluations(report: dict[str, Any]) -> int:
    return sum(n for key, n in report["fp32_calls"].items() if key.endswith(EVALUATION))


@pytest.mark.parametrize("evaluation", ["fp32", "quantized"])
def test_an_evaluation_runs_as_configured_and_a_step_stays_quantized(evaluation: str) -> None:
    g, conv, gat, x = _model()
    with torch.no_grad():
        want = gat(g, conv(g, x).relu())
    with qtrain.patch("tango", bits=2, evaluation=evaluation, seed=1) as session:
        before = dispatch.snapshot()
        gat(g, conv(g, x).relu()).square().sum().backward()  # a step: DGL's backward inside
        step = dispatch.snapshot()
        assert _evaluations(session.report()["tango"]) == 0
        with torch.no_grad():
            got = gat(g, conv(g, x).relu())
        report = session.report()["tango"]
        after = dispatch.snapshot()
    assert report["evaluation"] == evaluation
    for primitive in ("gemm", "spmm"):  # the step's calls are quantized either way
        assert step[primitive].get("ext-cpu", 0) > before.get(primitive, {}).get("ext-cpu", 0)
    if evaluation == "fp32":
        assert torch.equal(got, want)
        assert _evaluations(report) > 0
        for primitive in ("gemm", "spmm", "sddmm"):
            assert after[primitive].get("ext-cpu", 0) == step[primitive].get("ext-cpu", 0)
    else:
        assert not torch.equal(got, want)
        assert _evaluations(report) == 0


def test_a_run_reports_its_evaluation(tango_recipe: Callable[..., Path]) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    summary = execute(load_recipe(tango_recipe("bits = 4"), []), reporter=Reporter())
    report = summary["plugin_reports"]["tango"]
    assert report["evaluation"] == "fp32" and _evaluations(report) > 0
    assert summary["kernels"]["gemm"].get("ext-cpu", 0) > 0
    assert summary["test_acc"] is not None


def test_a_bad_evaluation_is_refused(tango_recipe: Callable[..., Path]) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(Exception, match="evaluation"):
        load_recipe(tango_recipe('evaluation = "int8"'), [])


class _SumThenSumBack(torch.autograd.Function):
    """A user's Function whose backward calls a DGL primitive (grad mode is off there)."""

    @staticmethod
    def forward(ctx: Any, g: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.g = g
        return x * 2.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return None, dgl.ops.copy_u_sum(dgl.reverse(ctx.g), grad)


def test_a_primitive_called_inside_a_backward_is_no_evaluation() -> None:
    g, _, _, x = _model()
    x = x.requires_grad_(True)
    with qtrain.patch("tango", bits=4) as session:
        _SumThenSumBack.apply(g, x * 1.0).square().sum().backward()
        report = session.report()["tango"]
    assert _evaluations(report) == 0
    assert dispatch.snapshot()["spmm"].get("ext-cpu", 0) == 1
