"""The relational models (RGCN, RGAT, HGT) on a small relational graph: each layer against
a direct computation of its formula, the whole graph (segment GEMMs) against full-neighbour
blocks (gathers), and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from qtrain._compat import import_dgl
from qtrain.data.base import (
    ETYPE,
    FEAT,
    LABEL,
    NTYPE,
    TEST_MASK,
    TRAIN_MASK,
    VAL_MASK,
    NodeDataset,
    Relations,
)
from qtrain.errors import RecipeError
from qtrain.models import MODELS, build_model
from qtrain.models.rgat import RGATConv
from qtrain.recipe import build_recipe
from qtrain.runner import execute
from qtrain.train.progress import Reporter

RELATIONS = Relations(
    ntypes=("paper", "author", "venue"),
    etypes=(
        ("author", "writes", "paper"),
        ("paper", "cites", "paper"),
        ("venue", "hosts", "paper"),
        ("paper", "written-by", "author"),
    ),
    target="paper",
)


def relational_dataset(seed: int = 0, features: int = 6, classes: int = 3) -> NodeDataset:
    """A random relational graph in the dataset contract: one homogeneous graph, nodes and
    edges grouped by type, a paper with no in-edge of some relations, a hub author."""
    dgl = import_dgl()
    g = torch.Generator().manual_seed(seed)
    counts = {"paper": 12, "author": 7, "venue": 3}
    data = {}
    for s, r, d in RELATIONS.etypes:
        e = 20 if r != "hosts" else 8
        src = torch.randint(0, counts[s], (e,), generator=g)
        dst = torch.randint(0, counts[d], (e,), generator=g)
        if r == "writes":
            src[:6] = 0  # a hub
        data[(s, r, d)] = (src, dst)
    hetero = dgl.heterograph(data, num_nodes_dict=counts)
    graph = dgl.to_homogeneous(hetero)
    # to_homogeneous orders node types by name; the contract wants them in Relations' order
    order = {name: RELATIONS.ntypes.index(name) for name in hetero.ntypes}
    ntype = torch.tensor([order[hetero.ntypes[t]] for t in graph.ndata[dgl.NTYPE].tolist()])
    etype_names = [hetero.canonical_etypes[t] for t in graph.edata[dgl.ETYPE].tolist()]
    etype = torch.tensor([RELATIONS.etypes.index(c) for c in etype_names])
    node_perm = torch.argsort(ntype, stable=True)
    graph = dgl.reorder_graph(
        graph,
        node_permute_algo="custom",
        permute_config={"nodes_perm": node_perm},
        edge_permute_algo="src",
    )
    ntype = ntype[node_perm]
    etype = etype[graph.edata[dgl.EID]]
    edge_perm = torch.argsort(etype, stable=True)
    src, dst = graph.edges()
    graph = dgl.graph((src[edge_perm], dst[edge_perm]), num_nodes=graph.num_nodes())
    n = graph.num_nodes()
    graph.ndata[NTYPE] = ntype
    graph.edata[ETYPE] = etype[edge_perm]
    graph.ndata[FEAT] = torch.randn(n, features, generator=g)
    target = ntype == 0
    graph.ndata[LABEL] = torch.where(target, torch.randint(0, classes, (n,), generator=g), 0)
    split = torch.rand(n, generator=g)
    graph.ndata[TRAIN_MASK] = target & (split < 0.5)
    graph.ndata[VAL_MASK] = target & (split >= 0.5) & (split < 0.75)
    graph.ndata[TEST_MASK] = target & (split >= 0.75)
    return NodeDataset("relational-test", graph, classes, relations=RELATIONS).validate()


def _model(name: str, dataset: NodeDataset, **options: Any) -> Any:
    section = type("Section", (), {})()
    section.name = name
    section.options = MODELS.get(name).parse(options, "model")
    return build_model(section, dataset)


def _blocks(graph: Any, layers: int) -> list[Any]:
    """Full-neighbour blocks of every node: the same computation as the whole graph."""
    dgl = import_dgl()
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(layers)
    _, _, blocks = sampler.sample_blocks(graph, torch.arange(graph.num_nodes()))
    return blocks


def test_rgcn_layer_is_equation_1() -> None:
    data = relational_dataset()
    model = _model("rgcn", data, layers=1).eval()
    graph = model.prepare_graph(data.graph)
    x = graph.ndata[FEAT]
    got = model(graph, x)
    conv = model.layers[0]
    weight = conv.linear_r.get_weight()  # (relations, in, out)
    src, dst = graph.edges()
    etype = graph.edata[ETYPE]
    want = x @ conv.loop_weight + conv.h_bias
    for e in range(graph.num_edges()):
        v, r = int(dst[e]), int(etype[e])
        in_r = int(((dst == v) & (etype == r)).sum())
        want[v] += x[src[e]] @ weight[r] / in_r
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rgat_layer_is_hectors_formula() -> None:
    data = relational_dataset(seed=1)
    graph = data.graph
    conv = RGATConv(6, 4, 2, RELATIONS.num_etypes, 0.2, self_loop=True).eval()
    x = graph.ndata[FEAT]
    got = conv(graph, x, graph.edata[ETYPE], presorted=True)
    weight = conv.linear_r.get_weight()
    src, dst = graph.edges()
    etype = graph.edata[ETYPE]
    want = conv.self_loop(x).view(-1, 2, 4).clone()
    for v in range(graph.num_nodes()):
        edges = (dst == v).nonzero().flatten()
        if len(edges) == 0:
            continue
        msgs, scores = [], []
        for e in edges.tolist():
            r = int(etype[e])
            m = (x[src[e]] @ weight[r]).view(2, 4)
            t = (x[v] @ weight[r]).view(2, 4)
            msgs.append(m)
            scores.append((m * conv.attn_src[r]).sum(-1) + (t * conv.attn_dst[r]).sum(-1))
        a = torch.softmax(F.leaky_relu(torch.stack(scores), 0.2), dim=0)  # (edges, heads)
        want[v] += (a.unsqueeze(-1) * torch.stack(msgs)).sum(0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rgcn", "rgat", "hgt"])
def test_whole_graph_and_full_neighbour_blocks_agree(name: str) -> None:
    """The whole graph takes DGL's segment-GEMM path (grouped by type), blocks its gathers."""
    data = relational_dataset(seed=2)
    model = _model(name, data, layers=2, hidden=5).eval()
    graph = model.prepare_graph(data.graph)
    x = graph.ndata[FEAT]
    whole = model(graph, x)
    assert whole.shape == (graph.num_nodes(), data.num_classes)
    blocks = _blocks(graph, 2)
    assert all(b.is_block for b in blocks)
    by_blocks = model(blocks, x[blocks[0].srcdata[import_dgl().NID]])
    torch.testing.assert_close(
        by_blocks, whole[blocks[-1].dstdata[import_dgl().NID]], rtol=1e-4, atol=1e-5
    )
    # and layer by layer, as mini-batch training evaluates
    layerwise = model.inference(graph, x, batch_size=5, device="cpu")
    torch.testing.assert_close(layerwise, whole, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["rgcn", "rgat", "hgt"])
