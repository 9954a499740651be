"""The route's patches of DGL: installed and removed exactly, and every refusal one clear line."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import qtrain
import qtrain.route as route
from qtrain._compat import import_dgl
from qtrain.plugin import PRIMITIVES, Patcher
from qtrain.route import DeviceRouteError

dgl = import_dgl()


@pytest.fixture(autouse=True)
def _route_off() -> Iterator[None]:
    route.disable()
    yield
    route.disable()


def _dgl_state() -> dict[str, Any]:
    """Every object the route replaces, as DGL holds it now."""
    frame = importlib.import_module("dgl.frame")
    tensor = importlib.import_module("dgl.backend.pytorch.tensor")
    state: dict[str, Any] = {p: Patcher.current(p) for p in PRIMITIVES}
    state["gspmm"] = importlib.import_module("dgl.ops.spmm").gspmm
    state["dgl.ops.gspmm"] = dgl.ops.gspmm
    state["zerocopy"] = tensor.zerocopy_to_dgl_ndarray
    state["copy_to"] = tensor.copy_to
    for name in ("_set_n_repr", "_set_e_repr", "to"):
        state[name] = dgl.DGLGraph.__dict__[name]
    for name in ("update", "extend"):
        state[f"Column.{name}"] = frame.Column.__dict__[name]
    return state


def test_disable_puts_back_exactly_what_dgl_had() -> None:
    before = _dgl_state()
    route.enable("cpu")
    during = _dgl_state()
    assert all(during[key] is not before[key] for key in before), [
        key for key in before if during[key] is before[key]
    ]
    route.enable("meta")  # a second device: nothing is patched twice
    assert _dgl_state() == during
    assert route.enabled_devices() == ("cpu", "meta")
    route.disable("cpu")
    assert route.enabled_devices() == ("meta",)
    route.disable()
    after = _dgl_state()
    assert all(after[key] is before[key] for key in before)
    assert route.enabled_devices() == ()


def test_cpu_tensors_go_to_dgl_while_another_device_is_routed() -> None:
    from qtrain.ops import dispatch

    route.enable("meta")
    dispatch.reset()
    g = dgl.rand_graph(10, 30)
    dgl.ops.copy_u_sum(g, torch.randn(10, 4))
    assert "spmm" not in dispatch.snapshot()


def test_a_dgl_function_the_route_does_not_run_is_named_in_one_line() -> None:
    route.enable("meta")
    values = torch.ones(6, 3, device="meta")
    with pytest.raises(DeviceRouteError) as caught:
        dgl.ops.segment_reduce(torch.tensor([2, 4]), values, "sum")
    message = str(caught.value)
    assert "\n" not in message
    assert "dgl.ops.segment.segment_reduce" in message and "meta" in message


def test_a_refusal_is_a_user_facing_error() -> None:
    """The CLI prints a QtrainError as one line with exit status 2 (tests/test_cli.py)."""
    from qtrain.errors import QtrainError

    assert issubclass(DeviceRouteError, QtrainError)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (
            lambda g, x: dgl.ops.gspmm(
                g, "dot", "sum", x, torch.ones(g.num_edges(), 3, device="meta")
            ),
            "op 'dot'",
        ),
        (lambda g, x: dgl.ops.gspmm(g, "copy_lhs", "prod", x, None), "reducer 'prod'"),
        (lambda g, x: dgl.ops.gsddmm(g, "pow", x, x), "op 'pow'"),
        (
            lambda g, x: dgl.ops.edge_softmax(
                g, torch.ones(g.num_edges(), device="meta"), norm_by="both"
            ),
            "norm_by 'both'",
        ),
        (
            lambda g, x: dgl.ops.edge_softmax(
                g, torch.ones(2, device="meta"), eids=torch.tensor([0, 1], device="meta")
            ),
            "edge ids on meta",
        ),
    ],
    ids=["spmm-op", "reducer", "sddmm-op", "norm_by", "device-eids"],
)
def test_what_the_route_refuses_it_names(call: Any, names: str) -> None:
    route.enable("meta")
    g = dgl.rand_graph(8, 20)
    x = torch.ones(8, 3, device="meta")
    with pytest.raises(DeviceRouteError, match=names) as caught:
        call(g, x)
    assert "\n" not in str(caught.value)


def test_the_mean_reducer_on_several_edge_types_is_refused() -> None:
    import dgl.function as fn

    route.enable("meta")
    hg = dgl.heterograph({("a", "r", "b"): ([0, 1], [0, 0]), ("b", "s", "b"): ([0], [0])})
    hg.nodes["a"].data["h"] = torch.ones(2, 3, device="meta")
    hg.nodes["b"].data["h"] = torch.ones(1, 3, device="meta")
    with pytest.raises(DeviceRouteError, match="mean reducer"):
        dgl.ops.gspmm(
            hg, "copy_lhs", "mean", (hg.nodes["a"].data["h"], hg.nodes["b"].data["h"]), None
        )
    hg.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))  # sum is fine
    assert hg.nodes["b"].data["h"].device.type == "meta"


def test_features_on_the_route_device_keep_dgl_shape_checks() -> None:
    route.enable("meta")
    g = dgl.rand_graph(5, 9)
    g.ndata["h"] = torch.ones(5, 2, device="meta")
    g.edata["w"] = torch.ones(9, device="meta")
    with pytest.raises(dgl.DGLError, match="node feature 'x' has 4 rows; the graph has 5"):
        g.ndata["x"] = torch.ones(4, 2, device="meta")
    with pytest.raises(dgl.DGLError, match="edge feature 'x' has 3 rows; the graph has 9"):
        g.edata["x"] = torch.ones(3, device="meta")
    g.nodes[[1, 3]].data["h"] = torch.zeros(2, 2, device="meta")  # some rows: ids move along
    assert g.ndata["h"].device.type == "meta"


def test_features_on_a_device_the_route_does_not_serve_are_refused_as_dgl_would() -> None:
    route.enable("cpu")
    g = dgl.rand_graph(5, 9)
    with pytest.raises(dgl.DGLError):
        g.ndata["x"] = torch.ones(5, 2, device="meta")


def test_graph_to_a_route_device_copies_the_features_only() -> None:
    route.enable("meta")
    g = dgl.rand_graph(6, 12)
    g.ndata["h"] = torch.randn(6, 3)
    g.edata["w"] = torch.randn(12)
    moved = g.to("meta")
    assert moved is not g and moved._graph is g._graph  # the structure stays on the CPU
    assert moved.ndata["h"].device.type == "meta" and moved.edata["w"].device.type == "meta"
    assert g.ndata["h"].device.type == "cpu"  # the original is untouched, as DGL's to() leaves it
    assert route.to_device(g, "meta").ndata["h"].device.type == "meta"


def test_self_loops_added_to_a_graph_with_device_edge_data() -> None:
    route.enable("meta")
    g = dgl.rand_graph(6, 12)
    g.edata["w"] = torch.ones(12, device="meta")
    looped = dgl.add_self_loop(g)
    assert looped.edata["w"].shape == (18,) and looped.edata["w"].device.type == "meta"


def test_enabling_under_active_plugins_is_refused() -> None:
    with qtrain.patch("trace"), pytest.raises(DeviceRouteError, match="before plugins"):
        route.enable("cpu")
    assert route.enabled_devices() == ()


def test_plugins_wrap_the_route() -> None:
    """Enabled first, the route is what plugins wrap: their fallbacks run on the route."""
    from qtrain.ops import dispatch

    route.enable("cpu")
    dispatch.reset()
    g = dgl.add_self_loop(dgl.rand_graph(12, 40))
    with qtrain.patch("trace"):
        dgl.ops.copy_u_sum(g, torch.randn(12, 4))
    counts = dispatch.snapshot()
    assert counts["spmm"]["route"] == 1


def test_import_dgl_needs_no_qtrain_call_and_the_route_is_one_call() -> None:
    """The README's user-loop lines, in a fresh interpreter."""
    code = (
        "import dgl, torch, qtrain.route as route\n"
        "g = route.to_device(dgl.rand_graph(20, 60), 'cpu')\n"
        "conv = dgl.nn.GraphConv(4, 2, allow_zero_in_degree=True)\n"
        "print(conv(g, torch.randn(20, 4)).shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch.Size([20, 2])"
