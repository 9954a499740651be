"""``bits = "auto"``: the gradient error of one step of the configuration that will run.

Error_X of the first layer's output is the paper's measure; the gradient error (one
training step at each bit count against float32, dropout off) is what the default
``criterion = "gradient"`` picks on. These tests hold it to what a calibration must be:
a measure of quantization alone (zero when nothing is quantized), falling with the bit
count, leaving the model as it found it, and refusing what it cannot measure.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from qtrain.plugins.tango import TangoConfig, TangoPlugin
from qtrain.plugins.tango import calibrate as cal

from qtrain._compat import import_dgl
from qtrain.data.base import FEAT, LABEL, TRAIN_MASK
from qtrain.errors import QtrainError, RecipeError
from qtrain.plugin import Calibration

dgl = import_dgl()
CPU = torch.device("cpu")


class _TwoLayers(torch.nn.Module):
    """A GCN or GAT the way qtrain's models are laid out: ``layers`` and ``output_layer``."""

    def __init__(self, kind: str, in_feats: int, classes: int) -> None:
        super().__init__()
        from dgl.nn import GATConv, GraphConv

        if kind == "gcn":
            first: torch.nn.Module = GraphConv(in_feats, 16, allow_zero_in_degree=True)
            last: torch.nn.Module = GraphConv(16, classes, allow_zero_in_degree=True)
        else:
            first = GATConv(in_feats, 8, num_heads=2, allow_zero_in_degree=True)
            last = GATConv(16, classes, num_heads=1, allow_zero_in_degree=True)
        self.kind = kind
        self.layers = torch.nn.ModuleList([first, last])
        self.dropout = torch.nn.Dropout(0.5)

    @property
    def output_layer(self) -> torch.nn.Module:
        return self.layers[-1]

    def forward(self, graph: Any, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[0](graph, self.dropout(x)).flatten(1).relu()
        return self.layers[1](graph, self.dropout(h)).flatten(1)


def _graph(shape: str, nodes: int = 120, feats: int = 13, classes: int = 4) -> Any:
    torch.manual_seed(3)
    if shape == "power-law":  # hubs: a few nodes take most edges
        dst = torch.multinomial(torch.arange(1, nodes + 1.0) ** -1.5, 900, replacement=True)
        g = dgl.graph((torch.randint(0, nodes, (900,)), dst), num_nodes=nodes)
    elif shape == "empty":
        g = dgl.graph(([], []), num_nodes=nodes)
    else:  # zero-degree: half the nodes receive nothing
        g = dgl.graph(
            (torch.randint(0, nodes, (500,)), torch.randint(0, nodes // 2, (500,))),
            num_nodes=nodes,
        )
    g.ndata[FEAT] = torch.randn(nodes, feats)
    g.ndata[LABEL] = torch.randint(0, classes, (nodes,))
    g.ndata[TRAIN_MASK] = torch.arange(nodes) % 3 == 0
    return g


def _model(kind: str, graph: Any) -> _TwoLayers:
    torch.manual_seed(5)
    return _TwoLayers(kind, graph.ndata[FEAT].shape[1], int(graph.ndata[LABEL].max()) + 1)


def _calibrate(model: Any, graph: Any, **options: Any) -> Calibration:
    """Calibrate as a run would; these graphs are small enough that the default
    ``fp32_when_small`` would keep every primitive float32, so it is off unless asked."""
    config = TangoConfig(**{"bits": "auto", "fp32_when_small": False, **options})
    return TangoPlugin.calibrate(config, model, graph, seed=0, device=CPU)


@contextlib.contextmanager
def _nothing(_bits: int) -> Iterator[None]:
    yield


@pytest.mark.parametrize("kind", ["gcn", "gat"])
@pytest.mark.parametrize("shape", ["power-law", "zero-degree", "empty"])
def test_the_gradient_error_falls_with_the_bit_count(kind: str, shape: str) -> None:
    graph = _graph(shape)
    result = _calibrate(_model(kind, graph), graph)
    errors = result.gradient_error
    assert set(errors) == set(range(2, 9)) and set(result.error_x) == set(range(2, 9))
    assert all(math.isfinite(e) and e >= 0 for e in errors.values())
    if shape == "empty":  # no edge: each layer's output is its bias, no quantized operand
        assert errors == dict.fromkeys(range(2, 9), 0.0) and result.bits == 2
        return
    assert errors[8] < errors[4] < errors[2], errors
    assert errors[8] < 0.1, errors
    assert result.criterion == "gradient" and result.target == cal.DEFAULT_GRADIENT_TARGET
    below = [b for b in sorted(errors) if errors[b] <= result.target]
    assert result.bits == (below[0] if below else 8) and result.met == bool(below)


def test_it_measures_the_configuration_that_will_run() -> None:
    """With ``fp32_when_small`` this graph's primitives all stay float32: only the features
    (``input_bits``) are quantized, so every count reads the same, and the smallest is
    chosen: what the run would really lose at each count."""
    graph = _graph("power-law")
    result = _calibrate(_model("gcn", graph), graph, fp32_when_small=True)
    assert len(set(result.gradient_error.values())) == 1 and result.bits == 2
    finer = _calibrate(_model("gcn", graph), graph)
    assert finer.gradient_error[2] > 10 * result.gradient_error[2]


@pytest.mark.parametrize("kind", ["gcn", "gat"])
def test_without_quantization_the_step_is_the_float32_one(kind: str) -> None:
    """The two steps differ by quantization alone: unpatched, every count reads 0 exactly
    (dropout off, the generator restored between them)."""
    graph = _graph("power-law")
    errors = cal.gradient_error_by_bits(_model(kind, graph), graph, _nothing)
    assert errors == dict.fromkeys(range(2, 9), 0.0)


def test_calibration_leaves_the_model_as_it_found_it() -> None:
    graph = _graph("power-law")
    model = _model("gat", graph)
    model.train()
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng = torch.get_rng_state()
    _calibrate(model, graph)
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name])
        assert torch.equal(p.grad, torch.full_like(p, 7.0))


def test_criterion_error_x_picks_by_the_first_layers_output() -> None:
    graph = _graph("power-law")
    result = _calibrate(_model("gcn", graph), graph, criterion="error_x", error_x_target=0.5)
    assert result.criterion == "error_x" and result.target == 0.5
    below = [b for b in sorted(result.error_x) if result.error_x[b] <= 0.5]
    assert result.bits == (below[0] if below else 8)
    assert result.gradient_error  # still measured, and shown


def test_a_gradient_that_overflows_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count whose step's gradient is not finite reads infinity, shown as null in JSON."""
    graph = _graph("power-law")
    model = _model("gcn", graph)
    real = cal._step_gradient
    state = {"bits": 8}

    def quantized_at(bits: int) -> contextlib.AbstractContextManager[None]:
        state["bits"] = bits
        return contextlib.nullcontext()

    def step(*args: Any) -> torch.Tensor:
        grad = real(*args)
        return grad * math.inf if state["bits"] < 5 else grad

    monkeypatch.setattr(cal, "_step_gradient", step)
    result = cal.calibrate_model(model, graph, quantized_at=quantized_at, target=0.1)
    assert [b for b, e in result.gradient_error.items() if math.isinf(e)] == [2, 3, 4]
    assert result.bits == 5
    shown = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert shown["gradient_error"]["2"] is None and shown["gradient_error"]["5"] == 0.0


def test_a_step_with_nothing_to_learn_reads_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph("power-law")
    monkeypatch.setattr(cal, "_step_gradient", lambda *args: torch.zeros(10))
    errors = cal.gradient_error_by_bits(_model("gcn", graph), graph, _nothing)
    assert errors == dict.fromkeys(range(2, 9), 0.0)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        ("no train nodes", "calibration needs training nodes"),
        ("nan features", "the float32 step's gradient is not finite"),
        ("frozen", "calibration needs a model with trainable parameters"),
    ],
)
def test_what_cannot_be_measured_is_one_clear_error(spoil: str, message: str) -> None:
    graph = _graph("power-law")
    model = _model("gcn", graph)
    if spoil == "no train nodes":
        graph.ndata[TRAIN_MASK] = torch.zeros(graph.num_nodes(), dtype=torch.bool)
    elif spoil == "nan features":
        graph.ndata[FEAT][0, 0] = math.nan
    else:
        model.requires_grad_(False)
    with pytest.raises(QtrainError, match=message):
        cal.gradient_error_by_bits(model, graph, _nothing)