def test_relational_models_train(name: str) -> None:
    data = relational_dataset(seed=3)
    torch.manual_seed(0)
    extra = {"dropout": 0.0} if name == "hgt" else {}
    model = _model(name, data, layers=2, hidden=8, **extra)
    graph = model.prepare_graph(data.graph)
    x, y, mask = graph.ndata[FEAT], graph.ndata[LABEL], graph.ndata[TRAIN_MASK]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(graph, x)[mask], y[mask])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # fits its few training nodes
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_relational_model_needs_a_relational_dataset() -> None:
    data = relational_dataset()
    homogeneous = NodeDataset("plain", data.graph, data.num_classes)
    for name in ("rgcn", "rgat", "hgt"):
        with pytest.raises(RecipeError, match=f"model '{name}' is relational.*'plain' has one"):
            _model(name, homogeneous)
    assert _model("gcn", data) is not None  # a homogeneous model ignores the types


def _run(tmp_path: Path, model: dict[str, Any], **train: Any) -> dict[str, Any]:
    raw = {
        "model": model,
        "dataset": {"name": "synthetic-hetero-small", "nodes": 1200, "edges": 10_000},
        "train": {"epochs": 30, "lr": 0.01, **train},
        "quant": {"plugin": []},
        "output": {"dir": str(tmp_path / "runs"), "checkpoint": False},
    }
    return execute(build_recipe(raw, "relational"), reporter=Reporter())


