"""GraphSAGE's mean layer a block of rows at a time under exact (plugins/exact/fused_sage.py):
the same output and input gradient as DGL's SAGEConv, weight gradients from the stored
rows, never a second full-size tensor, and DGL's forward wherever it does not apply."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import codec_hooks
from qtrain.plugins.exact import compressed, fused_sage
from qtrain.plugins.exact.compressed import CompressingCodec
from torch.utils._python_dispatch import TorchDispatchMode

from qtrain._compat import import_dgl
from qtrain.models.lean_sage import lean_sage_conv
from qtrain.train.activations import ActivationMeter, installed_codec


def _graph(nodes: int, seed: int) -> Any:
    """Random edges, a hub every node points to, a node with no in-edge, one isolated."""
    dgl = import_dgl()
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes - 2, (nodes * 4,), generator=gen)
    dst = torch.randint(1, nodes - 2, (nodes * 4,), generator=gen)  # node 0: no in-edge
    hub_src = torch.arange(1, nodes - 1)
    src = torch.cat([src, hub_src])
    dst = torch.cat([dst, torch.full_like(hub_src, 5)])
    return dgl.graph((src, dst), num_nodes=nodes).int()  # node nodes-1 isolated


def _conv(cls: type, d_in: int, d_out: int, seed: int, **kwargs: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    conv = cls(d_in, d_out, "mean", **kwargs)
    with torch.no_grad():
        for p in conv.parameters():
            p.normal_()
    return conv


_BLOCKED = {"plugin": ["exact"], "exact": {"blocked_sage": True}}


def _sage() -> type:
    import_dgl()
    from dgl.nn import SAGEConv

    return SAGEConv


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize(
    ("nodes", "d_in", "d_out"), [(300, 37, 37), (257, 16, 48), (96, 8, 9), (200, 48, 16)]
)
def test_output_and_gradients_match_dgls_layer_and_the_stored_rows(
    monkeypatch: pytest.MonkeyPatch, bits: int, nodes: int, d_in: int, d_out: int
) -> None:
    # blocks of 32 rows: many blocks, a short last one (257 nodes: one row, too small for
    # the codec to quantize, so the hooks keep it as it is)
    monkeypatch.setattr(fused_sage, "BLOCK_BYTES", 4 * max(d_in, d_out) * 32)
    graph = _graph(nodes, seed=bits)
    conv = _conv(_sage(), d_in, d_out, seed=bits)
    feat = torch.randn(nodes, d_in, requires_grad=True)
    feat.data[:3] = 0.0  # all-zero rows
    feat.data[3:5] = 1.5  # constant rows
    grad = torch.randn(nodes, d_out)
    params = [feat, conv.fc_self.weight, conv.fc_self.bias, conv.fc_neigh.weight]

    codec = CompressingCodec(bits, rounding="nearest")  # rows stored alike, blocked or whole
    with codec_hooks(codec):
        assert fused_sage.fusable(conv, graph, feat, None)
        out = fused_sage.sage_mean(conv, graph, feat, codec, projects=False)
    got = torch.autograd.grad(out, params, grad)

    want_out = conv(graph, feat)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    want = torch.autograd.grad(want_out, params, grad)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)  # needs no stored value
    torch.testing.assert_close(got[2], want[2])
    # weight gradients: from the rows as the codec stores them (per-row scales, nearest)
    dgl = import_dgl()
    reference = CompressingCodec(bits, rounding="nearest")
    agg = dgl.ops.copy_u_mean(graph, feat.detach())
    feat_hat = reference.decode(reference.encode(feat.detach()))
    agg_hat = torch.cat(
        [
            rows
            if rows.numel() < compressed.MIN_NUMEL
            else reference.decode(reference.encode(rows))
            for rows in agg.split(32)
        ]
    )
    want_w_self = grad.t() @ feat_hat
    if d_in > d_out:  # projected first: W_n's gradient is (A^T D^-1 grad)^T feat
        degrees = graph.in_degrees().clamp(min=1).float()[:, None]
        spread = dgl.ops.copy_u_sum(dgl.reverse(graph), grad / degrees)
        want_w_neigh = spread.t() @ feat_hat
    else:
        want_w_neigh = grad.t() @ agg_hat
    for got_w, want_w in ((got[1], want_w_self), (got[3], want_w_neigh)):
        torch.testing.assert_close(got_w, want_w, rtol=1e-4, atol=1e-4 * want_w.abs().max().item())


def test_no_second_full_size_tensor_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward makes the output and backward the input gradient: every other tensor the
    layer makes is a block (DGL's forward makes the aggregation and two products)."""
    monkeypatch.setattr(fused_sage, "BLOCK_BYTES", 4 * 64 * 48)
    monkeypatch.setattr(compressed, "GRAD_BLOCK_BYTES", 4 * 64 * 48)
    nodes, width = 400, 64
    graph = _graph(nodes, seed=0)
    conv = _conv(_sage(), width, width, seed=0)
    feat = torch.randn(nodes, width, requires_grad=True)
    codec = CompressingCodec(2)

    class Sizes(TorchDispatchMode):
        """The new storages of at least a full-size float32 tensor that ops make."""

        def __init__(self) -> None:
            super().__init__()
            self.full: dict[int, str] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            known = {a.untyped_storage().data_ptr() for a in tensors if a.layout == torch.strided}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    storage = t.untyped_storage()
                    if storage.nbytes() >= 4 * nodes * width and storage.data_ptr() not in known:
                        self.full[storage.data_ptr()] = str(func)
            return out

    with codec_hooks(codec):
        forward = Sizes()
        with forward:
            out = fused_sage.sage_mean(conv, graph, feat, codec, projects=False)
        grad = torch.randn(nodes, width)
        backward = Sizes()
        with backward:
            out.backward(grad)
    assert len(forward.full) == 1, forward.full  # the output
    assert len(backward.full) == 1, backward.full  # the input gradient
    # DGL's own layer makes more
    dgl_forward = Sizes()
    with dgl_forward:
        conv(graph, feat)
    assert len(dgl_forward.full) >= 3, dgl_forward.full


