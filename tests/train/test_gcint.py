"""``train.numerics = "gcint"``: the integer GCN's backward against float autograd on the
same int8 operands, its blocks' normalisation, its update, the recipe's refusals, and short
full-graph and mini-batch runs that learn with the op library's integer products only."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from qtrain._compat import import_dgl
from qtrain.data import load_dataset
from qtrain.errors import RecipeError
from qtrain.models.integer_gcn import (
    BOUNDED_TAIL,
    LOSSES,
    SOFTMAX_TEMPERATURE,
    IntegerGCN,
    IntegerGraph,
    IntegerSGD,
    integer_features,
    mse_error,
    softmax_error,
)
from qtrain.ops import integer
from qtrain.recipe import build_recipe
from qtrain.runner import execute
from qtrain.train.gcint import _float_scores, _steps_per_epoch
from qtrain.train.progress import Reporter


def _graph(nodes: int, edges: int, seed: int) -> IntegerGraph:
    """A random directed graph with self-loops and GCN's weights (not symmetric: A and
    A^T differ, so a transpose mistake shows)."""
    dgl = import_dgl()
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    return IntegerGraph.of(dgl.add_self_loop(dgl.graph((src, dst), num_nodes=nodes)))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def _step(seed: int, widths: tuple[int, ...] = (24, 16, 5)) -> tuple[Any, ...]:
    torch.manual_seed(seed)
    graph = _graph(60, 200, seed + 1)
    x = integer_features(torch.rand(60, widths[0]))
    weights = [torch.randn(a, b) for a, b in itertools.pairwise(widths)]
    model = IntegerGCN(weights, 0.0, 0.0)
    scores, saved = model(graph, x, train=True)
    labels = torch.randint(0, widths[-1], (60,))
    error = mse_error(model.logits(scores), labels, torch.arange(0, 60, 2))
    return graph, model, saved, error


def _row_of(indptr: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])


def _dense_adjacency(csr: Any, rows: int, cols: int) -> torch.Tensor:
    a = torch.zeros(rows, cols, dtype=torch.float64)
    a.index_put_((_row_of(csr.indptr), csr.indices), csr.values.double(), accumulate=True)
    return a


def _autograd(graph: IntegerGraph, model: IntegerGCN, saved: Any, error: torch.Tensor):
    """Float64 autograd of the step whose output error is ``error``, layer by layer through
    the saved operands: each layer's output as a differentiable function of its weights and
    of its input (a zero that carries the saved operand's value where the layer aggregated
    first), the window between the layers passing the error on as the identity would (its
    scale aside), the ReLU where the hidden output is positive."""
    a = _dense_adjacency(graph.a, graph.num_dst, graph.num_src)
    weights = [q.double().requires_grad_() for q in model.int8_weights()]
    upstream = error.double()
    for i in reversed(range(model.num_layers)):
        operand = saved.inputs[i].double()
        if saved.aggregated[i]:  # Q(Q(A X) W): A X carries the saved value
            x = torch.zeros(graph.num_src, operand.shape[1], dtype=torch.float64)
            x.requires_grad_()
            out = (operand + a @ x) @ weights[i]
        else:  # Q(A Q(X W))
            x = operand.clone().requires_grad_()
            out = a @ (x @ weights[i])
        (out * upstream).sum().backward()  # d(out . E) / dW and / dX
        if i > 0:
            upstream = x.grad * saved.positive[i - 1]
    return [w.grad for w in weights]


@pytest.mark.parametrize(
    ("widths", "aggregated"), [((24, 16, 5), [False, False]), ((8, 16, 5), [True, False])]
)
def test_backward_is_the_chain_rule_without_the_windows(
    monkeypatch: pytest.MonkeyPatch, widths: tuple[int, ...], aggregated: list[bool]
) -> None:
    """With the windows taken out (StQ and DyQ the identity, the products exact in int64)
    the integer backward is float autograd exactly: the transposes, the ReLU mask and the
    operand order of equations 8 and 9 are right, in both product orders (a layer that
    widens aggregates first)."""
    graph, model, saved, error = _step(0, widths)
    assert saved.aggregated == aggregated
    monkeypatch.setattr(integer, "stq", lambda x: x)
    monkeypatch.setattr(integer, "dyq", lambda x: (x, 0))

    def exact_gemm(a: torch.Tensor, b: torch.Tensor, layout: str = "nn") -> torch.Tensor:
        a = a.t() if layout == "tn" else a
        b = b.t() if layout == "nt" else b
        return a.to(torch.int64) @ b.to(torch.int64)

    monkeypatch.setattr(integer, "int_gemm", exact_gemm)
    transposed = _dense_adjacency(graph.a_t, 60, 60)
    assert torch.equal(transposed, _dense_adjacency(graph.a, 60, 60).t())  # A^T itself
    monkeypatch.setattr(
        type(graph),
        "spmm_transposed",
        lambda self, x: transposed.to(torch.int64) @ x.to(torch.int64),
    )
    grads = model.backward(graph, saved, error)
    expected = _autograd(graph, model, saved, error)
    for got, want in zip(grads, expected, strict=True):
        assert torch.equal(got.double(), want)


@pytest.mark.parametrize("widths", [(24, 16, 5), (8, 16, 5)])
@pytest.mark.parametrize("seed", range(3))
def test_backward_with_its_windows_points_where_autograd_points(
    seed: int, widths: tuple[int, ...]
) -> None:
    """With StQ and DyQ, the int8 gradients keep autograd's direction (StQ saturates the
    largest errors, and DyQ rounds the smallest gradients away and clamps the largest at
    127, by design: on a 16 x 5 gradient whose few largest entries dwarf the rest that
    costs up to 0.3 of cosine)."""
    graph, model, saved, error = _step(seed, widths)
    grads = model.backward(graph, saved, error)
    expected = _autograd(graph, model, saved, error)
    assert all(g.dtype == torch.int8 for g in grads)
    for got, want in zip(grads, expected, strict=True):
        assert _cosine(got, want) > 0.7


def test_mse_error_is_logits_minus_127_onehot_on_training_rows() -> None:
    logits = torch.tensor([[100, -20], [5, 127], [-127, 0]], dtype=torch.int8)
    error = mse_error(logits, torch.tensor([0, 1, 0]), torch.tensor([0, 2]))
    # row 2: -127 - 127 saturates at -127; row 1 is not a training row
    assert error.tolist() == [[-27, -20], [0, 0], [-127, 0]]


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _float_softmax_error(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """127 * (softmax - onehot) in float64, base 2 at the loss's temperature."""
    p = torch.softmax(logits.double() * (math.log(2) / SOFTMAX_TEMPERATURE), dim=1)
    return 127 * (p - torch.nn.functional.one_hot(labels, logits.shape[1]).double())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "classes"), [(50, 2), (33, 7), (20, 47), (5, 1)])
