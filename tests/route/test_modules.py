"""Unmodified ``dgl.nn`` modules on qtrain's device route.

Two proofs per module, without a GPU:

* on the CPU, the route's output and every gradient (input features and
  parameters) match DGL's own kernels;
* on the ``meta`` device, forward and backward run to the end. Meta tensors
  follow the device rules a GPU enforces (a CPU tensor mixed into an op with a
  meta tensor raises, as with CUDA) and have no values, so ``.item()``,
  ``.tolist()``, ``.cpu()`` and DGL's C library all fail on them: a module
  that passes touches no CPU feature tensor, never waits for the device and
  never reaches one of DGL's C kernels with a device tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import qtrain.route as route
from qtrain._compat import import_dgl

dgl = import_dgl()
from dgl import nn as dglnn  # noqa: E402

from qtrain.models.rgat import RGATConv  # noqa: E402


@pytest.fixture(autouse=True)
def _route_off() -> Iterator[None]:
    route.disable()
    yield
    route.disable()


@dataclass
class Case:
    """A module, the graph it runs on and its input features (built on the CPU)."""

    module: Callable[[], torch.nn.Module]
    graph: Callable[[], Any]
    inputs: Callable[[Any], dict[str, torch.Tensor]]  # named tensors: features, edge weights
    forward: Callable[[torch.nn.Module, Any, dict[str, torch.Tensor]], torch.Tensor]
    # DGL's TypedLinear on presorted input reads its segment lengths on the host
    # (``.cpu()``, a device sync on a GPU), which a meta tensor cannot do
    reads_host: bool = False


def _homogeneous(nodes: int = 40, edges: int = 200, self_loops: bool = True) -> Any:
    gen = torch.Generator().manual_seed(11)
    g = dgl.graph(
        (
            torch.randint(0, nodes, (edges,), generator=gen),
            torch.randint(0, nodes, (edges,), generator=gen),
        ),
        num_nodes=nodes,
    )
    return dgl.add_self_loop(dgl.remove_self_loop(g)) if self_loops else g


def _features(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


def _nodes(width: int = 12) -> Callable[[Any], dict[str, torch.Tensor]]:
    return lambda g: {"x": _features(g.num_nodes(), width, 1)}


def _plain(module: torch.nn.Module, g: Any, t: dict[str, torch.Tensor]) -> torch.Tensor:
    return module(g, t["x"])


def _typed_graph() -> Any:
    g = _homogeneous(self_loops=False)
    g.edata["etype"] = torch.randint(
        0, 3, (g.num_edges(),), generator=torch.Generator().manual_seed(2)
    )
    g.ndata["ntype"] = torch.randint(
        0, 2, (g.num_nodes(),), generator=torch.Generator().manual_seed(3)
    )
    return g


def _sorted_typed_graph() -> Any:
    """A relational dataset's form: nodes grouped by ntype, edges by etype, so DGL's typed
    linear layers take their segment_mm path (``presorted=True``)."""
    g = _typed_graph()
    node_order = torch.argsort(g.ndata["ntype"], stable=True)
    position = torch.empty_like(node_order)
    position[node_order] = torch.arange(len(node_order))
    src, dst = g.edges()
    edge_order = torch.argsort(g.edata["etype"], stable=True)
    h = dgl.graph((position[src[edge_order]], position[dst[edge_order]]), num_nodes=g.num_nodes())
    h.ndata["ntype"] = g.ndata["ntype"][node_order]
    h.edata["etype"] = g.edata["etype"][edge_order]
    return h


def _heterograph() -> Any:
    gen = torch.Generator().manual_seed(4)
    return dgl.heterograph(
        {
            ("user", "follows", "user"): (
                torch.randint(0, 9, (30,), generator=gen),
                torch.randint(0, 9, (30,), generator=gen),
            ),
            ("user", "buys", "item"): (
                torch.randint(0, 9, (25,), generator=gen),
                torch.randint(0, 6, (25,), generator=gen),
            ),
            ("item", "bought-by", "user"): (
                torch.randint(0, 6, (20,), generator=gen),
                torch.randint(0, 9, (20,), generator=gen),
            ),
        },
        num_nodes_dict={"user": 9, "item": 6},
    )


def _hetero_forward(module: torch.nn.Module, g: Any, t: dict[str, torch.Tensor]) -> torch.Tensor:
    out = module(g, {"user": t["user"], "item": t["item"]})
    return torch.cat([out["user"].flatten(1), out["item"].flatten(1)])


@functools.cache
def _blocks() -> list[Any]:
    """Two blocks from DGL's neighbour sampler (the mini-batch form); sampled once, since
    DGL's threaded sampler does not repeat itself under one seed."""
    g = _homogeneous(60, 400)
    sampler = dgl.dataloading.MultiLayerNeighborSampler([4, 3])
    dgl.seed(5)
    _, _, blocks = sampler.sample_blocks(g, torch.arange(0, 60, 5))
    return blocks