def test_per_relation_weights_beat_one_weight_on_a_relational_task(tmp_path: Path) -> None:
    """End to end through the runner: the generator's task rewards a weight per relation."""
    rgcn = _run(tmp_path, {"name": "rgcn", "hidden": 32})
    gcn = _run(tmp_path, {"name": "gcn", "hidden": 32})
    assert rgcn["test_acc"] > gcn["test_acc"] + 0.1, (rgcn["test_acc"], gcn["test_acc"])


def test_relational_models_train_on_mini_batches(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        {"name": "rgcn", "hidden": 16},
        epochs=3,
        mode="minibatch",
        fanouts=[5, 5],
        batch_size=256,
    )
    assert done["test_acc"] > 1.0 / 4 + 0.1  # above chance (4 classes)


@pytest.mark.parametrize(("compact", "reorder"), [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("on", ["whole graph", "blocks"])
def test_hectors_optimizations_give_the_plain_rgat(compact: bool, reorder: bool, on: str) -> None:
    """Compact materialization and operator reordering change how RGAT computes, not what:
    outputs and every gradient equal the per-edge form's."""
    data = relational_dataset(seed=4)
    graph = data.graph
    x0 = graph.ndata[FEAT]

    def run(**options: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        conv = RGATConv(6, 4, 2, RELATIONS.num_etypes, 0.2, self_loop=True, **options)
        x = x0.clone().requires_grad_()
        if on == "whole graph":
            out = conv(graph, x, graph.edata[ETYPE], presorted=True)
        else:
            block = _blocks(graph, 1)[0]
            src_x = x[block.srcdata[import_dgl().NID]]
            out = conv(block, src_x, block.edata[ETYPE], presorted=False)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads = {name: p.grad for name, p in conv.named_parameters()}
        return out.detach(), grads, x.grad

    want, want_grads, want_x = run()
    got, got_grads, got_x = run(compact=compact, reorder=reorder)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_x, want_x, rtol=1e-5, atol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_compact_materialization_computes_a_message_per_pair_not_per_edge() -> None:
    """The hub author writes six papers: its messages exist once per relation it uses."""
    from qtrain.models.compact import compact_index

    data = relational_dataset()
    graph, etype = data.graph, data.graph.edata[ETYPE]
    index = compact_index(graph, etype, RELATIONS.num_etypes)
    src, _ = graph.edges()
    pairs = {(int(u), int(r)) for u, r in zip(src, etype, strict=True)}
    assert len(index.src) == len(pairs) < graph.num_edges()
    # each edge's pair is its own (source, relation), pairs grouped by relation
    assert torch.equal(index.src.node[index.src.of_edge], src)
    assert torch.equal(index.src.rel[index.src.of_edge], etype)
    assert bool((index.src.rel[1:] >= index.src.rel[:-1]).all())
    assert int(index.src.lengths.sum()) == len(index.src)
    assert compact_index(graph, etype, RELATIONS.num_etypes) is index  # once per graph


def test_rgat_trains_with_both_optimizations(tmp_path: Path) -> None:
    plain = _run(tmp_path, {"name": "rgat", "hidden": 16}, epochs=5)
    both = _run(
        tmp_path, {"name": "rgat", "hidden": 16, "compact": True, "reorder": True}, epochs=5
    )
    assert both["final_loss"] == pytest.approx(plain["final_loss"], rel=1e-4)