def test_softmax_error_is_cross_entropys_gradient_to_a_unit(
    device: str, rows: int, classes: int
) -> None:
    g = torch.Generator().manual_seed(rows * classes)
    logits = torch.randint(-127, 128, (rows, classes), generator=g, dtype=torch.int8)
    logits[0] = 127  # a constant row: every class alike
    if rows > 2:
        logits[1] = 0
        logits[2, :] = -127  # the widest gap, 254, once in the row
        logits[2, 0] = 127
    labels = torch.randint(0, classes, (rows,), generator=g)
    train = torch.arange(rows)
    error = softmax_error(logits.to(device), labels.to(device), train.to(device)).cpu()
    assert error.dtype == torch.int8
    # the table and the division round, each to nearest: at most one unit from float
    assert (error.double() - _float_softmax_error(logits, labels)).abs().max() <= 1
    # a constant row spreads 127 evenly; the true class keeps 127 / C - 127
    even = round(127 / classes)
    assert error[0].tolist() == [even - 127 * (c == labels[0]) for c in range(classes)]
    # each row's errors sum to 0 but for rounding
    assert error.sum(dim=1).abs().max() <= classes / 2 + 1


def test_softmax_error_ignores_a_rows_offset_and_rows_outside_training() -> None:
    g = torch.Generator().manual_seed(7)
    logits = torch.randint(-100, 28, (40, 5), generator=g, dtype=torch.int8)
    labels = torch.randint(0, 5, (40,), generator=g)
    train = torch.arange(0, 40, 3)
    error = softmax_error(logits, labels, train)
    shifted = softmax_error(logits + 99, labels, train)  # within int8: 28 + 99 = 127
    assert torch.equal(error, shifted)
    outside = torch.ones(40, dtype=torch.bool)
    outside[train] = False
    assert not error[outside].any()
    assert not softmax_error(logits, labels, torch.arange(0)).any()  # no training rows
    # a row already sure of its class (254 units ahead) has no error left
    sure = torch.tensor([[127, -127, -127]], dtype=torch.int8)
    assert not softmax_error(sure, torch.tensor([0]), torch.tensor([0])).any()