def _block_forward(
    module: torch.nn.Module, blocks: list[Any], t: dict[str, torch.Tensor]
) -> torch.Tensor:
    h = t["x"]
    for layer, block in zip(module, blocks, strict=True):
        h = layer(block, (h, h[: block.num_dst_nodes()]))
    return h


CASES: dict[str, Case] = {
    "GraphConv": Case(lambda: dglnn.GraphConv(12, 7), _homogeneous, _nodes(), _plain),
    "GraphConv-edge-weight": Case(
        lambda: dglnn.GraphConv(12, 7, norm="both"),
        _homogeneous,
        lambda g: {
            "x": _features(g.num_nodes(), 12, 1),
            "w": _features(g.num_edges(), 1, 2).abs()[:, 0],
        },
        lambda m, g, t: m(g, t["x"], edge_weight=t["w"]),
    ),
    "SAGEConv-mean": Case(
        lambda: dglnn.SAGEConv(12, 7, "mean"),
        lambda: _homogeneous(self_loops=False),
        _nodes(),
        _plain,
    ),
    "SAGEConv-gcn": Case(lambda: dglnn.SAGEConv(12, 7, "gcn"), _homogeneous, _nodes(), _plain),
    "SAGEConv-pool": Case(lambda: dglnn.SAGEConv(12, 7, "pool"), _homogeneous, _nodes(), _plain),
    "SAGEConv-lstm": Case(lambda: dglnn.SAGEConv(12, 7, "lstm"), _homogeneous, _nodes(), _plain),
    "GATConv": Case(lambda: dglnn.GATConv(12, 5, num_heads=3), _homogeneous, _nodes(), _plain),
    "GATv2Conv": Case(lambda: dglnn.GATv2Conv(12, 5, num_heads=2), _homogeneous, _nodes(), _plain),
    "GINConv-sum": Case(
        lambda: dglnn.GINConv(torch.nn.Linear(12, 7), "sum"), _homogeneous, _nodes(), _plain
    ),
    "GINConv-max": Case(
        lambda: dglnn.GINConv(torch.nn.Linear(12, 7), "max"),
        lambda: _homogeneous(self_loops=False),
        _nodes(),
        _plain,
    ),
    "GINConv-mean": Case(
        lambda: dglnn.GINConv(torch.nn.Linear(12, 7), "mean"), _homogeneous, _nodes(), _plain
    ),
    "RelGraphConv": Case(
        lambda: dglnn.RelGraphConv(12, 7, num_rels=3),
        _typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.edata["etype"]),
    ),
    "RelGraphConv-basis": Case(
        lambda: dglnn.RelGraphConv(12, 7, num_rels=3, regularizer="basis", num_bases=2),
        _typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.edata["etype"]),
    ),
    "RelGraphConv-bdd": Case(
        lambda: dglnn.RelGraphConv(12, 6, num_rels=3, regularizer="bdd", num_bases=3),
        _typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.edata["etype"]),
    ),
    "HGTConv": Case(
        lambda: dglnn.HGTConv(12, 4, num_heads=2, num_ntypes=2, num_etypes=3),
        _typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.ndata["ntype"], g.edata["etype"]),
    ),
    "RelGraphConv-presorted": Case(
        lambda: dglnn.RelGraphConv(12, 7, num_rels=3),
        _sorted_typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.edata["etype"], presorted=True),
        reads_host=True,
    ),
    "HGTConv-presorted": Case(
        lambda: dglnn.HGTConv(12, 4, num_heads=2, num_ntypes=2, num_etypes=3),
        _sorted_typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.ndata["ntype"], g.edata["etype"], presorted=True),
        reads_host=True,
    ),
    "qtrain-RGATConv": Case(  # qtrain's own RGAT layer, built from DGL's primitives
        lambda: RGATConv(12, 4, 2, num_etypes=3, negative_slope=0.2, self_loop=True),
        _sorted_typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.edata["etype"], presorted=True),
        reads_host=True,
    ),
    "qtrain-RGATConv-compact-reorder": Case(  # with Hector's two optimizations
        lambda: RGATConv(
            12, 4, 2, num_etypes=3, negative_slope=0.2, self_loop=True, compact=True, reorder=True
        ),
        _sorted_typed_graph,
        _nodes(),
        lambda m, g, t: m(g, t["x"], g.edata["etype"], presorted=True),
        reads_host=True,
    ),
    "RelGraphConv-hector": Case(  # the hector plugin: compact pairs, segment GEMM op
        lambda: dglnn.RelGraphConv(12, 7, num_rels=3),
        _sorted_typed_graph,
        _nodes(),
        lambda m, g, t: _under_hector(lambda: m(g, t["x"], g.edata["etype"], presorted=True)),
        reads_host=True,
    ),
    "HGTConv-hector": Case(  # and HGT's keys and messages from products of weights
        lambda: dglnn.HGTConv(12, 4, num_heads=2, num_ntypes=2, num_etypes=3),
        _typed_graph,
        _nodes(),
        lambda m, g, t: _under_hector(lambda: m(g, t["x"], g.ndata["ntype"], g.edata["etype"])),
        reads_host=True,
    ),
    "HeteroGraphConv": Case(
        lambda: dglnn.HeteroGraphConv(
            {
                "follows": dglnn.GraphConv(8, 5, allow_zero_in_degree=True),
                "buys": dglnn.GATConv(8, 5, num_heads=1, allow_zero_in_degree=True),
                "bought-by": dglnn.SAGEConv(8, 5, "mean"),
            },
            aggregate="sum",
        ),
        _heterograph,
        lambda g: {"user": _features(9, 8, 6), "item": _features(6, 8, 7)},
        _hetero_forward,
    ),
    "sampled-blocks-SAGEConv": Case(
        lambda: torch.nn.ModuleList([dglnn.SAGEConv(12, 9, "mean"), dglnn.SAGEConv(9, 4, "mean")]),
        _blocks,
        lambda blocks: {"x": _features(blocks[0].num_src_nodes(), 12, 8)},
        _block_forward,
    ),
    "sampled-blocks-GATConv": Case(
        lambda: torch.nn.ModuleList([dglnn.GATConv(12, 3, 2), dglnn.GATConv(6, 4, 1)]),
        _blocks,
        lambda blocks: {"x": _features(blocks[0].num_src_nodes(), 12, 9)},
        lambda m, blocks, t: _block_forward_flat(m, blocks, t),
    ),
}


