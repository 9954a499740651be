"""The device route's primitives against DGL's own kernels, on the CPU, forward and gradients.

Each case calls the public ``dgl.ops`` function twice on the same graph and
operands: once with DGL's C kernels, once with qtrain's route enabled for the
CPU (which runs ``qtrain.route.kernels`` instead). Graphs: random, with
zero-degree nodes, a power-law hub, empty (no edges), bipartite; operands
random, all zero and constant, with odd widths and broadcasting shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import qtrain.route as route
from qtrain._compat import import_dgl
from qtrain.route import kernels

dgl = import_dgl()


@pytest.fixture(autouse=True, scope="module")
def _route_installed() -> Iterator[None]:
    """The route's patches stay in for the module (installing them scans every module's
    namespace); each call below turns routing of CPU tensors on and off."""
    route.enable("meta")
    yield
    route.disable()


def _graphs() -> dict[str, Any]:
    torch.manual_seed(0)
    hub_dst = torch.cat([torch.zeros(60, dtype=torch.int64), torch.randint(0, 40, (40,))])
    hub_src = torch.randint(0, 40, (100,))
    return {
        "random": dgl.rand_graph(30, 150),
        "zero-degree": dgl.graph(
            (torch.tensor([0, 1, 2, 2]), torch.tensor([1, 1, 3, 0])), num_nodes=7
        ),
        "power-law hub": dgl.graph((hub_src, hub_dst), num_nodes=40),
        "no edges": dgl.graph(([], []), num_nodes=5),
        "bipartite": dgl.create_block(
            (torch.randint(0, 12, (50,)), torch.randint(0, 6, (50,))), 12, 6
        ),
    }


GRAPHS = _graphs()


def _operand(kind: str, rows: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "zero":
        return torch.zeros(rows, *shape)
    if kind == "constant":
        return torch.full((rows, *shape), -1.75)
    return torch.randn(rows, *shape, generator=gen)


def _run(call: Callable[..., Any], inputs: list[torch.Tensor], routed: bool, backward: bool) -> Any:
    if routed:
        route.enable("cpu")
    else:
        assert "cpu" not in route.enabled_devices()
    try:
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = call(*leaves)
        if backward:
            finite = torch.where(out.isinf(), torch.zeros_like(out), out)
            weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
            (finite * weights).sum().backward()
        return out.detach(), [leaf.grad for leaf in leaves]
    finally:
        route.disable("cpu")


def _compare(
    call: Callable[..., Any], inputs: list[torch.Tensor], dgl_backward: bool = True
) -> None:
    """``call()`` with DGL's kernels and with the route: same outputs, same gradients
    (``dgl_backward=False`` where DGL's own backward fails: then the outputs are compared
    and the route's gradients must be finite)."""
    want, want_grads = _run(call, inputs, routed=False, backward=dgl_backward)
    got, got_grads = _run(call, inputs, routed=True, backward=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if not dgl_backward:
        assert all(g is None or g.isfinite().all() for g in got_grads)
        return
    for w, g in zip(want_grads, got_grads, strict=True):
        if w is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


SPMM_SHAPES = [  # (lhs trailing shape, rhs trailing shape)
    ((5,), (5,)),
    ((3, 7), (3, 1)),  # one weight per edge and head (GAT's aggregation)
    ((7,), (1,)),  # one scalar weight per edge (GraphConv's edge_weight)
    ((2, 3), (1, 3)),  # broadcasting
    ((1,), (1,)),
]


SPMM_CASES = [  # every op and reducer on every graph; every shape on the random graph
    (graph, op, reduce, shapes)
    for graph in GRAPHS
    for op in kernels.SPMM_OPS
    for reduce in ("sum", "max", "min", "mean")
    for shapes in (SPMM_SHAPES if graph == "random" else SPMM_SHAPES[:2])
]


@pytest.mark.parametrize(("graph", "op", "reduce", "shapes"), SPMM_CASES, ids=str)
def test_gspmm_matches_dgl(graph: str, op: str, reduce: str, shapes: Any) -> None:
    g = GRAPHS[graph]
    lhs = _operand("random", g.num_src_nodes(), shapes[0], 1)
    rhs = _operand("random", g.num_edges(), shapes[1], 2)
    if op == "div":
        rhs = rhs.abs() + 0.5
    # DGL's max / min backward indexes out of range on a graph without edges
    dgl_backward = not (g.num_edges() == 0 and reduce in ("max", "min"))
    _compare(lambda x, w: dgl.ops.gspmm(g, op, reduce, x, w), [lhs, rhs], dgl_backward)


@pytest.mark.parametrize("kind", ["zero", "constant"])
@pytest.mark.parametrize("op", ["copy_lhs", "mul", "copy_rhs"])
def test_gspmm_on_zero_and_constant_operands(kind: str, op: str) -> None:
    g = GRAPHS["power-law hub"]
    lhs = _operand(kind, g.num_src_nodes(), (9,), 3)
    rhs = _operand(kind, g.num_edges(), (9,), 4)
    _compare(lambda x, w: dgl.ops.gspmm(g, op, "sum", x, w), [lhs, rhs])


TARGET_PAIRS = [("u", "v"), ("v", "u"), ("u", "e"), ("e", "v"), ("u", "u"), ("e", "e")]


SDDMM_CASES = [  # every op and target pair on every graph; every shape on the random graph
    (graph, op, targets, shape)
    for graph in GRAPHS
    for op in kernels.SDDMM_OPS
    for targets in TARGET_PAIRS
    for shape in ([(5,), (3, 4), (1,)] if graph == "random" else [(3, 4)])
]


@pytest.mark.parametrize(("graph", "op", "targets", "shape"), SDDMM_CASES, ids=str)
def test_gsddmm_matches_dgl(graph: str, op: str, targets: Any, shape: Any) -> None:
    g = GRAPHS[graph]

    def rows(target: str) -> int:
        return {"u": g.num_src_nodes(), "v": g.num_dst_nodes(), "e": g.num_edges()}[target]

    lhs = _operand("random", rows(targets[0]), shape, 5)
    rhs = _operand("random", rows(targets[1]), shape, 6)
    if op == "div":
        rhs = rhs.abs() + 0.5
    _compare(lambda a, b: dgl.ops.gsddmm(g, op, a, b, *targets), [lhs, rhs])


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("norm_by", ["dst", "src"])
@pytest.mark.parametrize("shape", [(), (1,), (4, 1), (3,)], ids=str)
def test_edge_softmax_matches_dgl(graph: str, norm_by: str, shape: Any) -> None:
    g = GRAPHS[graph]
    scores = _operand("random", g.num_edges(), shape, 7) * 4
    _compare(lambda s: dgl.ops.edge_softmax(g, s, norm_by=norm_by), [scores])


def test_edge_softmax_on_an_edge_subset_matches_dgl() -> None:
    g = GRAPHS["random"]
    eids = torch.arange(0, g.num_edges(), 2)
    scores = _operand("random", len(eids), (2,), 8)
    _compare(lambda s: dgl.ops.edge_softmax(g, s, eids=eids), [scores])


def _heterograph() -> Any:
    torch.manual_seed(3)
    return dgl.heterograph(
        {
            ("user", "follows", "user"): (torch.randint(0, 9, (30,)), torch.randint(0, 9, (30,))),
            ("user", "buys", "item"): (torch.randint(0, 9, (25,)), torch.randint(0, 6, (25,))),
            ("item", "bought-by", "user"): (torch.randint(0, 6, (20,)), torch.randint(0, 8, (20,))),
            ("shop", "sells", "item"): (torch.tensor([0, 1]), torch.tensor([2, 2])),
        },
        num_nodes_dict={"user": 10, "item": 7, "shop": 3},
    )


def _hetero_inputs(edge_seed: int) -> tuple[list[torch.Tensor], Callable[..., Any]]:
    """Node features "h" per node type and edge weights "w" per relation of
    ``_heterograph()``, and a function putting tensors in that order on a copy of it."""
    hg = _heterograph()
    feats = {nt: _operand("random", hg.num_nodes(nt), (4,), i) for i, nt in enumerate(hg.ntypes)}
    weights = {
        et: _operand("random", hg.num_edges(et), (4,), edge_seed + i)
        for i, et in enumerate(hg.canonical_etypes)
    }
    keys = list(feats) + list(weights)

    def assigned(tensors: tuple[torch.Tensor, ...]) -> Any:
        graph = hg.local_var()
        for key, tensor in zip(keys, tensors, strict=True):
            if key in feats:
                graph.nodes[key].data["h"] = tensor
            else:
                graph.edges[key].data["w"] = tensor
        return graph

    return [*feats.values(), *weights.values()], assigned


@pytest.mark.parametrize("reduce", ["sum", "max", "min"])
@pytest.mark.parametrize("message", ["copy_u", "u_mul_e", "copy_e"])
def test_heterograph_update_all_matches_dgl(reduce: str, message: str) -> None:
    """A whole heterograph's update_all is one gspmm_hetero: each node type reduces the
    messages of all its relations together."""
    import dgl.function as fn

    inputs, assigned = _hetero_inputs(edge_seed=10)

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        graph = assigned(tensors)
        msg = {
            "copy_u": fn.copy_u("h", "m"),
            "u_mul_e": fn.u_mul_e("h", "w", "m"),
            "copy_e": fn.copy_e("w", "m"),
        }
        red = getattr(fn, reduce)("m", "out")
        graph.update_all(msg[message], red)
        return torch.cat([graph.nodes[nt].data["out"] for nt in ("user", "item")])

    # DGL's own max / min backward on a heterograph fails for u_mul_e (a tuple taken for
    # a tensor in GSpMM_hetero.backward): outputs are compared there
    dgl_backward = not (message == "u_mul_e" and reduce != "sum")
    _compare(call, inputs, dgl_backward)


@pytest.mark.parametrize("op", ["u_add_v", "u_dot_v", "u_mul_e", "e_sub_v"])
def test_heterograph_apply_edges_matches_dgl(op: str) -> None:
    import dgl.function as fn

    hg = _heterograph()
    inputs, assigned = _hetero_inputs(edge_seed=20)
    lhs, _, rhs = op.split("_")
    names = {"u": "h", "v": "h", "e": "w"}
    builtin = getattr(fn, op)(names[lhs], names[rhs], "s")

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        graph = assigned(tensors)
        graph.apply_edges(builtin)
        return torch.cat([graph.edges[et].data["s"] for et in hg.canonical_etypes])

    _compare(call, inputs)


def test_heterograph_edge_softmax_matches_dgl() -> None:
    hg = _heterograph()
    scores = {
        et: _operand("random", hg.num_edges(et), (2, 1), 30 + i)
        for i, et in enumerate(hg.canonical_etypes)
    }

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        out = dgl.ops.edge_softmax(hg, dict(zip(hg.canonical_etypes, tensors, strict=True)))
        return torch.cat([out[et] for et in hg.canonical_etypes])

    _compare(call, list(scores.values()))


@pytest.mark.parametrize("rows", [0, 1, 37])
@pytest.mark.parametrize("dims", [(5, 3), (16, 16), (1, 9)], ids=str)
def test_gather_mm_matches_dgl(rows: int, dims: Any) -> None:
    relations = 4
    a = _operand("random", rows, (dims[0],), 40)
    b = _operand("random", relations, dims, 41)
    index = torch.randint(0, relations, (rows,), generator=torch.Generator().manual_seed(42))
    _compare(lambda x, w: dgl.ops.gather_mm(x, w, idx_b=index), [a, b])


def test_gather_mm_in_several_chunks_matches_dgl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_CHUNK_ELEMENTS", 64)  # 4 rows of 4 x 4 per chunk
    a = _operand("random", 23, (4,), 43)
    b = _operand("random", 3, (4, 4), 44)
    index = torch.randint(0, 3, (23,), generator=torch.Generator().manual_seed(45))
    _compare(lambda x, w: dgl.ops.gather_mm(x, w, idx_b=index), [a, b])


@pytest.mark.parametrize("lengths", [[3, 0, 5, 2], [0, 0], [7]], ids=str)
def test_segment_mm_matches_dgl(lengths: list[int]) -> None:
    a = _operand("random", sum(lengths), (6,), 46)
    b = _operand("random", len(lengths), (6, 3), 47)
    seglen = torch.tensor(lengths)
    _compare(lambda x, w: dgl.ops.segment_mm(x, w, seglen), [a, b])


def test_half_precision_spmm_accumulates_in_float32() -> None:
    g = GRAPHS["power-law hub"]
    x = _operand("random", g.num_src_nodes(), (8,), 48)
    route.enable("cpu")
    got = dgl.ops.copy_u_sum(g, x.to(torch.bfloat16))
    route.disable("cpu")
    want = dgl.ops.copy_u_sum(g, x.to(torch.bfloat16).float())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.to(torch.bfloat16))