@pytest.mark.parametrize("layer", ["dgl", "lean"])
def test_the_plugin_routes_sage_mean_layers_and_counts_them(layer: str) -> None:
    import qtrain

    cls = _sage() if layer == "dgl" else lean_sage_conv()
    graph = _graph(200, seed=1)
    feat = torch.randn(200, 32, requires_grad=True)

    def step(quant: dict[str, Any] | None) -> tuple[list[torch.Tensor], dict[str, Any]]:
        conv = _conv(cls, 32, 32, seed=2)
        report: dict[str, Any] = {}
        if quant is None:
            out = conv(graph, feat)
        else:
            with qtrain.patch(quant, seed=3) as session:
                out = conv(graph, feat)
                report = session.report()["exact"]
        params = [feat, *conv.parameters()]
        return list(torch.autograd.grad(out.square().sum(), params)), report

    want, _ = step(None)
    got, report = step({"plugin": ["exact"], "exact": {"bits": 8, "blocked_sage": True}})
    assert report["blocked_sage_layers"] == 1
    for g, w in zip(got, want, strict=True):
        assert F.cosine_similarity(g.reshape(-1), w.reshape(-1), dim=0) > 0.999
    _, projected = step(
        {"plugin": ["exact"], "exact": {"bits": 8, "rp_ratio": 2, "blocked_sage": True}}
    )
    assert projected["blocked_sage_layers"] == 1
    _, default = step({"plugin": ["exact"], "exact": {"bits": 8}})
    assert default["blocked_sage_layers"] == 1  # the default
    _, off = step({"plugin": ["exact"], "exact": {"bits": 8, "blocked_sage": False}})
    assert off["blocked_sage_layers"] == 0
    _, with_tango = step({"plugin": ["tango", "exact"], "exact": {"blocked_sage": True}})
    assert with_tango["blocked_sage_layers"] == 0  # tango quantizes the products itself


def test_calls_it_does_not_compute_take_dgls_forward() -> None:
    import qtrain

    dgl = import_dgl()
    sage = _sage()
    graph = _graph(120, seed=4)
    feat = torch.randn(120, 16, requires_grad=True)
    weight = torch.rand(graph.num_edges())
    block = dgl.to_block(graph, torch.arange(60, dtype=torch.int32))
    cases: list[tuple[Any, Any, Any, Any]] = [
        (_conv(sage, 16, 16, 0), graph, feat, weight),  # edge weights
        (sage(16, 16, "pool"), graph, feat, None),
        (_conv(sage, 16, 16, 0), dgl.graph(([], []), num_nodes=120).int(), feat, None),
        (_conv(sage, 16, 16, 0), graph, (feat, feat), None),
    ]
    for conv, g, x, w in cases:
        with qtrain.patch(_BLOCKED) as session:
            out = conv(g, x, edge_weight=w)
            out.sum().backward()
        assert session.report()["exact"]["blocked_sage_layers"] == 0
    # a block (DGL's forward on one aborts under this torch: checked without running it)
    with qtrain.patch(_BLOCKED):
        assert not fused_sage.fusable(
            _conv(sage, 16, 16, 0), block, feat[: block.num_src_nodes()], None
        )
    with qtrain.patch(_BLOCKED) as session, torch.no_grad():
        _conv(sage, 16, 16, 0)(graph, feat)
    assert session.report()["exact"]["blocked_sage_layers"] == 0
    # with no saved-tensor hooks in force (no codec would see the blocks)
    conv = _conv(sage, 16, 16, 0)
    assert fused_sage.fusable(conv, graph, feat, None) is False