def _under_hector(forward: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The forward under the hector plugin (its backward needs no patch: autograd runs the
    op library's backward and DGL's primitives through the route)."""
    import qtrain

    with qtrain.patch("hector"):
        return forward()


def _block_forward_flat(
    module: torch.nn.Module, blocks: list[Any], t: dict[str, torch.Tensor]
) -> torch.Tensor:
    h = t["x"]
    for layer, block in zip(module, blocks, strict=True):
        h = layer(block, (h, h[: block.num_dst_nodes()])).flatten(1)
    return h


def _graph_to(graph: Any, device: str) -> Any:
    if isinstance(graph, list):
        return [route.to_device(block, device) for block in graph]
    return route.to_device(graph, device)


def _train_step(
    case: Case, device: str | None, dropout: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward and backward of ``case``; ``device`` None runs DGL's own kernels.

    ``dropout=False`` sets every dropout rate to 0: a GPU draws its masks from another
    generator than the CPU (HGTConv drops 20% by default). The module stays in training
    mode, because cuDNN's LSTM (SAGEConv's lstm aggregator) has no backward in eval mode.
    """
    torch.manual_seed(0)
    module = case.module()
    if not dropout:
        for layer in module.modules():
            if isinstance(layer, torch.nn.Dropout):
                layer.p = 0.0
    graph = case.graph()
    inputs = {k: v.requires_grad_() for k, v in case.inputs(graph).items()}
    if device is not None:
        module = module.to(device)
        inputs = {k: v.detach().to(device).requires_grad_() for k, v in inputs.items()}
        graph = _graph_to(graph, device)
    out = case.forward(module, graph, inputs)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
    (out * weights).sum().backward()
    params = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
    return out.detach(), {k: v.grad for k, v in inputs.items()}, params


@pytest.mark.parametrize("name", list(CASES))
def test_module_on_the_cpu_route_matches_dgl(name: str) -> None:
    want, want_inputs, want_params = _train_step(CASES[name], None)
    got, got_inputs, got_params = _train_step(CASES[name], "cpu")
    assert "cpu" in route.enabled_devices()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert got_params.keys() == want_params.keys() and want_params
    for key, grad in want_inputs.items():
        torch.testing.assert_close(got_inputs[key], grad, rtol=1e-4, atol=1e-4, msg=key)
    for key, grad in want_params.items():
        torch.testing.assert_close(got_params[key], grad, rtol=1e-4, atol=1e-4, msg=key)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if not case.reads_host])
