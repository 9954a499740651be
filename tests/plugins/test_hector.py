"""The hector plugin on DGL's own RelGraphConv, HGTConv and TypedLinear: every option
against DGL's forward and gradients (whole graph and mini-batch block, sorted and
unsorted edges, a hub, nodes without in-edges), the compact layout's row counts, the
patches undone, and recipes that train with it alone and under tango."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import qtrain
from qtrain._compat import import_dgl
from qtrain.data.base import ETYPE, NTYPE
from qtrain.models.compact import compact_index
from qtrain.ops import dispatch

dgl = import_dgl()

NTYPES, ETYPES = 3, 5
OPTIONS = [
    dict(zip(("typed_gemm", "compact", "reorder"), flags, strict=True))
    for flags in itertools.product([False, True], repeat=3)
    if any(flags)
]


def _named(options: dict[str, bool]) -> str:
    return "+".join(name for name, on in options.items() if on)


def typed_graph(seed: int = 0, nodes: int = 40, edges: int = 160, sort: bool = True) -> Any:
    """A random graph with node and edge types: nodes grouped by type, a hub source with
    many edges of one relation, the last node with no in-edge; edges sorted by type when
    ``sort`` (the presorted form) or in random order."""
    g = torch.Generator().manual_seed(seed)
    ntype = torch.sort(torch.randint(0, NTYPES, (nodes,), generator=g)).values
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes - 1, (edges,), generator=g)
    etype = torch.randint(0, ETYPES, (edges,), generator=g)
    src[:30], etype[:30] = 3, 1  # the hub
    etype[etype == 4] = 3  # relation 4 has no edge: an empty segment
    if sort:
        order = torch.argsort(etype, stable=True)
        src, dst, etype = src[order], dst[order], etype[order]
    graph = dgl.graph((src, dst), num_nodes=nodes)
    graph.ndata[NTYPE], graph.edata[ETYPE] = ntype, etype
    return graph


def run(
    build: Callable[[], torch.nn.Module],
    call: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    plugin: dict[str, bool] | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Output, parameter gradients and input gradient of one forward and backward."""
    torch.manual_seed(0)
    layer = build()
    x = x.clone().requires_grad_(True)

    def step() -> torch.Tensor:
        out = call(layer, x)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach()

    if plugin is None:
        out = step()
    else:
        with qtrain.patch("hector", **plugin):
            out = step()
    grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    return out, grads, x.grad


def assert_same_layer(build: Any, call: Any, x: torch.Tensor, plugin: dict[str, bool]) -> None:
    want, want_grads, want_x = run(build, call, x, None)
    got, got_grads, got_x = run(build, call, x, plugin)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_x, want_x, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def _block(graph: Any) -> Any:
    """A full-neighbour block to half the nodes (its edges come unsorted)."""
    seeds = torch.arange(0, graph.num_nodes(), 2)
    block = dgl.to_block(dgl.in_subgraph(graph, seeds), seeds)
    return block