def test_a_torch_without_the_private_hooks_call_takes_dgls_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import qtrain

    monkeypatch.delattr(torch._C._autograd, "_top_saved_tensors_default_hooks")
    graph = _graph(120, seed=4)
    conv = _conv(_sage(), 16, 16, 0)
    with qtrain.patch(_BLOCKED) as session:
        conv(graph, torch.randn(120, 16, requires_grad=True)).sum().backward()
    assert session.report()["exact"]["blocked_sage_layers"] == 0


def test_the_meter_counts_the_stored_blocks() -> None:
    """The blocks are packed through the meter's hooks: it counts their stored bytes, which
    are what the whole aggregation's stored rows take (per-row scales), and the degrees."""
    graph = _graph(500, seed=5)
    feat = torch.randn(500, 64, requires_grad=True)

    def saved_bytes(fused: bool) -> int:
        conv = _conv(_sage(), 64, 64, seed=6)
        codec = CompressingCodec(2, rounding="nearest")
        meter = ActivationMeter(conv.parameters(), torch.device("cpu"))
        with installed_codec(codec), meter.step([]):
            if fused:
                out = fused_sage.sage_mean(conv, graph, feat, codec, projects=False)
            else:
                out = conv(graph, feat)
            out.sum().backward()
        return meter.activation_bytes

    fused, whole = saved_bytes(True), saved_bytes(False)
    assert fused > 0
    assert fused == whole


def test_the_adjacency_matches_dgls_and_dgl_builds_no_csc_or_csr() -> None:
    """The layer reads its own in-CSR without edge ids, built once per graph, in both
    directions; DGL's graph keeps only its COO (DGL's CSC and CSR add an edge-id array
    each)."""
    graph = _graph(300, seed=7)
    adj = fused_sage.adjacency(graph)
    assert fused_sage.adjacency(graph) is adj  # once per graph
    dgl = import_dgl()
    copy = dgl.graph(graph.edges(), num_nodes=graph.num_nodes())  # clone() shares formats
    want_indptr, want_indices, _ = copy.int().adj_tensors("csc")
    assert torch.equal(adj.indptr, want_indptr)
    for row in range(graph.num_nodes()):
        a, b = int(adj.indptr[row]), int(adj.indptr[row + 1])
        assert torch.equal(adj.indices[a:b].sort().values, want_indices[a:b].sort().values)
    assert adj.indices.dtype == torch.int32  # the graph's id type
    conv = _conv(lean_sage_conv(), 32, 32, seed=8)
    last = _conv(lean_sage_conv(), 32, 8, seed=9)  # projects first
    import qtrain

    with qtrain.patch(_BLOCKED) as session:
        last(graph, conv(graph, torch.randn(300, 32))).sum().backward()
    assert session.report()["exact"]["blocked_sage_layers"] == 2
    assert graph.formats()["created"] == ["coo"]
    key = id(graph)
    del graph, adj
    assert key not in fused_sage._adjacency  # dropped with its graph


def test_a_graph_held_as_its_csc_is_read_in_place_and_keeps_only_it() -> None:
    """A run that reads only the in-CSR holds the graph as DGL's CSC alone
    (``held_as_in_csr``): the layer reads DGL's arrays themselves, and after two layers'
    forward and backward, and DGL's own forward in evaluation, DGL still holds nothing else;
    the layer gives what it gives on the COO graph."""
    from qtrain.train.prepare import held_as_in_csr

    graph = _graph(300, seed=10)
    held = held_as_in_csr(graph)
    assert held.formats() == {"created": ["csc"], "not created": []}
    indptr, indices, _ = held.adj_tensors("csc")
    adj = fused_sage.adjacency(held)
    assert adj.indptr.data_ptr() == indptr.data_ptr()
    assert adj.indices.data_ptr() == indices.data_ptr()
    import qtrain

    results = []
    for g in (graph, held):
        conv = _conv(lean_sage_conv(), 32, 32, seed=8)
        last = _conv(lean_sage_conv(), 32, 8, seed=9)  # projects first
        feat = torch.randn(300, 32, generator=torch.Generator().manual_seed(11), requires_grad=True)
        with qtrain.patch(_BLOCKED) as session:
            out = last(g, conv(g, feat))
            out.sum().backward()
            with torch.no_grad():
                evaluated = last(g, conv(g, feat))
        assert session.report()["exact"]["blocked_sage_layers"] == 2
        results.append((out.detach(), feat.grad, evaluated))
    assert held.formats() == {"created": ["csc"], "not created": []}
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