def test_module_runs_on_a_device_without_touching_the_cpu(name: str) -> None:
    out, inputs, params = _train_step(CASES[name], "meta")
    assert out.device.type == "meta"
    assert all(g.device.type == "meta" for g in [*inputs.values(), *params.values()])
    assert params


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", list(CASES))
def test_module_on_cuda_matches_the_cpu_kernels(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the same comparison on a GPU (`make gpu-check` runs it): cuSPARSE products and CUDA
    # scatters sum in another order than DGL's CPU kernels, hence the looser tolerance.
    # cuDNN's LSTM (SAGEConv's lstm aggregator) would run in TF32 by default.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    want, want_inputs, want_params = _train_step(CASES[name], None, dropout=False)
    got, got_inputs, got_params = _train_step(CASES[name], "cuda", dropout=False)
    assert got.device.type == "cuda" and "cuda" in route.enabled_devices()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-3, atol=1e-4)
    assert got_params.keys() == want_params.keys() and want_params
    for key, grad in want_inputs.items():
        torch.testing.assert_close(got_inputs[key].cpu(), grad, rtol=1e-3, atol=1e-4, msg=key)
    for key, grad in want_params.items():
        torch.testing.assert_close(got_params[key].cpu(), grad, rtol=1e-3, atol=1e-4, msg=key)


def test_the_route_really_ran() -> None:
    """The CPU comparison above is not DGL against itself: the route's kernels were called."""
    from qtrain.ops import dispatch

    dispatch.reset()
    _train_step(CASES["GATConv"], "cpu")
    counts = dispatch.snapshot()
    assert counts["spmm"]["route"] >= 1 and counts["sddmm"]["route"] >= 1
    assert counts["edge_softmax"]["route"] >= 1
