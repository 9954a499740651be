"""The lean SAGEConv computes DGL's SAGEConv bit for bit, holding fewer tensors."""

from __future__ import annotations

from typing import Any

import dgl
import pytest
import torch
from dgl.nn import SAGEConv

from qtrain.models.lean_sage import lean_sage_conv


def graph_with_hub(nodes: int = 40, seed: int = 0) -> Any:
    """A hub linked to every node, random edges, and a node with no in-edges."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (4 * nodes,), generator=g)
    dst = torch.randint(1, nodes, (4 * nodes,), generator=g)  # node 0: no in-edges
    hub = torch.arange(1, nodes)
    return dgl.graph(
        (torch.cat([src, torch.zeros_like(hub)]), torch.cat([dst, hub])), num_nodes=nodes
    )


def pair(in_feats: int, out_feats: int, aggregator: str = "mean", **kw: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    dgl_layer = SAGEConv(in_feats, out_feats, aggregator, **kw)
    lean = lean_sage_conv()(in_feats, out_feats, aggregator, **kw)
    lean.load_state_dict(dgl_layer.state_dict())
    return dgl_layer, lean


def forward_backward(layer: Any, graph: Any, x: torch.Tensor, **kw: Any) -> list[torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = layer(graph, x, **kw)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]


@pytest.mark.parametrize(("in_feats", "out_feats"), [(7, 5), (5, 7), (6, 6)])
@pytest.mark.parametrize("idtype", [torch.int64, torch.int32])
def test_the_mean_layer_equals_dgl_bit_for_bit(in_feats: int, out_feats: int, idtype: Any) -> None:
    graph = graph_with_hub().astype(idtype)
    x = torch.randn(graph.num_nodes(), in_feats)
    dgl_layer, lean = pair(in_feats, out_feats)
    for want, got in zip(
        forward_backward(dgl_layer, graph, x), forward_backward(lean, graph, x), strict=True
    ):
        assert torch.equal(want, got)


@pytest.mark.parametrize(
    "case", ["block", "no edges", "edge weights", "gcn aggregator", "activation"]
)
def test_other_cases_match_dgl(case: str) -> None:
    graph, kw, layer_kw, x_rows = graph_with_hub(), {}, {}, None
    aggregator = "mean"
    if case == "block":
        seeds = torch.arange(10)
        graph = dgl.to_block(dgl.in_subgraph(graph, seeds), dst_nodes=seeds)
        x_rows = graph.num_src_nodes()
    elif case == "no edges":
        graph = dgl.graph(([], []), num_nodes=6)
    elif case == "edge weights":
        kw = {"edge_weight": torch.rand(graph.num_edges())}
    elif case == "gcn aggregator":
        aggregator = "gcn"
    else:
        layer_kw = {"activation": torch.relu, "norm": torch.nn.LayerNorm(5)}
    x = torch.randn(x_rows or graph.num_nodes(), 6)
    dgl_layer, lean = pair(6, 5, aggregator, **layer_kw)
    for want, got in zip(
        forward_backward(dgl_layer, graph, x, **kw),
        forward_backward(lean, graph, x, **kw),
        strict=True,
    ):
        assert torch.equal(want, got)


def test_the_aggregation_is_freed_once_projected() -> None:
    """Under no_grad nothing keeps the aggregation: the layer's largest live set is the
    input, the projected aggregation and the output, not DGL's five tensors."""
    graph = graph_with_hub(nodes=2000)
    x = torch.randn(graph.num_nodes(), 64)
    _dgl_layer, lean = pair(64, 64)
    alive: list[int] = []
    original = lean.fc_self.forward

    def fc_self(h: torch.Tensor) -> torch.Tensor:
        import gc

        alive.append(
            sum(
                1
                for o in gc.get_objects()
                if isinstance(o, torch.Tensor) and o.shape == (graph.num_nodes(), 64)
            )
        )
        return original(h)

    lean.fc_self.forward = fc_self
    with torch.no_grad():
        lean(graph, x)
    assert alive == [2]  # x and fc_neigh's output; the aggregation is gone
