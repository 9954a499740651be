"""Every plugin runs every ``dgl.nn.pytorch.conv`` module DGL's CPU build can run (issue 25).

Each case builds one module and its inputs: a 40-node random graph with self-loops, odd
feature widths, and whatever else the module takes (edge weights, edge and node types,
positions, edge features), on a homogeneous graph, a sampled block, a heterograph, a dense
or a ``torch.sparse`` adjacency. It runs forward and backward once without a plugin and
once under each plugin, with the same weights and inputs:

* nothing may raise, outputs and gradients must be finite, and no gradient may go
  missing: an operand a plugin cannot handle stays float32 (and is reported);
* ``trace`` changes no numbers: outputs and gradients are bit-identical;
* ``tango`` (its defaults: 8 bits, stochastic rounding) moves the output by less than
  ``TANGO_OUTPUT_BOUND`` (relative L2 error), and its gradients point where the float32
  ones do (cosine similarity over all of them above ``TANGO_GRAD_COSINE``);
* ``exact`` compresses only what autograd saves for backward, so the forward output is
  float32's; at its default 2 bits per saved value its gradients are unbiased but noisy
  (a bias feeding a BatchNorm has a true gradient of 0 and gets noise of the size of the
  weight gradients), so they need only be finite; at 8 bits they must match.

A few modules do more with a quantization error than a product does (a variance, the
reciprocal of a distance taken by cancellation): their looser bounds are listed with the
reason. The loss is a fixed random weighting of every output element: a plain sum would
give modules that normalize their output (BatchNorm, softmax) an exactly zero gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import qtrain
from qtrain._compat import import_dgl
from qtrain.ops import dispatch

dgl = import_dgl()
conv = dgl.nn.pytorch.conv

pytestmark = [
    # DGL's GroupRevRes frees storage through the deprecated TypedStorage
    pytest.mark.filterwarnings("ignore:TypedStorage is deprecated"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
]

N = 40  # nodes: N * F is above exact's MIN_NUMEL (256), so node activations get compressed
F = 7  # an odd feature width: no kernel may assume a multiple of 8
FE = 5  # edge feature width

# 8-bit tango quantizes each operand of each GEMM / SpMM / SDDMM with one scale per tensor
# (stochastic rounding: unbiased, error below 1/127 of the operand's largest magnitude per
# element); through the one to four chained products of these modules the output moved by
# 0.6% to 3%, at most 4.9%, over 12 seeds of weights and inputs (TANGO_LOOSER excepted)
TANGO_OUTPUT_BOUND = 0.1
# cosine similarity of all of a step's gradients to float32's: 0.96 to 1.0 measured
TANGO_GRAD_COSINE = 0.95
# exact leaves the forward alone: at most float32 rounding of re-associated sums may differ
EXACT_OUTPUT_BOUND = 1e-5
# exact at 8 bits: a saved value is within 1/255 of its row's range; cosine 0.9998 or more
# measured
EXACT8_GRAD_COSINE = 0.99


@dataclass(frozen=True)
class Case:
    """A module, its inputs and how to call it. ``floats`` are the float inputs that get
    gradients; ``call(module, *floats)`` returns a tensor, a tuple or a dict of them."""

    module: nn.Module
    floats: tuple[torch.Tensor, ...]
    call: Callable[..., Any]


def _graph(self_loops: bool = True) -> Any:
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, N, (160,), generator=gen)
    dst = torch.randint(0, N, (160,), generator=gen)
    g = dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=N))
    return dgl.add_self_loop(g) if self_loops else g


def _block() -> Any:
    """A block (message flow graph) as mini-batch training samples one: all in-edges of 8
    seed nodes, the seeds first among the sources."""
    seeds = torch.arange(8)
    return dgl.to_block(dgl.in_subgraph(_graph(), seeds), seeds)


def _hetero() -> Any:
    gen = torch.Generator().manual_seed(1)
    users, items = 12, 9

    def edges(n_src: int, n_dst: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randint(0, n_src, (n,), generator=gen),
            torch.randint(0, n_dst, (n,), generator=gen),
        )

    follows = edges(users, users, 30)
    plays = edges(users, items, 25)
    return dgl.heterograph(
        {
            ("user", "follows", "user"): follows,
            ("user", "plays", "item"): plays,
            ("item", "played-by", "user"): (plays[1], plays[0]),
        },
        num_nodes_dict={"user": users, "item": items},
    )


def _adjacency(g: Any) -> torch.Tensor:
    """Dense [dst, src] adjacency of ``g`` (the Dense* convs' layout)."""
    src, dst = g.edges()
    adj = torch.zeros(g.num_dst_nodes(), g.num_src_nodes())
    adj[dst, src] = 1.0
    return adj


def _etypes(g: Any, k: int) -> torch.Tensor:
    return torch.arange(g.num_edges()) % k


# ------------------------------------------------------------------ the cases

CaseFactory = Callable[[], Case]
CASES: dict[str, CaseFactory] = {}


def case(name: str) -> Callable[[CaseFactory], CaseFactory]:
    def add(factory: CaseFactory) -> CaseFactory:
        assert name not in CASES, name
        CASES[name] = factory
        return factory

    return add


def _node_case(module: nn.Module, width: int = F) -> Case:
    """A module called as ``module(g, x)`` on the homogeneous graph."""
    g = _graph()
    return Case(module, (torch.randn(g.num_nodes(), width),), lambda m, x: m(g, x))


@case("GraphConv")
def _() -> Case:
    return _node_case(conv.GraphConv(F, 5))


@case("GraphConv-edge_weight")
def _() -> Case:
    g = _graph()
    w = torch.rand(g.num_edges()) + 0.1
    return Case(
        conv.GraphConv(F, 5), (torch.randn(N, F), w), lambda m, x, w: m(g, x, edge_weight=w)
    )


@case("GraphConv-right-aggregate_first")
def _() -> Case:
    return _node_case(conv.GraphConv(4, 9, norm="right"), width=4)


@case("GraphConv-block")
def _() -> Case:
    b = _block()
    return Case(conv.GraphConv(F, 5), (torch.randn(b.num_src_nodes(), F),), lambda m, x: m(b, x))


@case("EdgeWeightNorm")
def _() -> Case:
    g = _graph()
    w = torch.rand(g.num_edges()) + 0.1
    return Case(conv.EdgeWeightNorm(norm="both"), (w,), lambda m, w: m(g, w))


@case("GATConv")
def _() -> Case:
    return _node_case(conv.GATConv(F, 3, num_heads=2))


@case("GATConv-block")
def _() -> Case:
    b = _block()
    return Case(
        conv.GATConv((F, 6), 3, num_heads=2),
        (torch.randn(b.num_src_nodes(), F), torch.randn(b.num_dst_nodes(), 6)),
        lambda m, xs, xd: m(b, (xs, xd)),
    )


@case("GATv2Conv")
def _() -> Case:
    return _node_case(conv.GATv2Conv(F, 3, num_heads=2))


@case("EGATConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.EGATConv(F, FE, 4, 3, num_heads=2),
        (torch.randn(N, F), torch.randn(g.num_edges(), FE)),
        lambda m, x, e: m(g, x, e),
    )


@case("EdgeGATConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.EdgeGATConv(F, FE, 4, num_heads=2),
        (torch.randn(N, F), torch.randn(g.num_edges(), FE)),
        lambda m, x, e: m(g, x, e),
    )


@case("TAGConv")
def _() -> Case:
    return _node_case(conv.TAGConv(F, 4, k=2))


@case("RelGraphConv")
def _() -> Case:
    g = _graph()
    etypes = _etypes(g, 3)
    return Case(
        conv.RelGraphConv(F, 4, num_rels=3), (torch.randn(N, F),), lambda m, x: m(g, x, etypes)
    )


@case("RelGraphConv-basis-norm")
def _() -> Case:
    g = _graph()
    etypes = _etypes(g, 3)
    norm = torch.rand(g.num_edges(), 1)
    return Case(
        conv.RelGraphConv(F, 4, num_rels=3, regularizer="basis", num_bases=2),
        (torch.randn(N, F),),
        lambda m, x: m(g, x, etypes, norm),
    )


@case("RelGraphConv-bdd-presorted")
def _() -> Case:
    g = _graph()
    etypes = torch.sort(_etypes(g, 3)).values  # edges already grouped by type: segment_mm
    return Case(
        conv.RelGraphConv(8, 4, num_rels=3, regularizer="bdd", num_bases=2),
        (torch.randn(N, 8),),
        lambda m, x: m(g, x, etypes, presorted=True),
    )


for _aggregator in ("mean", "gcn", "pool", "lstm"):

    @case(f"SAGEConv-{_aggregator}")
    def _(aggregator: str = _aggregator) -> Case:
        return _node_case(conv.SAGEConv(F, 5, aggregator))


@case("SAGEConv-block")
def _() -> Case:
    b = _block()
    return Case(
        conv.SAGEConv(F, 5, "mean"), (torch.randn(b.num_src_nodes(), F),), lambda m, x: m(b, x)
    )


@case("SGConv")
def _() -> Case:
    return _node_case(conv.SGConv(F, 4, k=2))


@case("APPNPConv")
def _() -> Case:
    return _node_case(conv.APPNPConv(k=3, alpha=0.1))


@case("GINConv-sum")
def _() -> Case:
    return _node_case(conv.GINConv(nn.Linear(F, 4), "sum", learn_eps=True))


@case("GINConv-max")
def _() -> Case:
    return _node_case(conv.GINConv(nn.Linear(F, 4), "max"))


@case("GINConv-block")
def _() -> Case:
    b = _block()
    return Case(
        conv.GINConv(nn.Linear(F, 4), "mean"),
        (torch.randn(b.num_src_nodes(), F),),
        lambda m, x: m(b, x),
    )


@case("GINEConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.GINEConv(nn.Linear(F, 4)),
        (torch.randn(N, F), torch.randn(g.num_edges(), F)),
        lambda m, x, e: m(g, x, e),
    )


@case("GatedGraphConv")
def _() -> Case:
    g = _graph()
    etypes = _etypes(g, 2)
    return Case(
        conv.GatedGraphConv(F, 8, n_steps=2, n_etypes=2),
        (torch.randn(N, F),),
        lambda m, x: m(g, x, etypes),
    )


@case("GatedGCNConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.GatedGCNConv(F, FE, F),
        (torch.randn(N, F), torch.randn(g.num_edges(), FE)),
        lambda m, x, e: m(g, x, e),
    )


@case("GMMConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.GMMConv(F, 4, dim=2, n_kernels=3),
        (torch.randn(N, F), torch.rand(g.num_edges(), 2)),
        lambda m, x, pseudo: m(g, x, pseudo),
    )


@case("ChebConv")
def _() -> Case:
    g = _graph()
    # lambda_max given: DGL's own estimate runs ARPACK from a random start vector
    return Case(conv.ChebConv(F, 4, k=3), (torch.randn(N, F),), lambda m, x: m(g, x, [1.9]))


@case("AGNNConv")
def _() -> Case:
    return _node_case(conv.AGNNConv())


for _aggregator in ("mean", "sum", "max"):

    @case(f"NNConv-{_aggregator}")
    def _(aggregator: str = _aggregator) -> Case:
        g = _graph()
        return Case(
            conv.NNConv(F, 4, nn.Linear(FE, F * 4), aggregator),
            (torch.randn(N, F), torch.randn(g.num_edges(), FE)),
            lambda m, x, e: m(g, x, e),
        )


@case("DenseGraphConv")
def _() -> Case:
    adj = _adjacency(_graph())
    return Case(conv.DenseGraphConv(F, 4), (torch.randn(N, F),), lambda m, x: m(adj, x))


@case("DenseGraphConv-aggregate_first")
def _() -> Case:
    adj = _adjacency(_graph())
    return Case(
        conv.DenseGraphConv(3, 6, norm="right"), (torch.randn(N, 3),), lambda m, x: m(adj, x)
    )


@case("DenseSAGEConv")
def _() -> Case:
    adj = _adjacency(_graph())
    return Case(conv.DenseSAGEConv(F, 4), (torch.randn(N, F),), lambda m, x: m(adj, x))


@case("DenseChebConv")
def _() -> Case:
    adj = _adjacency(_graph())
    # lambda_max given: without it DenseChebConv calls torch.eig, removed from torch
    return Case(conv.DenseChebConv(F, 4, k=3), (torch.randn(N, F),), lambda m, x: m(adj, x, 1.9))


@case("EdgeConv")
def _() -> Case:
    return _node_case(conv.EdgeConv(F, 4, batch_norm=True))


@case("AtomicConv")
def _() -> Case:
    g = _graph()
    atoms = torch.tensor([1.0, 6.0, 8.0])
    module = conv.AtomicConv(
        interaction_cutoffs=torch.tensor([2.0, 3.0]),
        rbf_kernel_means=torch.tensor([0.5, 1.5]),
        rbf_kernel_scaling=torch.tensor([1.0, 2.0]),
        features_to_use=atoms,
    )
    feat = atoms[torch.arange(N) % 3].reshape(N, 1)
    return Case(module, (torch.rand(g.num_edges(), 1) * 3,), lambda m, dist: m(g, feat, dist))


@case("CFConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.CFConv(F, FE, 6, 4),
        (torch.randn(N, F), torch.randn(g.num_edges(), FE)),
        lambda m, x, e: m(g, x, e),
    )


@case("DotGatConv")
def _() -> Case:
    return _node_case(conv.DotGatConv(F, 4, num_heads=2))


@case("TWIRLSConv")
def _() -> Case:
    return _node_case(conv.TWIRLSConv(F, 4, 6, prop_step=2))


@case("TWIRLSConv-attention")
def _() -> Case:
    return _node_case(conv.TWIRLSConv(F, 4, 6, prop_step=3, attention=True, attn_bef=False))


@case("TWIRLSUnfoldingAndAttention")
def _() -> Case:
    return _node_case(conv.TWIRLSUnfoldingAndAttention(F, alp=0, lam=1, prop_step=3, attn_aft=1))


@case("GCN2Conv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.GCN2Conv(F, layer=2, alpha=0.1),
        (torch.randn(N, F), torch.randn(N, F)),
        lambda m, x, x0: m(g, x, x0),
    )


@case("HGTConv")
def _() -> Case:
    g = _graph()
    ntype = torch.arange(N) % 2
    etype = _etypes(g, 3)
    return Case(
        conv.HGTConv(8, 4, 2, num_ntypes=2, num_etypes=3, dropout=0.0, use_norm=True),
        (torch.randn(N, 8),),
        lambda m, x: m(g, x, ntype, etype),
    )


@case("HGTConv-presorted-heterograph")
def _() -> Case:
    hg = dgl.to_homogeneous(_hetero())
    ntype, etype = hg.ndata[dgl.NTYPE], hg.edata[dgl.ETYPE]
    return Case(
        conv.HGTConv(8, 4, 2, num_ntypes=2, num_etypes=3, dropout=0.0),
        (torch.randn(hg.num_nodes(), 8),),
        lambda m, x: m(hg, x, ntype, etype, presorted=True),
    )


@case("GroupRevRes")
def _() -> Case:
    return _node_case(conv.GroupRevRes(conv.GraphConv(4, 4), groups=2), width=8)


@case("EGNNConv")
def _() -> Case:
    # no self-loops: EGNN normalizes x_i - x_j by its norm, whose gradient at 0 is NaN
    g = _graph(self_loops=False)
    return Case(
        conv.EGNNConv(F, 6, 4, edge_feat_size=FE),
        (torch.randn(N, F), torch.randn(N, 3), torch.randn(g.num_edges(), FE)),
        lambda m, h, pos, e: m(g, h, pos, e),
    )


@case("PNAConv")
def _() -> Case:
    g = _graph()
    return Case(
        conv.PNAConv(
            F,
            4,
            ["mean", "max", "min", "sum", "std", "var", "moment3"],
            ["identity", "amplification", "attenuation"],
            delta=2.5,
            edge_feat_size=FE,
        ),
        (torch.randn(N, F), torch.randn(g.num_edges(), FE)),
        lambda m, x, e: m(g, x, e),
    )


@case("DGNConv")
def _() -> Case:
    g = _graph()
    eig = torch.randn(N, 2)
    return Case(
        conv.DGNConv(F, F, ["dir1-av", "dir2-dx", "sum", "max"], ["identity"], delta=2.5),
        (torch.randn(N, F),),
        lambda m, x: m(g, x, eig_vec=eig),
    )


@case("HeteroGraphConv")
def _() -> Case:
    hg = _hetero()
    module = dgl.nn.HeteroGraphConv(
        {
            "follows": conv.GraphConv(F, 4),
            "plays": conv.GATConv(F, 4, num_heads=2),
            "played-by": conv.SAGEConv(F, 4, "mean"),
        },
        aggregate="sum",
    )
    xu, xi = torch.randn(hg.num_nodes("user"), F), torch.randn(hg.num_nodes("item"), F)
    return Case(module, (xu, xi), lambda m, xu, xi: m(hg, {"user": xu, "item": xi}))


@case("HeteroGraphConv-block")
def _() -> Case:
    hg = _hetero()
    seeds = {"user": torch.arange(5), "item": torch.arange(4)}
    block = dgl.to_block(dgl.in_subgraph(hg, seeds), seeds)
    module = dgl.nn.HeteroGraphConv(
        {
            "follows": conv.SAGEConv(F, 4, "gcn"),
            "plays": conv.GraphConv(F, 4),
            "played-by": conv.GINConv(nn.Linear(F, 4), "sum"),
        },
        aggregate="mean",
    )
    xu, xi = (
        torch.randn(block.num_src_nodes("user"), F),
        torch.randn(block.num_src_nodes("item"), F),
    )
    return Case(module, (xu, xi), lambda m, xu, xi: m(block, {"user": xu, "item": xi}))


class _SparseGCNLayer(nn.Module):
    """``A @ (x W^T + b)`` with ``A`` a torch.sparse adjacency: no ``dgl.nn`` conv takes one
    (see test_no_dense_conv_takes_a_torch_sparse_adjacency), so a hand-written layer stands
    for the models that multiply by one."""

    def __init__(self, adj: torch.Tensor) -> None:
        super().__init__()
        self.adj = adj
        self.linear = nn.Linear(F, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adj @ self.linear(x)


for _layout in ("coo", "csr"):

    @case(f"torch.sparse-{_layout}-adjacency")
    def _(layout: str = _layout) -> Case:
        adj = _adjacency(_graph())
        adj = adj.to_sparse() if layout == "coo" else adj.to_sparse_csr()
        return Case(_SparseGCNLayer(adj), (torch.randn(N, F),), lambda m, x: m(x))


# Modules that cannot run on DGL's CPU build at all, plugin or not;
# test_excluded_modules_still_fail_unpatched proves each still fails, so this list cannot
# go stale silently.
_NEEDS_CUGRAPH = "needs pylibcugraphops (RAPIDS, CUDA only): DGL's CPU build cannot construct it"
EXCLUDED: dict[str, tuple[str, Callable[[], Any]]] = {
    "CuGraphGATConv": (_NEEDS_CUGRAPH, lambda: conv.CuGraphGATConv(F, 4, num_heads=2)),
    "CuGraphRelGraphConv": (_NEEDS_CUGRAPH, lambda: conv.CuGraphRelGraphConv(F, 4, num_rels=3)),
    "CuGraphSAGEConv": (_NEEDS_CUGRAPH, lambda: conv.CuGraphSAGEConv(F, 4)),
}


@dataclass(frozen=True)
class Looser:
    """tango bounds for a case whose arithmetic magnifies the quantization error."""

    output: float  # instead of TANGO_OUTPUT_BOUND
    grad_cosine: float  # instead of TANGO_GRAD_COSINE
    why: str


_TWIRLS_ATTENTION = Looser(
    0.25,
    TANGO_GRAD_COSINE,
    "the attention weight is 1 / max(|y_i - y_j|, tau) with the squared distance taken as "
    "|y_i|^2 + |y_j|^2 - 2 y_i.y_j: the 8-bit error of the dot product is relative to |y|^2, "
    "not to the (small) distance, and 1 / distance magnifies it up to 1 / tau = 5 times "
    "(0.118 measured on a 30-node graph, at most 0.032 over 8 seeds there with tau = 1)",
)
TANGO_LOOSER: dict[str, Looser] = {
    "TWIRLSConv-attention": _TWIRLS_ATTENTION,
    "TWIRLSUnfoldingAndAttention": _TWIRLS_ATTENTION,
    "PNAConv": Looser(
        0.25,
        0.5,
        "the std aggregator takes sqrt(E[m^2] - E[m]^2 + eps), a variance by cancellation: at "
        "nodes of degree 1 or 2 the float32 variance is about 0, so the 8-bit noise of the "
        "messages is the variance, and backward divides it by 2 sqrt(var + eps) (output "
        "0.092, gradient cosine 0.71 measured at worst over 12 seeds)",
    ),
}

# The cases where tango has nothing to quantize; it must quantize something in all others.
TANGO_QUANTIZES_NOTHING: dict[str, str] = {
    "AtomicConv": "user-defined message and reduce functions only: no DGL primitive, no product",
    "EdgeWeightNorm": "its SpMM and SDDMM read 1-d edge weights, which tango's kernels do not "
    "take: they run in float32 and are reported",
}


# ------------------------------------------------------------------ running a case


@dataclass(frozen=True)
class Config:
    plugin: str
    options: tuple[tuple[str, Any], ...] = ()


# the plugins with their defaults, and exact at 8 bits, whose gradients can be compared
# (at its default 2 bits one saved value holds 4 levels: gradients are unbiased but noisy);
# tango with every primitive quantized: the sweep's graphs and widths are all below the
# sizes where int8 pays on a CPU, which it would otherwise keep in float32
CONFIGS: dict[str, Config] = {
    "trace": Config("trace"),
    "tango": Config("tango", (("fp32_when_small", False),)),
    "exact": Config("exact"),
    "exact-8bit": Config("exact", (("bits", 8),)),
}


def _tensors(out: Any) -> list[torch.Tensor]:
    """The output tensors of a call, in a fixed order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [out[k] for k in sorted(out)]
    return [t for part in out for t in _tensors(part)]


@dataclass
class Result:
    outputs: list[torch.Tensor]
    grads: dict[str, torch.Tensor]
    report: dict[str, Any]


def _run(name: str, config: Config | None) -> Result:
    """Forward and backward of case ``name`` under ``config`` (None: plain DGL)."""
    torch.manual_seed(0)  # the same weights and inputs for every run of a case
    built = CASES[name]()
    module = built.module
    leaves = [t.detach().clone().requires_grad_(True) for t in built.floats]
    session = qtrain.patch(config.plugin, **dict(config.options)) if config else nullcontext()
    with session:
        outputs = _tensors(built.call(module, *leaves))
        # copied before backward: GroupRevRes frees its output's storage in backward
        kept = [o.detach().clone() for o in outputs]
        gen = torch.Generator().manual_seed(2)
        loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in outputs)
        loss.backward()
    grads = {f"input{i}": t.grad for i, t in enumerate(leaves) if t.grad is not None}
    grads |= {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    report = session.report()[config.plugin] if config else {}
    return Result(kept, grads, report)


_REFERENCES: dict[str, Result] = {}


def _reference(name: str) -> Result:
    """The float32 run of a case, once per test session."""
    if name not in _REFERENCES:
        _REFERENCES[name] = _run(name, None)
    return _REFERENCES[name]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([grads[k].flatten() for k in sorted(grads)])


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(nn.functional.cosine_similarity(a, b, dim=0))


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name", list(CASES))
def test_plugin_runs_conv_module(name: str, config: str) -> None:
    ref = _reference(name)
    assert ref.grads and all(torch.isfinite(t).all() for t in [*ref.outputs, *ref.grads.values()])
    dispatch.reset()
    got = _run(name, CONFIGS[config])
    calls = dispatch.snapshot()
    quantized = sum(  # one scale per tensor, per row or per column
        sum(calls.get(kind, {}).values()) for kind in ("quantize", "quantize_rows", "quantize_cols")
    )

    assert [o.shape for o in got.outputs] == [o.shape for o in ref.outputs]
    assert set(got.grads) == set(ref.grads), "a plugin dropped or added a gradient"
    for o in got.outputs:
        assert torch.isfinite(o).all(), "non-finite output"
    for key, g in got.grads.items():
        assert torch.isfinite(g).all(), f"non-finite gradient of {key}"

    if config == "trace":  # changes no numbers
        for a, b in zip(got.outputs, ref.outputs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        for key, g in got.grads.items():
            torch.testing.assert_close(g, ref.grads[key], rtol=0, atol=0, msg=key)
    elif config == "tango":
        if name in TANGO_QUANTIZES_NOTHING:
            assert quantized == 0
            assert all(torch.equal(a, b) for a, b in zip(got.outputs, ref.outputs, strict=True))
            return
        assert quantized > 0, "tango quantized nothing: did its patches reach the module?"
        bounds = TANGO_LOOSER.get(name, Looser(TANGO_OUTPUT_BOUND, TANGO_GRAD_COSINE, ""))
        for a, b in zip(got.outputs, ref.outputs, strict=True):
            assert _rel(a, b) < bounds.output
        assert _cosine(_flat(got.grads), _flat(ref.grads)) > bounds.grad_cosine
    else:  # exact: the forward is float32; only what backward reads is compressed
        for a, b in zip(got.outputs, ref.outputs, strict=True):
            torch.testing.assert_close(a, b, rtol=EXACT_OUTPUT_BOUND, atol=EXACT_OUTPUT_BOUND)
        if config == "exact-8bit":
            assert _cosine(_flat(got.grads), _flat(ref.grads)) > EXACT8_GRAD_COSINE


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("torch.sparse")])
def test_tango_reports_the_sparse_product_it_leaves_in_float32(name: str) -> None:
    got = _run(name, CONFIGS["tango"])
    assert "gemm: sparse operand" in got.report["fp32_calls"]


def _conv_classes() -> dict[str, type]:
    return {
        n: getattr(conv, n)
        for n in conv.__all__
        if inspect.isclass(getattr(conv, n)) and issubclass(getattr(conv, n), nn.Module)
    }


def test_every_conv_module_is_swept_or_excluded_with_a_reason() -> None:
    classes = _conv_classes()
    assert len(classes) > 30  # dgl.nn.pytorch.conv as of DGL 2.1
    covered = set()
    for factory in CASES.values():
        torch.manual_seed(0)
        covered |= {type(m).__name__ for m in factory().module.modules()}
    assert not covered & set(EXCLUDED), "an excluded module runs: sweep it instead"
    missing = set(classes) - covered - set(EXCLUDED)
    assert not missing, f"not swept and not excluded: {sorted(missing)}"
    assert set(EXCLUDED) <= set(classes)
    assert set(TANGO_LOOSER) | set(TANGO_QUANTIZES_NOTHING) <= set(CASES)


@pytest.mark.parametrize("name", list(EXCLUDED))
def test_excluded_modules_still_fail_unpatched(name: str) -> None:
    with pytest.raises(ModuleNotFoundError, match="pylibcugraphops"):
        EXCLUDED[name][1]()


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        (lambda: conv.DenseGraphConv(F, 4), ()),
        (lambda: conv.DenseSAGEConv(F, 4), ()),
        (lambda: conv.DenseChebConv(F, 4, k=2), (1.9,)),
    ],
    ids=["DenseGraphConv", "DenseSAGEConv", "DenseChebConv"],
)
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_no_dense_conv_takes_a_torch_sparse_adjacency(
    module: Any, extra: tuple, layout: str
) -> None:
    """Why the sweep's torch.sparse cases use a hand-written layer: DGL's Dense* convs call
    clamp, dim-wise sums or broadcasting adds that torch.sparse lacks (unpatched). If one
    starts to accept it, sweep it with a sparse adjacency."""
    adj = _adjacency(_graph())
    adj = adj.to_sparse() if layout == "coo" else adj.to_sparse_csr()
    with pytest.raises((NotImplementedError, RuntimeError)):
        module()(adj, torch.randn(N, F), *extra)


# ------------------------------------------------------------------ diverged values


def _diverging(config: Config | None, where: str) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """GraphConv then GATConv with a NaN in one input row (``where="input"``) or an Inf in
    the loss weights (``where="gradient"``): outputs and gradients, and the plugin's report."""
    torch.manual_seed(0)
    g = _graph()
    layers = nn.ModuleList([conv.GraphConv(F, 8), conv.GATConv(8, 3, num_heads=2)])
    x = torch.randn(N, F)
    weights = torch.randn(N, 2, 3)
    if where == "input":
        x[5, 2] = float("nan")
    else:
        weights[7, 1, 0] = float("inf")
    x.requires_grad_(True)
    session = qtrain.patch(config.plugin, **dict(config.options)) if config else nullcontext()
    with session:
        y = layers[1](g, layers[0](g, x))
        kept = y.detach().clone()
        (y * weights).sum().backward()
    tensors = [kept, x.grad, *(p.grad for p in layers.parameters())]
    return tensors, session.report()[config.plugin] if config else {}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("where", ["input", "gradient"])
def test_a_diverged_value_stays_visible_and_never_crashes(where: str, config: str) -> None:
    """NaN / Inf cannot be quantized: a plugin leaves such an operand in float32 and reports
    it, so the step ends with the non-finite values float32 would give (and a run stops as
    diverged) instead of failing inside autograd."""
    ref, _ = _diverging(None, where)
    got, report = _diverging(CONFIGS[config], where)
    assert any(not torch.isfinite(t).all() for t in ref)
    for a, b in zip(got, ref, strict=True):
        if config == "trace":
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        elif config == "tango":  # float32 from the first non-finite operand on
            assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        else:  # exact stores a row holding NaN / Inf as a NaN row: more NaN, never fewer
            assert not (torch.isfinite(a) & ~torch.isfinite(b)).any()
    if config == "tango":
        reason = "operand not finite" if where == "input" else "gradient not finite"
        assert any(key.endswith(reason) for key in report["fp32_calls"]), report["fp32_calls"]