def test_integer_sgd_moves_master_weights_by_the_shifted_gradient() -> None:
    model = IntegerGCN([torch.ones(2, 2)], 0.0, 0.0)
    before = model.master(0).clone()
    assert before.max() == 127 << 8
    IntegerSGD(model, 3).step([torch.tensor([[1, -2], [0, 127]], dtype=torch.int8)])
    assert (before - model.master(0)).tolist() == [[8, -16], [0, 1016]]
    # a negative shift divides, rounded to nearest (half away from zero)
    model = IntegerGCN([torch.ones(1, 4)], 0.0, 0.0)
    before = model.master(0).clone()
    IntegerSGD(model, -3).step([torch.tensor([[3, 4, -4, 127]], dtype=torch.int8)])
    assert (before - model.master(0)).tolist() == [[0, 1, -1, 16]]
    with pytest.raises(ValueError, match="saved with gcint_lr_shift = 2, this one has 3"):
        IntegerSGD(model, 3).load_state_dict({"lr_shift": 2})


def test_linear_decay_shrinks_the_step_to_zero_over_the_run() -> None:
    model = IntegerGCN([torch.ones(1, 2)], 0.0, 0.0)
    sgd = IntegerSGD(model, 0, "linear", total_steps=4)
    grad = torch.tensor([[127, -127]], dtype=torch.int8)
    moved = []
    for _ in range(5):  # one step past the schedule's end moves nothing
        before = model.master(0).clone()
        sgd.step([grad])
        moved.append((before - model.master(0)).tolist()[0])
    # 127 x 4/4, 3/4 (95.25), 2/4 (63.5: half away from zero), 1/4 (31.75), 0
    assert moved == [[127, -127], [95, -95], [64, -64], [32, -32], [0, 0]]
    assert sgd.steps_taken == 5
    # the full step with a negative shift: 127 / 8 = 15.875 -> 16, then 3/4 of it 11.9 -> 12
    model = IntegerGCN([torch.ones(1, 2)], 0.0, 0.0)
    sgd = IntegerSGD(model, -3, "linear", total_steps=4)
    before = model.master(0).clone()
    sgd.step([grad])
    sgd.step([grad])
    assert (before - model.master(0)).tolist() == [[28, -28]]
    # the largest shift and gradient stay inside int32
    model = IntegerGCN([torch.ones(1, 1)], 0.0, 0.0)
    before = model.master(0).clone()
    IntegerSGD(model, 16).step([torch.tensor([[-127]], dtype=torch.int8)])
    assert (model.master(0) - before).item() == 127 << 16


def test_integer_sgd_state_resumes_its_schedule_and_refuses_another() -> None:
    model = IntegerGCN([torch.ones(1, 1)], 0.0, 0.0)
    sgd = IntegerSGD(model, 2, "linear", total_steps=10)
    for _ in range(3):
        sgd.step([torch.zeros(1, 1, dtype=torch.int8)])
    resumed = IntegerSGD(model, 2, "linear", total_steps=10)
    resumed.load_state_dict(sgd.state_dict())
    assert resumed.steps_taken == 3 and resumed.share() == sgd.share() == round(0.7 * 2**16)
    with pytest.raises(ValueError, match="saved with gcint_lr_decay = 'linear', this one has"):
        IntegerSGD(model, 2).load_state_dict(sgd.state_dict())
    with pytest.raises(ValueError, match=r"linear' over updates \(epochs x batches\) = 10, "):
        IntegerSGD(model, 2, "linear", total_steps=20).load_state_dict(sgd.state_dict())
    # a constant step does not depend on the run's length; a state from before the
    # schedule existed (no decay saved) was a constant one
    constant = IntegerSGD(model, 2, total_steps=20)
    constant.load_state_dict({"lr_shift": 2})
    constant.load_state_dict(IntegerSGD(model, 2, total_steps=5).state_dict())
    assert constant.share() == 1 << 16


