"""Models: every registered model runs forward and backward on graphs and blocks.

Models are built from DGL's own ``dgl.nn`` modules only (plugins patch DGL, so
a model that owned its convolution code would escape them), and layer-wise
inference over full-neighbour blocks must compute what the full-graph forward
computes, or mini-batch evaluation would measure a different model.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from qtrain._compat import import_dgl

dgl = import_dgl()

from qtrain.data.base import NodeDataset  # noqa: E402
from qtrain.models import MODELS, GNNModel, build_model  # noqa: E402
from qtrain.recipe import ModelSection  # noqa: E402

NODES, FEATS, CLASSES = 60, 12, 5
ALL_MODELS = ["gcn", "sage", "gat", "gcnii"]
MINIBATCH_MODELS = ["gcn", "sage", "gat"]


@pytest.fixture
def dataset() -> NodeDataset:
    torch.manual_seed(0)
    dgl.seed(0)
    g = dgl.rand_graph(NODES, 400)
    g = dgl.add_edges(g, [0, 1], [1, 0])  # a self-loop-free graph with one isolated-ish pair
    g.ndata["feat"] = torch.randn(NODES, FEATS)
    g.ndata["label"] = torch.randint(0, CLASSES, (NODES,))
    return NodeDataset("random", g, CLASSES)


def make(name: str, dataset: NodeDataset, **options: object) -> GNNModel:
    entry = MODELS.get(name)
    return build_model(ModelSection(name, entry.parse(dict(options), "model")), dataset)


def test_registry_lists_the_models() -> None:
    assert set(ALL_MODELS) <= set(MODELS.names())


@pytest.mark.parametrize("name", ALL_MODELS)
def test_full_graph_forward_backward(name: str, dataset: NodeDataset) -> None:
    model = make(name, dataset)
    graph = model.prepare_graph(dataset.graph)
    logits = model(graph, graph.ndata["feat"])
    assert logits.shape == (NODES, CLASSES)
    assert torch.isfinite(logits).all()
    logits.logsumexp(1).mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", MINIBATCH_MODELS)
def test_blocks_forward_backward(name: str, dataset: NodeDataset) -> None:
    model = make(name, dataset)
    assert model.supports_minibatch
    graph = model.prepare_graph(dataset.graph)
    sampler = dgl.dataloading.NeighborSampler([3] * len(model.layers))
    loader = dgl.dataloading.DataLoader(graph, torch.arange(20), sampler, batch_size=8)
    input_nodes, output_nodes, blocks = next(iter(loader))
    logits = model(blocks, graph.ndata["feat"][input_nodes])
    assert logits.shape == (len(output_nodes), CLASSES)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", MINIBATCH_MODELS)
def test_layerwise_inference_matches_full_graph(name: str, dataset: NodeDataset) -> None:
    model = make(name, dataset, layers=3).eval()
    graph = model.prepare_graph(dataset.graph)
    x = graph.ndata["feat"]
    with torch.no_grad():
        full = model(graph, x)
    layerwise = model.inference(graph, x, batch_size=7, device="cpu")
    torch.testing.assert_close(layerwise, full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", MINIBATCH_MODELS)
@pytest.mark.parametrize("batch_size", [0, NODES, NODES + 1])
def test_inference_at_once_is_the_full_graph_forward_without_sampling(
    name: str, batch_size: int, dataset: NodeDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``eval_batch_size = 0`` (or one batch holding every node): no block is sampled."""
    model = make(name, dataset).eval()
    graph = model.prepare_graph(dataset.graph)
    x = graph.ndata["feat"]
    with torch.no_grad():
        full = model(graph, x)

    def no_sampling(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("inference sampled blocks")

    monkeypatch.setattr(dgl.dataloading, "DataLoader", no_sampling)
    at_once = model.inference(graph, x, batch_size=batch_size, device="cpu")
    torch.testing.assert_close(at_once, full)


@pytest.mark.parametrize("fanout", [-1, 3])  # all neighbours; sampled (in-edges dropped)
def test_gcn_block_inputs_compute_the_edge_weighted_layer(
    fanout: int, dataset: NodeDataset
) -> None:
    """Where every destination keeps its in-edges, scaling the sources replaces the
    edge weights (a faster aggregation), with the same result; elsewhere the weights stay."""
    model = make("gcn", dataset, layers=1)
    graph = model.prepare_graph(dataset.graph)
    seeds = torch.arange(0, NODES, 3)
    if fanout < 0:
        block = dgl.to_block(dgl.in_subgraph(graph, seeds), seeds)
    else:
        block = dgl.to_block(dgl.sampling.sample_neighbors(graph, seeds, fanout), seeds)
    x = graph.ndata["feat"][block.srcdata[dgl.NID]]
    scale = model.source_scale(block)
    assert (scale is None) == (fanout > 0)  # the dataset's nodes have more in-edges than 3
    rows, weights = model.conv_inputs(block, x)
    assert (weights is None) == (fanout < 0)
    conv = model.layers[0]
    expected = conv(block, x, edge_weight=model.block_weights(block))
    torch.testing.assert_close(conv(block, rows, edge_weight=weights), expected)
    assert model.source_scale(block) is scale  # kept per block
    if fanout < 0:  # and that is the full-graph GCN on these nodes
        torch.testing.assert_close(expected, conv(graph, graph.ndata["feat"])[seeds])


def test_gcnii_defaults_are_deep_and_full_graph_only(dataset: NodeDataset) -> None:
    model = make("gcnii", dataset)
    assert len(model.layers) == 16
    assert not model.supports_minibatch
    conv = model.layers[0]
    assert type(conv).__name__ == "GCN2Conv"
    assert conv.alpha == pytest.approx(0.1)
    assert conv.beta == pytest.approx(math.log(0.5 / 1 + 1))  # lambda 0.5, layer 1
    assert MODELS.get("gcnii").parse({"lambda": 1.0}, "model").lambda_ == 1.0
    assert model.output_layer is model.output_linear
    with pytest.raises(ValueError, match="mini-batch"):
        model([dataset.graph] * 16, dataset.graph.ndata["feat"])


@pytest.mark.parametrize(
    ("name", "conv"),
    [("gcn", "GraphConv"), ("sage", "SAGEConv"), ("gat", "GATConv"), ("gcnii", "GCN2Conv")],
)
def test_layers_are_dgl_modules(name: str, conv: str, dataset: NodeDataset) -> None:
    model = make(name, dataset, layers=3)
    assert len(model.layers) == 3
    for layer in model.layers:
        # DGL's own layer class; GraphSAGE's is a subclass with a leaner mean forward
        # (qtrain/models/lean_sage.py): the same parameters and results
        assert isinstance(layer, getattr(dgl.nn, conv))
        dgl_class = next(c for c in type(layer).__mro__ if c.__module__.startswith("dgl.nn."))
        assert dgl_class.__name__ == conv
    if name != "gcnii":
        assert model.output_layer is model.layers[-1]
    assert dict(model.named_modules())[model.output_layer_name] is model.output_layer


def test_model_options(dataset: NodeDataset) -> None:
    gat = make("gat", dataset, heads=4, out_heads=2, hidden=6)
    assert gat.layers[0]._num_heads == 4 and gat.layers[0]._out_feats == 6
    assert gat.layers[1]._num_heads == 2 and gat.layers[1].fc.in_features == 24
    sage = make("sage", dataset, aggregator="gcn", hidden=32)
    assert sage.layers[0]._aggre_type == "gcn" and sage.layers[0]._out_feats == 32
    gcn = make("gcn", dataset)
    assert gcn.layers[0]._norm == "both" and gcn.layers[0]._out_feats == 16


def test_self_loops(dataset: NodeDataset) -> None:
    graph = dgl.add_self_loop(dataset.graph)  # a loop already there is not doubled
    for name in ("gcn", "gat", "gcnii"):
        prepared = make(name, dataset).prepare_graph(graph)
        src, dst = prepared.edges()
        assert int((src == dst).sum()) == NODES
    sage = make("sage", dataset).prepare_graph(dataset.graph)
    assert sage.num_edges() == dataset.graph.num_edges()


def test_unknown_option_names_the_key(dataset: NodeDataset) -> None:
    from qtrain.errors import RecipeError

    with pytest.raises(RecipeError, match=r"unknown key model\.heads"):
        make("gcn", dataset, heads=2)
    with pytest.raises(RecipeError, match=r"model\.aggregator = 'max' is not allowed"):
        make("sage", dataset, aggregator="max")


@pytest.mark.parametrize("name", ["gcn", "sage"])
@pytest.mark.parametrize("plugins", [[], ["exact"]])
def test_a_layers_input_is_freed_once_nothing_saved_it(
    name: str, plugins: list[str], dataset: NodeDataset
) -> None:
    """The forward hands each layer its input without keeping a reference: under exact
    (ReLU and dropout save 1-bit masks) the previous layer's output is freed before the
    next convolution runs; without it, ReLU saved its output, which stays."""
    from torch.multiprocessing.reductions import StorageWeakRef

    import qtrain

    model = make(name, dataset, layers=3, dropout=0.5)
    graph = model.prepare_graph(dataset.graph)
    seen: list[StorageWeakRef] = []
    alive_at_conv: list[bool] = []
    model.dropout.register_forward_pre_hook(
        lambda m, a: seen.append(StorageWeakRef(a[0].untyped_storage()))
    )
    for conv in list(model.layers)[1:]:
        conv.register_forward_pre_hook(lambda m, a: alive_at_conv.append(not seen[-1].expired()))
    with qtrain.patch({"plugin": plugins}):
        model(graph, graph.ndata["feat"]).sum().backward()
    assert alive_at_conv == [not plugins] * 2