@pytest.mark.parametrize("plugin", OPTIONS, ids=_named)
@pytest.mark.parametrize(
    "layer",
    [
        {},
        {"regularizer": "basis", "num_bases": 2},
        {"self_loop": False, "bias": False},
        {"layer_norm": True, "activation": torch.relu},
    ],
    ids=["plain", "basis", "no-loop", "norm-relu"],
)
@pytest.mark.parametrize("form", ["presorted", "unsorted", "block", "norm"])
def test_rgcn_matches_dgl(plugin: dict[str, bool], layer: dict[str, Any], form: str) -> None:
    graph = typed_graph(sort=form != "unsorted")
    if form == "block":
        graph = _block(graph)
    x = torch.randn(graph.num_src_nodes(), 6, generator=torch.Generator().manual_seed(1))
    norm = torch.rand(graph.num_edges(), 1) if form == "norm" else None

    def build() -> torch.nn.Module:
        return dgl.nn.RelGraphConv(6, 5, ETYPES, **layer)

    def call(conv: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        return conv(graph, h, graph.edata[ETYPE], norm, presorted=form in ("presorted", "norm"))

    assert_same_layer(build, call, x, plugin)


@pytest.mark.parametrize("plugin", OPTIONS, ids=_named)
@pytest.mark.parametrize(
    "shape", [(6, 3, 2), (6, 6, 1), (4, 4, 1)], ids=["2-heads-residual", "1-head", "in=out"]
)
@pytest.mark.parametrize("form", ["presorted", "unsorted", "block"])
def test_hgt_matches_dgl(plugin: dict[str, bool], shape: tuple[int, int, int], form: str) -> None:
    in_size, head_size, heads = shape
    graph = typed_graph(sort=form != "unsorted")
    if form == "block":
        graph = _block(graph)
    x = torch.randn(graph.num_src_nodes(), in_size, generator=torch.Generator().manual_seed(2))

    def build() -> torch.nn.Module:
        conv = dgl.nn.HGTConv(in_size, head_size, heads, NTYPES, ETYPES, use_norm=heads == 2)
        with torch.no_grad():  # DGL starts every priority at 1 and every skip at 1
            for p in conv.relation_pri:
                p.uniform_(0.5, 1.5)
            conv.skip.uniform_(-1, 1)
        return conv

    def call(conv: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        ntype = graph.srcdata[NTYPE]
        return conv(graph, h, ntype, graph.edata[ETYPE], presorted=form == "presorted")

    assert_same_layer(build, call, x, plugin)


@pytest.mark.parametrize("sorted_by_type", [True, False])
def test_typed_linear_runs_the_segment_gemm_op(sorted_by_type: bool) -> None:
    """Both of TypedLinear's paths become one segment_matmul forward (and two backward),
    counted as the compiled kernel; a relation without rows is an empty segment."""
    types = torch.tensor([0, 0, 2, 2, 2, 3])
    if not sorted_by_type:
        types = types[torch.tensor([4, 0, 5, 2, 1, 3])]
    x = torch.randn(6, 7)

    def build() -> torch.nn.Module:
        return dgl.nn.TypedLinear(7, 3, 4)

    def call(linear: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        return linear(h, types, sorted_by_type)

    dispatch.reset()
    assert_same_layer(build, call, x, {"typed_gemm": True, "compact": False, "reorder": False})
    assert dispatch.snapshot().get("segment_matmul") == {"ext-cpu": 1}


def test_compact_layer_computes_one_row_per_source_relation_pair() -> None:
    """Under the plugin RelGraphConv's typed product has one row per (source, relation)
    pair, not one per edge: the hub's thirty edges of one relation are one row."""
    graph = typed_graph()
    etype = graph.edata[ETYPE]
    src, _ = graph.edges()
    pairs = {(int(u), int(r)) for u, r in zip(src, etype, strict=True)}
    rows: list[int] = []
    policy = {"plugin": ["hector", "trace"], "trace": {"log": True, "dense": False}}
    with qtrain.patch(policy) as session:
        dgl.nn.RelGraphConv(6, 5, ETYPES)(graph, torch.randn(40, 6), etype, presorted=True)
        trace = session.plugins[1]
        rows = [shapes[0][0] for primitive, _, shapes in trace.log if primitive == "segment_mm"]
    assert rows == [len(pairs)]
    assert len(pairs) < graph.num_edges() - 25
    index = compact_index(graph, etype, ETYPES)
    assert torch.equal(index.src.node[index.src.of_edge], src)
    assert torch.equal(index.src.rel[index.src.of_edge], etype)
    assert compact_index(graph, etype, ETYPES) is index  # kept per graph
    etype[0] = etype[0]  # a write (the version moves): the index is built again
    assert compact_index(graph, etype, ETYPES) is not index


def test_patches_are_undone() -> None:
    forwards = dgl.nn.RelGraphConv.forward, dgl.nn.HGTConv.forward
    segment_mm, gather_mm = dgl.ops.segment_mm, dgl.ops.gather_mm
    with qtrain.patch("hector"):
        assert dgl.nn.RelGraphConv.forward is not forwards[0]
        assert dgl.nn.HGTConv.forward is not forwards[1]
        assert dgl.ops.segment_mm is not segment_mm
    assert (dgl.nn.RelGraphConv.forward, dgl.nn.HGTConv.forward) == forwards
    assert (dgl.ops.segment_mm, dgl.ops.gather_mm) == (segment_mm, gather_mm)


def test_a_relation_index_out_of_range_is_refused() -> None:
    with qtrain.patch("hector"), pytest.raises(ValueError, match=r"type ids must be in \[0, 3\)"):
        dgl.nn.TypedLinear(4, 2, 3)(torch.randn(5, 4), torch.tensor([0, 1, 5, 2, 2]))


def _train(tmp_path: Path, model: str, plugins: list[str], seed: int = 0) -> dict[str, Any]:
    from qtrain.recipe import build_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    raw = {
        "dataset": {"name": "synthetic-hetero-small", "nodes": 1200, "edges": 10_000},
        "model": {"name": model, "hidden": 16},
        "train": {"epochs": 8, "seed": seed},
        "quant": {"plugin": plugins},
        "output": {"dir": str(tmp_path / "-".join([model, *plugins])), "checkpoint": False},
    }
    return execute(build_recipe(raw, "hector"), reporter=Reporter())


@pytest.mark.parametrize("model", ["rgcn", "hgt", "rgat"])
def test_recipes_train_the_same_under_the_plugin(tmp_path: Path, model: str) -> None:
    plain = _train(tmp_path, model, [])
    hector = _train(tmp_path, model, ["hector"])
    assert hector["final_loss"] == pytest.approx(plain["final_loss"], rel=1e-4)
    both = _train(tmp_path, model, ["hector", "tango"])
    assert both["final_loss"] == pytest.approx(plain["final_loss"], rel=0.05)
    assert both["final_loss"] != hector["final_loss"]  # tango quantized something


def test_tango_listed_before_hector_is_refused() -> None:
    from qtrain.errors import PluginError

    with pytest.raises(PluginError, match=r"lists 'tango' before 'hector'; hector must come first"):
        qtrain.patch(["tango", "hector"])
    with pytest.raises(
        PluginError, match=r"\['trace', 'tango', 'hector'\] -> \['trace', 'hector', 'tango'\]"
    ):
        qtrain.patch(["trace", "tango", "hector"])


def test_hector_composes_with_exact(tmp_path: Path) -> None:
    """exact compresses what the compact layers save: the run trains as exact alone does,
    closely (not exactly: other tensors are saved, so other ones are compressed)."""
    exact = _train(tmp_path, "rgcn", ["exact"])
    both = _train(tmp_path, "rgcn", ["hector", "exact"])
    assert both["final_loss"] == pytest.approx(exact["final_loss"], rel=0.05)
    assert both["final_loss"] != _train(tmp_path, "rgcn", ["hector"])["final_loss"]