@pytest.mark.parametrize("mode", ["full", "minibatch"])
def test_a_run_schedules_one_update_per_step(mode: str) -> None:
    """The linear step spans epochs x updates per epoch; ``auto`` decays the mini-batch
    steps only (what measured best on each)."""
    recipe = build_recipe(
        {
            "model": {"name": "gcn", "hidden": 8},
            "dataset": {"name": "synthetic-small", "nodes": 400},
            "train": {"mode": mode, "fanouts": [4, 4], "batch_size": 64, "numerics": "gcint"},
        },
        "steps",
    )
    graph = load_dataset(recipe.dataset.name, recipe.dataset.options).graph
    train = int(graph.ndata["train_mask"].sum())
    assert _steps_per_epoch(graph, recipe.train) == (1 if mode == "full" else -(-train // 64))
    assert mode == "full" or _steps_per_epoch(graph, recipe.train) > 1
    assert recipe.train.gcint_step_decay == ("constant" if mode == "full" else "linear")
    for chosen in ("constant", "linear"):
        raw = {
            "model": {"name": "gcn"},
            "dataset": {"name": "synthetic-small"},
            "train": {"mode": mode, "numerics": "gcint", "gcint_lr_decay": chosen},
        }
        assert build_recipe(raw, "chosen").train.gcint_step_decay == chosen


def _recipe(tmp_path: Path, **train: Any) -> Any:
    raw = {
        "model": {"name": "gcn", "hidden": 16},
        "dataset": {"name": "synthetic-small", "nodes": 400},
        "train": {"epochs": 60, "numerics": "gcint", **train},
        "output": {"dir": str(tmp_path / "runs")},
    }
    return raw


@pytest.mark.parametrize(
    ("quantizer", "loss"),
    [("dyq", "mse"), ("stq", "mse"), ("dyq", "softmax"), ("dyq-bounded", "softmax")],
)
def test_a_gcint_run_learns_with_integer_products_only(
    tmp_path: Path, quantizer: str, loss: str
) -> None:
    raw = _recipe(tmp_path, gcint_quantizer=quantizer, gcint_loss=loss)
    summary = execute(build_recipe(raw, "gcint"), reporter=Reporter())
    assert summary["status"] == "completed" and summary["numerics"] == "gcint"
    # every product of the run was an integer one (no float GEMM or SpMM counted)
    assert set(summary["kernels"]) == {"int_gemm", "int_spmm", "requantize", "dyq"}
    # ... and ran on the op library's CPU kernels: 2 layers, 5 GEMMs and 4 SpMMs per training
    # step (forward 2 each; backward 2 + 1 for the error, and 2 SpMMs), 2 of each per evaluation
    assert summary["kernels"]["int_gemm"] == {"ext-cpu": summary["kernels"]["int_gemm"]["ext-cpu"]}
    assert summary["kernels"]["int_gemm"]["ext-cpu"] >= 60 * 5
    assert summary["kernels"]["int_spmm"]["ext-cpu"] >= 60 * 4
    chance = 1 / 4  # synthetic-small: 4 classes
    assert summary["test_acc"] > chance + 0.25
    assert summary["gcint"] == {
        "quantizer": quantizer,
        "loss": loss,
        "lr_shift": 4,
        "lr_decay": "constant",  # auto, full-graph
    }
    assert summary["activation_bytes"] > 0


def test_the_bounded_quantizer_keeps_the_largest_activations() -> None:
    """``dyq-bounded`` windows a forward product so that at most one nonzero value in
    ``2^BOUNDED_TAIL`` saturates, where the paper's DyQ sits on the many small values and
    clips the few large ones to 127 (what cost mini-batch accuracy)."""
    g = torch.Generator().manual_seed(0)
    small = torch.randint(-300, 300, (50_000,), generator=g, dtype=torch.int32)
    large = torch.randint(2**16, 2**18, (40,), generator=g, dtype=torch.int32)
    x = torch.cat([small, large]).view(-1, 10)
    weights = [torch.randn(4, 3)]
    clipped = IntegerGCN(weights, 0.0, 0.0, "dyq")._window(x)
    bounded = IntegerGCN(weights, 0.0, 0.0, "dyq-bounded")._window(x)
    nonzero = int((x != 0).sum())
    assert torch.all(clipped.flatten()[-40:] == 127)  # DyQ: every large value clipped
    assert int((bounded.abs() == 127).sum()) * 2**BOUNDED_TAIL <= nonzero
    kept = bounded.flatten()[-40:][torch.argsort(large)]
    assert torch.all(kept[1:] >= kept[:-1])  # still in the order of their sizes
    assert kept.unique().numel() >= 10 and int(kept[0]) < 64  # 2^16 .. 2^18: a 4x spread


def test_the_softmax_loss_reads_each_row_of_the_logits_through_its_own_window() -> None:
    """The MSE reads the logits through the forward's window (the paper's); the softmax
    error through one window per row, so a row whose scores are small beside the batch's
    largest keeps its 7 bits and its order (on synthetic-products mini-batches the
    tensor's window left the median row's largest logit at 17 and 14% of rows tied at
    the top)."""
    assert LOSSES["mse"].logit_window == "tensor" and LOSSES["softmax"].logit_window == "row"
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(-4000, 4000, (64, 47), generator=g, dtype=torch.int32)
    scores[0] *= 2**12  # one row far above the rest sets the tensor's window
    weights = [torch.randn(4, 47)]
    by_tensor = IntegerGCN(weights, 0.0, 0.0, "dyq-bounded").logits(scores)
    by_row = IntegerGCN(weights, 0.0, 0.0, "dyq-bounded", logit_window="row").logits(scores)
    assert torch.equal(by_tensor, integer.dyq(scores, tail=BOUNDED_TAIL)[0])
    assert torch.equal(by_row, integer.row_window(scores))
    assert int(by_tensor[1:].abs().max()) <= 1  # the other rows: -1, 0 or 1
    assert bool((by_row.abs().amax(dim=1) >= 64).all())
    top = scores.argmax(dim=1, keepdim=True)
    # the top class stays at the top of its row (tied only within one rounding step) ...
    assert torch.equal(by_row.gather(1, top), by_row.amax(dim=1, keepdim=True))
    # ... where the tensor's window ties most rows' top with other classes
    tied = (by_tensor == by_tensor.amax(dim=1, keepdim=True)).sum(dim=1) > 1
    assert int(tied[1:].sum()) > 50
    # a full-graph step windows only the training rows the loss reads: the same error
    rows = torch.tensor([3, 0, 17, 63])
    only = IntegerGCN(weights, 0.0, 0.0, "dyq-bounded", logit_window="row").logits(scores, rows)
    assert torch.equal(only[rows], by_row[rows])
    others = torch.ones(64, dtype=torch.bool)
    others[rows] = False
    assert not only[others].any()
    labels = torch.randint(0, 47, (64,), generator=g)
    assert torch.equal(softmax_error(only, labels, rows), softmax_error(by_row, labels, rows))
    # the tensor's window is the whole product's, whichever rows are read
    assert torch.equal(IntegerGCN(weights, 0.0, 0.0, "dyq-bounded").logits(scores, rows), by_tensor)


def test_the_forward_returns_the_int32_scores_its_prediction_is_the_argmax_of() -> None:
    """Evaluation predicts from the last product's int32 scores, not from int8 logits that
    a window would tie; float64 carries them to the metrics exactly."""
    graph = _graph(30, 90, 5)
    x = integer_features(torch.rand(30, 6, generator=torch.Generator().manual_seed(5)))
    model = IntegerGCN([torch.randn(6, 8), torch.randn(8, 5)], 0.0, 0.0)
    scores, _ = model(graph, x)
    assert scores.dtype == torch.int32 and scores.shape == (30, 5)
    close = torch.tensor([[2**30, 2**30 + 1, -5]], dtype=torch.int32)
    assert close.to(torch.float32).argmax() == 0  # float32 ties them
    assert _float_scores(close).argmax() == 1


def test_on_many_classes_the_softmax_error_trains_where_the_mse_does_not(
    tmp_path: Path,
) -> None:
    """30 classes: the paper's loss stays near 0.2 (its wrong classes' error outweighs the
    true class's), cross-entropy's integer error learns (0.64 on seeds 0 and 1)."""
    accuracy = {}
    for loss in ("mse", "softmax"):
        raw = _recipe(tmp_path / loss, gcint_loss=loss, epochs=100)
        raw["dataset"].update({"nodes": 2000, "classes": 30})
        summary = execute(build_recipe(raw, "gcint"), reporter=Reporter())
        assert summary["status"] == "completed" and summary["numerics"] == "gcint"
        accuracy[loss] = summary["test_acc"]
    assert accuracy["softmax"] > 0.5
    assert accuracy["softmax"] > accuracy["mse"] + 0.2


def test_a_block_with_all_neighbours_is_the_full_graphs_rows() -> None:
    """A block whose destinations keep every in-edge gets the full graph's int8 weights, so
    mini-batch training and full-graph evaluation compute one model; a sampled block gets
    the unbiased weights ``sqrt(d_in(v) / d_out(u)) / block_in(v)``."""
    dgl = import_dgl()
    g = torch.Generator().manual_seed(4)
    src, dst = torch.randint(0, 50, (300,), generator=g), torch.randint(0, 50, (300,), generator=g)
    graph = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=50))
    full = IntegerGraph.of(graph, transposed=False)
    dense_full = _dense_adjacency(full.a, 50, 50)
    deg_out, deg_in = graph.out_degrees().float(), graph.in_degrees().float()
    seeds = torch.tensor([3, 17, 40, 0])
    block = dgl.to_block(dgl.in_subgraph(graph, seeds), seeds)
    ids_src, ids_dst = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
    mfg = IntegerGraph.of_block(block, deg_out[ids_src], deg_in[ids_dst])
    assert (mfg.num_dst, mfg.num_src) == (4, block.num_src_nodes())
    dense_block = _dense_adjacency(mfg.a, mfg.num_dst, mfg.num_src)
    assert torch.equal(dense_block, dense_full[ids_dst][:, ids_src])
    assert torch.equal(_dense_adjacency(mfg.a_t, mfg.num_src, mfg.num_dst), dense_block.t())
    # sampled: two in-edges of each seed kept
    sampled = dgl.to_block(dgl.sampling.sample_neighbors(graph, seeds, 2), seeds)
    ids_src, ids_dst = sampled.srcdata[dgl.NID], sampled.dstdata[dgl.NID]
    mfg = IntegerGraph.of_block(sampled, deg_out[ids_src], deg_in[ids_dst])
    u, v = sampled.edges()
    weight = (deg_in[ids_dst][v] / deg_out[ids_src][u]).sqrt() / sampled.in_degrees()[v]
    expected = torch.zeros(4, sampled.num_src_nodes(), dtype=torch.float64)
    expected.index_put_((v, u), torch.ceil(weight.double() * 127).clamp(max=127), accumulate=True)
    assert torch.equal(_dense_adjacency(mfg.a, 4, sampled.num_src_nodes()), expected)