def test_the_gradient_criterion_needs_a_configuration_to_step() -> None:
    graph = _graph("power-law")
    with pytest.raises(QtrainError, match="needs the run's configuration"):
        cal.calibrate_model(_model("gcn", graph), graph)
    with pytest.raises(QtrainError, match="target must be > 0"):
        cal.calibrate_model(_model("gcn", graph), graph, criterion="error_x", target=0.0)


def _run(path: Path) -> dict[str, Any]:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    return execute(load_recipe(path, []), reporter=Reporter())


def test_an_auto_run_trains_at_the_count_its_calibration_chose(
    tango_recipe: Callable[..., Path],
) -> None:
    summary = _run(tango_recipe('bits = "auto"\ngradient_target = 0.2'))
    report = summary["plugin_reports"]["tango"]
    calibration = report["calibration"]
    errors = {int(b): e for b, e in calibration["gradient_error"].items()}
    assert calibration["criterion"] == "gradient" and calibration["target"] == 0.2
    assert report["bits"] == calibration["bits"]
    assert errors[calibration["bits"]] <= 0.2
    assert all(errors[b] > 0.2 for b in errors if b < calibration["bits"])
    assert set(calibration["error_x"]) == {str(b) for b in range(2, 9)}


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_an_auto_run_trains_exactly_like_one_told_the_count(
    tango_recipe: Callable[..., Path], model: str
) -> None:
    """Calibrating steps the model and draws nothing from the run's streams."""
    auto = _run(tango_recipe('bits = "auto"\nfp32_when_small = false', model=model))
    bits = auto["plugin_reports"]["tango"]["bits"]
    assert bits < 8  # the synthetic graph meets the target below 8 bits
    told = _run(tango_recipe(f"bits = {bits}\nfp32_when_small = false", model=model))
    assert auto["final_loss"] == told["final_loss"]
    assert auto["test_acc"] == told["test_acc"]
    assert auto["kernels"] == told["kernels"]  # the trial steps' calls are not counted


def test_calibrate_prints_both_measures(tango_recipe: Callable[..., Path]) -> None:
    path = tango_recipe()
    proc = subprocess.run(
        [sys.executable, "-m", "qtrain", "calibrate", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "gradient error" in proc.stdout and "Error_X" in proc.stdout
    assert "the smallest count with gradient error <= 0.2" in proc.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('criterion = "loss"', "quant.tango.criterion"),
        ("gradient_target = 0", "too small"),
        ('gradient_target = "low"', "quant.tango.gradient_target"),
    ],
)
def test_bad_calibration_options_are_one_line_errors(
    tango_recipe: Callable[..., Path], extra: str, message: str
) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match=message):
        load_recipe(tango_recipe(extra), [])


def test_qtrain_calibrate_refuses_a_bad_target_in_one_line(
    tango_recipe: Callable[..., Path],
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qtrain", "calibrate", str(tango_recipe()), "--target", "-1"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--target must be a number > 0" in proc.stderr
