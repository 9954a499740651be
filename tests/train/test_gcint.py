"""``train.numerics = "gcint"``: the integer GCN's backward against float autograd on the
same int8 operands, its update, the recipe's refusals, and a short run that learns with
integer products only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qtrain.errors import RecipeError
from qtrain.models.integer_gcn import (
    IntegerGCN,
    IntegerGraph,
    IntegerSGD,
    integer_features,
    output_error,
)
from qtrain.ops import integer
from qtrain.recipe import build_recipe
from qtrain.runner import execute
from qtrain.train.progress import Reporter


def _graph(nodes: int, edges: int, seed: int) -> IntegerGraph:
    """A random directed graph with self-loops and GCN's weights (not symmetric: A and
    A^T differ, so a transpose mistake shows)."""
    import dgl

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    return IntegerGraph.of(dgl.add_self_loop(dgl.graph((src, dst), num_nodes=nodes)))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def _step(seed: int) -> tuple[Any, ...]:
    torch.manual_seed(seed)
    graph = _graph(60, 200, seed + 1)
    x = integer_features(torch.rand(60, 24))
    model = IntegerGCN([torch.randn(24, 16), torch.randn(16, 5)], 0.0, 0.0)
    logits, saved = model(graph, x, train=True)
    error = output_error(logits, torch.randint(0, 5, (60,)), torch.arange(0, 60, 2))
    return graph, model, saved, error


def _autograd(graph: IntegerGraph, model: IntegerGCN, saved: Any, error: torch.Tensor):
    """Float64 autograd of the step whose output error is ``error``, through the saved
    inputs: the window between the layers passes the error on as the identity would (its
    scale aside), the ReLU where the hidden output is positive."""
    a = torch.zeros(graph.num_nodes, graph.num_nodes, dtype=torch.float64)
    a.index_put_((graph.dst, graph.src), graph.values.double(), accumulate=True)
    w = [q.double().requires_grad_() for q in model.int8_weights()]
    pre = a @ (saved.inputs[0].double() @ w[0])
    hidden = saved.inputs[1].double().requires_grad_()
    (a @ (hidden @ w[1]) * error.double()).sum().backward()  # d(out . E) / dW
    (pre * hidden.grad * saved.positive[0]).sum().backward()
    return [wi.grad for wi in w]


def test_backward_is_the_chain_rule_without_the_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the windows taken out (StQ and DyQ the identity, the products exact in int64)
    the integer backward is float autograd exactly: the transposes, the ReLU mask and the
    operand order of equations 8 and 9 are right."""
    graph, model, saved, error = _step(0)
    monkeypatch.setattr(integer, "stq", lambda x: x)
    monkeypatch.setattr(integer, "dyq", lambda x: (x, 0))
    monkeypatch.setattr(integer, "int_gemm", lambda a, b: a.to(torch.int64) @ b.to(torch.int64))
    exact = graph.__class__(graph.src, graph.dst, graph.values, graph.num_nodes)
    monkeypatch.setattr(
        type(exact),
        "spmm_transposed",
        lambda self, x: torch.zeros(self.num_nodes, x.shape[1], dtype=torch.int64).index_add_(
            0, self.src, self.values.to(torch.int64)[:, None] * x.to(torch.int64)[self.dst]
        ),
    )
    grads = model.backward(exact, saved, error)
    expected = _autograd(graph, model, saved, error)
    for got, want in zip(grads, expected, strict=True):
        assert torch.equal(got.double(), want)


@pytest.mark.parametrize("seed", range(3))
def test_backward_with_its_windows_points_where_autograd_points(seed: int) -> None:
    """With StQ and DyQ, the int8 gradients keep autograd's direction (StQ saturates the
    largest errors and DyQ rounds the smallest gradients away, by design)."""
    graph, model, saved, error = _step(seed)
    grads = model.backward(graph, saved, error)
    expected = _autograd(graph, model, saved, error)
    assert all(g.dtype == torch.int8 for g in grads)
    for got, want in zip(grads, expected, strict=True):
        assert _cosine(got, want) > 0.8


def test_output_error_is_logits_minus_127_onehot_on_training_rows() -> None:
    logits = torch.tensor([[100, -20], [5, 127], [-127, 0]], dtype=torch.int8)
    error = output_error(logits, torch.tensor([0, 1, 0]), torch.tensor([0, 2]))
    # row 2: -127 - 127 saturates at -127; row 1 is not a training row
    assert error.tolist() == [[-27, -20], [0, 0], [-127, 0]]


def test_integer_sgd_moves_master_weights_by_the_shifted_gradient() -> None:
    model = IntegerGCN([torch.ones(2, 2)], 0.0, 0.0)
    before = model.master(0).clone()
    assert before.max() == 127 << 8
    IntegerSGD(model, 3).step([torch.tensor([[1, -2], [0, 127]], dtype=torch.int8)])
    assert (before - model.master(0)).tolist() == [[8, -16], [0, 1016]]
    with pytest.raises(ValueError, match="saved with gcint_lr_shift = 2, this one has 3"):
        IntegerSGD(model, 3).load_state_dict({"lr_shift": 2})


def _recipe(tmp_path: Path, **train: Any) -> Any:
    raw = {
        "model": {"name": "gcn", "hidden": 16},
        "dataset": {"name": "synthetic-small", "nodes": 400},
        "train": {"epochs": 60, "numerics": "gcint", **train},
        "output": {"dir": str(tmp_path / "runs")},
    }
    return raw


@pytest.mark.parametrize("quantizer", ["dyq", "stq"])
def test_a_gcint_run_learns_with_integer_products_only(tmp_path: Path, quantizer: str) -> None:
    summary = execute(
        build_recipe(_recipe(tmp_path, gcint_quantizer=quantizer), "gcint"), reporter=Reporter()
    )
    assert summary["status"] == "completed" and summary["numerics"] == "gcint"
    # every product of the run was an integer one (no float GEMM or SpMM counted)
    assert set(summary["kernels"]) == {"int_gemm", "int_spmm", "requantize"}
    # 2 layers: 4 GEMMs per training step (forward 2, backward 2 + 1 for the error) ...
    assert summary["kernels"]["int_gemm"]["torch._int_mm"] >= 60 * 5
    chance = 1 / 4  # synthetic-small: 4 classes
    assert summary["test_acc"] > chance + 0.25
    assert summary["activation_bytes"] > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"name": "gat"}}, "trains model 'gcn' only .* not 'gat'"),
        ({"quant": {"plugin": ["tango"]}}, r"remove quant.plugin = \['tango'\]"),
        ({"distributed": {"world_size": 2}}, "set distributed.world_size = 1"),
        ({"train": {"mode": "minibatch"}}, "trains full-graph only so far; use mode = 'full'"),
        ({"train": {"gcint_quantizer": "log"}}, "gcint_quantizer"),
        ({"train": {"gcint_lr_shift": 17}}, "gcint_lr_shift"),
    ],
)
def test_the_recipe_refuses_what_gcint_cannot_train(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    raw = _recipe(tmp_path)
    for key, table in change.items():
        raw[key] = {**raw.get(key, {}), **table}
    with pytest.raises(RecipeError, match=message):
        build_recipe(raw, "gcint")


def test_features_must_be_finite() -> None:
    with pytest.raises(ValueError, match="the features hold NaN or Inf"):
        integer_features(torch.tensor([[1.0, float("nan")]]))
    assert integer_features(torch.zeros(2, 3)).abs().sum() == 0
    assert integer_features(torch.tensor([[0.5, -1.0]])).tolist() == [[64, -127]]