def test_a_minibatch_gcint_run_learns_on_sampled_blocks(tmp_path: Path) -> None:
    raw = _recipe(tmp_path, mode="minibatch", fanouts=[5, 5], batch_size=64, epochs=6)
    raw["dataset"]["nodes"] = 1000
    summary = execute(build_recipe(raw, "gcint"), reporter=Reporter())
    assert summary["status"] == "completed" and summary["numerics"] == "gcint"
    kernels = summary["kernels"]
    assert set(kernels) == {"int_gemm", "int_spmm", "requantize", "dyq"}
    batches = 6 * -(-300 // 64)  # synthetic-small trains on 30% of its nodes
    assert kernels["int_spmm"] == {"ext-cpu": kernels["int_spmm"]["ext-cpu"]}
    # 2 SpMMs forward, 1 or 2 backward (a first layer that aggregates first needs no A^T)
    assert kernels["int_spmm"]["ext-cpu"] >= 3 * batches
    assert summary["test_acc"] > 1 / 4 + 0.25
    assert summary["gcint"]["lr_decay"] == "linear"  # auto, mini-batch


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"name": "gat"}}, "trains model 'gcn' only .* not 'gat'"),
        ({"quant": {"plugin": ["tango"]}}, r"remove quant.plugin = \['tango'\]"),
        ({"distributed": {"world_size": 2}}, "set distributed.world_size = 1"),
        ({"train": {"gcint_quantizer": "log"}}, "gcint_quantizer"),
        ({"train": {"gcint_loss": "cross-entropy"}}, "gcint_loss"),
        ({"train": {"gcint_lr_shift": 17}}, "gcint_lr_shift"),
        ({"train": {"gcint_lr_shift": -8}}, "gcint_lr_shift"),
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
