"""The tango plugin: quantized primitives inside unmodified DGL models, cache, FP32 regions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.dropout import FusedDropout
from qtrain.plugins.tango.functions import inside_kernel, quant_linear
from qtrain.plugins.tango.lineage import RowScaled
from qtrain.plugins.tango.policy import NonFiniteOperand, QuantPolicy

import qtrain
from qtrain._compat import import_dgl
from qtrain.ops import dispatch
from qtrain.ops.gemm import int8_gemm
from qtrain.ops.graph import build_csr, graph_csr
from qtrain.plugin import PRIMITIVES, Patcher

dgl = import_dgl()
from dgl.nn import GATConv, GCN2Conv, GraphConv, SAGEConv  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _graph(n: int = 40, e: int = 160, seed: int = 0, self_loops: bool = True) -> Any:
    torch.manual_seed(seed)
    g = dgl.rand_graph(n, e)
    g = dgl.remove_self_loop(g)
    return dgl.add_self_loop(g) if self_loops else g


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.fixture(autouse=True)
def _fresh_counter() -> None:
    dispatch.reset()


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the int8 kernels on graphs far below the sizes where they pay on
    a CPU, which tango would keep in float32 (payoff.py): its thresholds are off here and
    tested on their own in test_tango_payoff.py."""
    monkeypatch.setattr(payoff, "MEASURED", {})


# ------------------------------------------------------------------ GEMM


@pytest.mark.parametrize("linear", [True, False])
@pytest.mark.parametrize("bits", [8, 6, 4])
def test_quant_linear_matches_fp32_forward_and_backward(linear: bool, bits: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 33, requires_grad=True)
    w = torch.randn(17, 33 if linear else 17, requires_grad=True)
    if not linear:
        w = torch.randn(33, 17, requires_grad=True)
    b = torch.randn(17, requires_grad=True)
    policy = QuantPolicy(bits=bits, rounding="nearest")
    y = quant_linear(policy, x, w, b, linear=linear)
    ref = torch.nn.functional.linear(x, w, b) if linear else x @ w + b
    tol = {8: 0.02, 6: 0.06, 4: 0.3}[bits]
    assert _rel(y, ref) < tol
    g = torch.randn_like(ref)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), g)
    rx, rw, rb = torch.autograd.grad(ref, (x, w, b), g)
    assert _rel(dx, rx) < 2 * tol and _rel(dw, rw) < 2 * tol
    assert torch.allclose(db, rb)  # the bias gradient is a float32 sum
    counts = dispatch.snapshot()["gemm"]
    assert sum(counts.values()) == 3  # forward, dX, dW


def test_quant_linear_flattens_leading_dims() -> None:
    x = torch.randn(2, 5, 8)
    w = torch.randn(3, 8)
    y = quant_linear(QuantPolicy(rounding="nearest"), x, w, linear=True)
    assert y.shape == (2, 5, 3)
    assert _rel(y, x @ w.t()) < 0.02


def test_stochastic_rounding_repeats_with_the_seed_and_changes_without() -> None:
    x = torch.randn(50, 20)
    w = torch.randn(20, 7)
    a = quant_linear(QuantPolicy(bits=4, seed=3, cache=None), x, w, linear=False)
    b = quant_linear(QuantPolicy(bits=4, seed=3, cache=None), x, w, linear=False)
    c = quant_linear(QuantPolicy(bits=4, seed=4, cache=None), x, w, linear=False)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("cache", [True, False])
def test_weights_and_activations_draw_from_the_stream_and_an_evaluation_does_not(
    cache: bool,
) -> None:
    """Inside an autograd Function's forward grad mode is off: read there, every operand
    looked like a step constant, and each step rounded its weights and activations with
    the same random numbers. A training forward draws the weight's and the activation's
    counters from the stream; the features (no gradient) and an evaluation draw none."""
    torch.manual_seed(0)
    x = torch.randn(5, 8)  # the features: a constant of the step
    h = torch.randn(5, 8, requires_grad=True)  # an activation
    w = torch.randn(8, 3, requires_grad=True)
    policy = QuantPolicy(bits=8, cache=QuantCache() if cache else None)
    quant_linear(policy, x, w, linear=False)
    assert policy._offset == w.numel()
    quant_linear(policy, h, w.detach().clone().requires_grad_(), linear=False)
    assert policy._offset == 2 * w.numel() + h.numel()
    with torch.no_grad():
        quant_linear(policy, h, torch.randn(8, 3, requires_grad=True), linear=False)
    assert policy._offset == 2 * w.numel() + h.numel()


# ------------------------------------------------------------------ cache


def test_cache_hits_for_the_same_tensor_and_misses_after_in_place_change() -> None:
    cache = QuantCache()
    policy = QuantPolicy(bits=8, cache=cache)
    x = torch.randn(10, 4)
    q1 = policy.cached(x)
    q2 = policy.cached(x)
    assert q1[0] is q2[0] and cache.hits == 1 and cache.misses == 1
    x.mul_(2.0)  # in place: version bump
    q3 = policy.cached(x)
    assert cache.misses == 2
    assert torch.allclose(q3[1], q1[1] * 2)


def test_cache_never_returns_data_of_a_dead_tensor_at_the_same_address() -> None:
    cache = QuantCache()
    policy = QuantPolicy(bits=8, rounding="nearest", cache=cache)
    x = torch.ones(1000)
    policy.cached(x)
    del x
    assert len(cache) == 0  # the weak reference dropped the entry
    y = torch.full((1000,), 3.0)
    _, s = policy.cached(y)
    assert cache.hits == 0 and float(s) == pytest.approx(3.0 / 127)


def test_cache_separates_settings_and_views() -> None:
    cache = QuantCache()
    x = torch.randn(6, 6)
    QuantPolicy(bits=8, cache=cache).cached(x)
    QuantPolicy(bits=4, cache=cache).cached(x)
    QuantPolicy(bits=4, cache=cache).cached(x.t())
    assert cache.misses == 3 and cache.hits == 0


@pytest.mark.parametrize("linear", [True, False])
def test_weight_gradient_of_the_features_reads_their_cached_transpose(linear: bool) -> None:
    """dW = X^T dY for a step constant X runs over X^T's rows, transposed once for the run
    (from its second step), with the same bits as the transposed product; an activation X,
    or a constant made afresh each step, gets no such copy."""
    torch.manual_seed(0)
    x = torch.randn(40, 12)
    w = torch.randn(5, 12) if linear else torch.randn(12, 5)
    w.requires_grad_()
    grad = torch.randn(40, 5)
    policy = QuantPolicy(bits=8, rounding="nearest")
    for _ in range(3):
        w.grad = None
        quant_linear(policy, x, w, linear=linear).backward(grad)
    assert policy.cache is not None and policy.cache.stats()["transposed"] == 1
    qx, sx = policy.cached(x)
    qg, sg = QuantPolicy(bits=8, rounding="nearest", cache=None).fresh(grad)
    if linear:
        expected = int8_gemm(qg, qx, sg, sx, "tn", None, "auto")
    else:
        expected = int8_gemm(qx, qg, sx, sg, "tn", None, "auto")
    assert torch.equal(w.grad, expected)
    h = x.clone().requires_grad_()
    quant_linear(policy, h, w, linear=linear).backward(grad)
    for _ in range(3):  # a constant of one step: a new tensor each time
        quant_linear(policy, x * 2.0, w, linear=linear).backward(grad)
    assert policy.cache.stats()["transposed"] == 1


def test_optimizer_step_invalidates_cached_weights() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4, bias=False)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    cache = QuantCache()
    policy = QuantPolicy(bits=8, rounding="nearest", cache=cache)
    x = torch.randn(5, 8)
    y1 = quant_linear(policy, x, lin.weight, linear=True)
    y1.sum().backward()
    opt.step()
    y2 = quant_linear(policy, x, lin.weight, linear=True)
    assert _rel(y2, lin(x)) < 0.02  # the stepped weight, not the cached old one
    assert not torch.allclose(y1, y2)


@pytest.mark.parametrize("cache", [True, False])
def test_a_gradient_shared_by_two_products_is_quantized_once(
    cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """autograd hands one tensor to both terms of a sum (RGCN's messages plus its self-loop):
    with the cache on, both quantized backwards read one quantization of it."""
    made: list[tuple[int, ...]] = []
    real = QuantPolicy.fresh

    def fresh(
        self: QuantPolicy,
        x: torch.Tensor,
        constant: bool = False,
        by: str = "rows",
        bits: int | None = None,
        shifted: bool = False,
        packed: bool = False,
    ) -> Any:
        made.append(tuple(x.shape))
        return real(self, x, constant, by, bits, shifted, packed)

    monkeypatch.setattr(QuantPolicy, "fresh", fresh)
    torch.manual_seed(0)
    x = torch.randn(6, 8, requires_grad=True)
    w1 = torch.randn(8, 5, requires_grad=True)
    w2 = torch.randn(8, 5, requires_grad=True)
    policy = QuantPolicy(bits=8, rounding="nearest", cache=QuantCache() if cache else None)
    y = quant_linear(policy, x, w1, linear=False) + quant_linear(policy, x, w2, linear=False)
    made.clear()
    grad = torch.randn(6, 5)
    y.backward(grad)
    assert made.count((6, 5)) == (1 if cache else 2)
    ref = grad @ (w1 + w2).detach().T
    assert _rel(x.grad, ref) < 0.02


# ------------------------------------------------------------------ CSR


def test_csr_of_a_graph_and_a_block_match_its_edges() -> None:
    g = _graph(self_loops=False)
    csr = graph_csr(g._graph)
    src, dst = g.edges()
    assert torch.equal(csr.src.long(), src) and torch.equal(csr.dst.long(), dst)
    for v in range(g.num_nodes()):
        lo, hi = int(csr.in_indptr[v]), int(csr.in_indptr[v + 1])
        assert sorted(csr.in_indices[lo:hi].tolist()) == sorted(g.predecessors(v).tolist())
        assert torch.equal(dst[csr.in_eids[lo:hi].long()], torch.full((hi - lo,), v))
    seeds = torch.tensor([0, 3, 5])
    block = dgl.to_block(dgl.in_subgraph(g, seeds), seeds)
    bcsr = graph_csr(block._graph)
    assert (bcsr.num_src, bcsr.num_dst) == (block.num_src_nodes(), block.num_dst_nodes())
    assert graph_csr(g._graph) is csr  # cached per graph index


def test_csr_of_an_empty_graph() -> None:
    csr = build_csr(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), 3, 2)
    assert csr.in_indptr.tolist() == [0, 0, 0] and csr.out_indptr.tolist() == [0, 0, 0, 0]


# ------------------------------------------------------------------ DGL primitives under the plugin


def _fp32_and_tango(fn: Any, *inputs: torch.Tensor, **options: Any) -> tuple[list, list]:
    """(outputs and input grads) of fn without and with the plugin."""
    results = []
    for active in (False, True):
        leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
        if active:
            with qtrain.patch("tango", rounding="nearest", **options):
                out = fn(*leaves)
                out.backward(torch.ones_like(out))
        else:
            out = fn(*leaves)
            out.backward(torch.ones_like(out))
        results.append([out.detach(), *[t.grad for t in leaves]])
    return results[0], results[1]


_PRIMITIVE_CASES = [
    ("copy_u_sum", lambda g, x: dgl.ops.copy_u_sum(g, x), [("n", 12)]),
    ("copy_u_mean", lambda g, x: dgl.ops.copy_u_mean(g, x), [("n", 5)]),
    ("u_mul_e_sum", lambda g, x, w: dgl.ops.u_mul_e_sum(g, x, w), [("n", 9), ("e", 1)]),
    (
        "u_mul_e_heads",
        lambda g, x, w: dgl.ops.u_mul_e_sum(g, x, w),
        [("n", 4, 6), ("e", 4, 1)],
    ),
    ("copy_e_sum", lambda g, w: dgl.ops.copy_e_sum(g, w), [("e", 3)]),
    ("u_add_v", lambda g, a, b: dgl.ops.u_add_v(g, a, b), [("n", 4, 1), ("n", 4, 1)]),
    ("u_sub_v", lambda g, a, b: dgl.ops.u_sub_v(g, a, b), [("n", 7), ("n", 7)]),
    ("u_mul_v", lambda g, a, b: dgl.ops.u_mul_v(g, a, b), [("n", 7), ("n", 7)]),
    ("u_dot_v", lambda g, a, b: dgl.ops.u_dot_v(g, a, b), [("n", 2, 8), ("n", 2, 8)]),
    ("v_dot_u", lambda g, a, b: dgl.ops.v_dot_u(g, a, b), [("n", 8), ("n", 8)]),
]


def _primitive_inputs(g: Any, shapes: list) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn((g.num_nodes() if s[0] == "n" else g.num_edges(), *s[1:])) for s in shapes]


@pytest.mark.parametrize("scales", ["tensor", "row"])
@pytest.mark.parametrize(("name", "fn", "shapes"), _PRIMITIVE_CASES)
def test_dgl_primitives_match_fp32_at_8_bits(name: str, fn: Any, shapes: list, scales: str) -> None:
    g = _graph(self_loops=False)  # zero-degree nodes included
    inputs = _primitive_inputs(g, shapes)
    ref, got = _fp32_and_tango(lambda *t: fn(g, *t), *inputs, scales=scales)
    for r, q in zip(ref, got, strict=True):
        assert r.shape == q.shape
        assert _rel(q, r) < 0.03, name
    counts = dispatch.snapshot()
    quantized = {k: v for k, v in counts.items() if k in ("spmm", "sddmm")}
    assert quantized and all("fp32" not in per for per in quantized.values()), counts


@pytest.fixture
def refused_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantizer refuses every tensor tango's backward quantizes, as it refuses a
    gradient holding NaN / Inf: each backward must then run in float32."""
    real = QuantPolicy.fresh

    def fresh(
        self: QuantPolicy,
        x: torch.Tensor,
        constant: bool = False,
        by: str = "rows",
        bits: int | None = None,
        shifted: bool = False,
        packed: bool = False,
    ) -> Any:
        if inside_kernel():
            raise NonFiniteOperand("operand holds NaN or Inf")
        return real(self, x, constant, by, bits, shifted, packed)

    monkeypatch.setattr(QuantPolicy, "fresh", fresh)


# their backward quantizes no gradient: copy_e hands it to the edges, mul and dot take it
# as float32 weights
_FLOAT_BACKWARD = {"copy_e_sum", "u_mul_v", "u_dot_v", "v_dot_u"}


@pytest.mark.usefixtures("refused_gradients")
@pytest.mark.parametrize(("name", "fn", "shapes"), _PRIMITIVE_CASES)
def test_primitive_backward_in_fp32_when_the_gradient_is_refused(
    name: str, fn: Any, shapes: list
) -> None:
    g = _graph(self_loops=False)
    ref, got = _fp32_and_tango(lambda *t: fn(g, *t), *_primitive_inputs(g, shapes))
    for r, q in zip(ref, got, strict=True):
        assert r.shape == q.shape
        assert _rel(q, r) < 0.03, name  # float32 products of the 8-bit forward operands
    fp32 = {k: v.get("fp32", 0) for k, v in dispatch.snapshot().items()}
    assert (fp32.get("spmm", 0) + fp32.get("sddmm", 0) > 0) == (name not in _FLOAT_BACKWARD)


@pytest.mark.usefixtures("refused_gradients")
@pytest.mark.parametrize("scales", ["tensor", "row"])
@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("linear", [True, False])
def test_gemm_backward_in_fp32_when_the_gradient_is_refused(
    linear: bool, cache: bool, scales: str
) -> None:
    torch.manual_seed(0)
    x = torch.randn(20, 9, requires_grad=True)
    w = torch.randn(5, 9) if linear else torch.randn(9, 5)
    w.requires_grad_(True)
    b = torch.randn(5, requires_grad=True)
    told: list[tuple[str, str]] = []
    policy = QuantPolicy(
        rounding="nearest",
        scales=scales,
        cache=QuantCache() if cache else None,
        on_fp32=lambda *why: told.append(why),
    )
    y = quant_linear(policy, x, w, b, linear=linear)
    ref = torch.nn.functional.linear(x, w, b) if linear else x @ w + b
    g = torch.randn_like(ref)
    for got, want in zip(
        torch.autograd.grad(y, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g), strict=True
    ):
        assert _rel(got, want) < 0.02
    assert told == [("gemm", "gradient not finite")]


def test_unsupported_variants_run_dgl_fp32_and_are_counted() -> None:
    g = _graph()
    x = torch.randn(g.num_nodes(), 5)
    ref = dgl.ops.copy_u_max(g, x)
    with qtrain.patch("tango") as session:
        got = dgl.ops.copy_u_max(g, x)
    assert torch.equal(got, ref)
    assert dispatch.snapshot()["spmm"] == {"fp32": 1}
    assert "spmm: reducer 'max'" in session.report()["tango"]["fp32_calls"]


@pytest.mark.parametrize("plugin", ["tango", "exact", "trace"])
def test_a_sparse_operand_stays_float32(plugin: str) -> None:
    """A hand-written GCN multiplies by a torch.sparse adjacency: plugins leave that product
    in float32 (it used to crash tango's cache on a tensor without storage)."""
    adjacency = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.ones(3), (3, 3))
    x = torch.randn(3, 4, requires_grad=True)
    want = adjacency @ x
    with qtrain.patch(plugin) as session:
        got = adjacency @ x
        got.sum().backward()
    torch.testing.assert_close(got, want)
    if plugin == "tango":
        assert "gemm: sparse operand" in session.report()["tango"]["fp32_calls"]
    assert x.grad is not None and torch.equal(x.grad, torch.ones(3, 1) @ torch.ones(1, 4))


def test_the_output_layer_backward_runs_in_float32_and_the_hidden_layer_backward_does_not() -> None:
    """DGL's backward calls its primitives again: the output layer's gradient aggregation
    stays float32 (counted with the forward's), the hidden layer's is quantized, and the
    region is closed once the backward is done, on every step."""
    g = _graph(60, 300)
    x = torch.randn(g.num_nodes(), 10)
    # wider input than output: X W first, aggregated after, so its backward aggregates too
    hidden = GraphConv(10, 8, allow_zero_in_degree=True)
    output = GraphConv(8, 3, allow_zero_in_degree=True)
    with qtrain.patch("tango", output_layer=output) as session:
        plugin = session.plugins[0]
        for step in range(1, 3):
            h = torch.relu(hidden(g, x))
            out = output(g, h)
            assert not plugin.fp32.active  # the forward left the region
            quantized_before = dispatch.snapshot().get("spmm", {})
            out.square().sum().backward()
            assert not plugin.fp32.active  # so did the backward
            report = session.report()["tango"]
            # one float32 aggregation forward, one backward (into h) per step
            assert report["fp32_calls"]["spmm: output layer (fp32_before_softmax)"] == 2 * step
            quantized = dispatch.snapshot().get("spmm", {})
            assert sum(v for k, v in quantized.items() if k != "fp32") > sum(
                v for k, v in quantized_before.items() if k != "fp32"
            )  # the hidden layer's backward aggregation
    assert hidden.weight.grad is not None and output.weight.grad is not None


def test_a_user_loop_keeps_the_output_layer_it_names_in_float32() -> None:
    """fp32_before_softmax under qtrain.patch: the layer passed as output_layer runs FP32;
    without one nothing is kept, and the report says so instead of claiming it."""
    g = _graph()
    x = torch.randn(g.num_nodes(), 6)
    hidden, output = GraphConv(6, 8), GraphConv(8, 3)

    def step() -> None:
        output(g, torch.relu(hidden(g, x))).sum().backward()

    with qtrain.patch("tango", output_layer=output) as session:
        step()
    report = session.report()["tango"]
    assert report["fp32_before_softmax"] is True and "fp32_before_softmax_skipped" not in report
    assert "gemm: output layer (fp32_before_softmax)" in report["fp32_calls"]
    dispatch.reset()
    with qtrain.patch("tango") as session:
        step()
    report = session.report()["tango"]
    assert report["fp32_before_softmax"] is False
    assert "output_layer=" in report["fp32_before_softmax_skipped"]
    assert not any("output layer" in why for why in report["fp32_calls"])
    with pytest.raises(
        qtrain.errors.PluginError, match=r"output_layer must be a torch\.nn\.Module"
    ):
        qtrain.patch("tango", output_layer="conv2")


@pytest.mark.parametrize("scales", ["tensor", "row"])
def test_empty_graph_and_zero_degree_nodes(scales: str) -> None:
    g = dgl.graph(
        (torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)), num_nodes=4
    )
    x = torch.randn(4, 3, requires_grad=True)
    with qtrain.patch("tango", scales=scales):
        y = dgl.ops.copy_u_sum(g, x)
        y.sum().backward()
    assert torch.equal(y, torch.zeros(4, 3)) and torch.equal(x.grad, torch.zeros(4, 3))


@pytest.mark.parametrize("scales", ["tensor", "row"])
def test_all_zero_and_constant_features(scales: str) -> None:
    g = _graph()
    with qtrain.patch("tango", rounding="nearest", scales=scales):
        zeros = dgl.ops.copy_u_sum(g, torch.zeros(g.num_nodes(), 4))
        const = dgl.ops.copy_u_sum(g, torch.full((g.num_nodes(), 4), -2.5))
    assert torch.equal(zeros, torch.zeros_like(zeros))
    assert torch.allclose(const, dgl.ops.copy_u_sum(g, torch.full((g.num_nodes(), 4), -2.5)))


# ------------------------------------------------------------------ unmodified dgl.nn modules


def _modules() -> list[tuple[str, Any, Any]]:
    return [
        ("GraphConv", lambda: GraphConv(8, 6), lambda m, g, x: m(g, x)),
        ("GraphConv-weighted", lambda: GraphConv(8, 6, norm="none"), None),
        ("SAGEConv", lambda: SAGEConv(8, 6, "mean"), lambda m, g, x: m(g, x)),
        ("GATConv", lambda: GATConv(8, 3, num_heads=4), lambda m, g, x: m(g, x)),
        ("GCN2Conv", lambda: GCN2Conv(8, layer=1, alpha=0.1), lambda m, g, x: m(g, x, x)),
    ]


@pytest.mark.parametrize("scales", ["tensor", "row"])
@pytest.mark.parametrize("entry", _modules(), ids=[m[0] for m in _modules()])
def test_unmodified_dgl_modules_run_quantized_and_stay_close(entry: tuple, scales: str) -> None:
    name, make, call = entry
    g = _graph()
    torch.manual_seed(0)
    x = torch.randn(g.num_nodes(), 8)
    if call is None:  # GraphConv with edge weights: u_mul_e
        w = torch.rand(g.num_edges())

        def call(m: Any, g: Any, x: torch.Tensor) -> torch.Tensor:
            return m(g, x, edge_weight=w)

    torch.manual_seed(2)
    module = make()
    outs = []
    for active in (False, True):
        module.zero_grad()
        if active:
            with qtrain.patch("tango", rounding="nearest", scales=scales):
                y = call(module, g, x)
                y.square().sum().backward()
        else:
            y = call(module, g, x)
            y.square().sum().backward()
        grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
        outs.append((y.detach(), grads))
    (y_ref, g_ref), (y_q, g_q) = outs
    assert _cos(y_q, y_ref) > 0.999, name
    for a, b in zip(g_q, g_ref, strict=True):
        assert _cos(a, b) > 0.99, name
    counts = dispatch.snapshot()
    assert "gemm" in counts and ("spmm" in counts or "sddmm" in counts), counts
    assert "fp32" not in counts["gemm"], counts


def test_patches_are_restored_after_the_session() -> None:
    before = {p: Patcher.current(p) for p in PRIMITIVES}
    with qtrain.patch("tango"):
        assert Patcher.current("gspmm") is not before["gspmm"]
    assert {p: Patcher.current(p) for p in PRIMITIVES} == before
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    dispatch.reset()
    torch.matmul(x, w)
    assert dispatch.snapshot() == {}


def test_auto_bits_needs_a_model_outside_qtrain_run() -> None:
    with pytest.raises(qtrain.errors.PluginError, match="auto"), qtrain.patch("tango", bits="auto"):
        pass


# ------------------------------------------------------------------ runs


def _run(path: Path, *overrides: str) -> dict[str, Any]:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    return execute(load_recipe(path, list(overrides)), reporter=Reporter())


@pytest.mark.parametrize(
    ("model", "mode"), [("gcn", "full"), ("gat", "full"), ("sage", "minibatch")]
)
def test_run_summary_has_kernels_table(
    tango_recipe: Callable[..., Path], model: str, mode: str
) -> None:
    summary = _run(tango_recipe(model=model, mode=mode))
    kernels = summary["kernels"]
    assert kernels["gemm"] and kernels["spmm"]
    assert kernels["quantize_rows"] and kernels["quantize_cols"]  # "auto": one scale per row
    quantized_backends = set(kernels["gemm"]) | set(kernels["spmm"])
    assert quantized_backends & {"ext-cpu", "reference"}
    written = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert written["kernels"] == kernels
    report = summary["plugin_reports"]["tango"]
    assert report["bits"] == 8 and report["cache"]["hits"] > 0


def test_runs_repeat_with_stochastic_rounding(tango_recipe: Callable[..., Path]) -> None:
    a = _run(tango_recipe("bits = 4"))
    b = _run(tango_recipe("bits = 4"))
    assert a["final_loss"] == b["final_loss"] and a["test_acc"] == b["test_acc"]


def test_fp32_before_softmax_off_quantizes_the_output_layer(
    tango_recipe: Callable[..., Path],
) -> None:
    on = _run(tango_recipe())
    off = _run(tango_recipe('fp32_before_softmax = false\nevaluation = "quantized"'))
    assert "fp32" in on["kernels"]["gemm"]
    assert "fp32" not in off["kernels"]["gemm"]
    assert on["plugin_reports"]["tango"]["fp32_before_softmax"] is True
    assert off["plugin_reports"]["tango"]["fp32_before_softmax"] is False


def test_auto_bits_records_the_calibration(tango_recipe: Callable[..., Path]) -> None:
    summary = _run(tango_recipe('bits = "auto"\ncriterion = "error_x"\nerror_x_target = 0.5'))
    report = summary["plugin_reports"]["tango"]
    cal = report["calibration"]
    errors = {int(b): e for b, e in cal["error_x"].items()}
    assert report["bits"] == cal["bits"]
    assert errors[cal["bits"]] <= 0.5
    if cal["bits"] > 2:
        assert errors[cal["bits"] - 1] > 0.5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("bits = 9", "too large"),
        ("bits = 1", "too small"),
        ('bits = "eight"', "quant.tango.bits"),
        ('rounding = "up"', "rounding"),
        ('scales = "blocks"', "quant.tango.scales"),
        ("fp32_when_small = 3", "fp32_when_small = 3 must be true or false"),
    ],
)
def test_bad_tango_options_are_one_line_errors(
    tango_recipe: Callable[..., Path], extra: str, message: str
) -> None:
    from qtrain.errors import RecipeError
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match=message):
        load_recipe(tango_recipe(extra), [])


def test_calibrate_cli_json(tango_recipe: Callable[..., Path]) -> None:
    import subprocess
    import sys

    path = tango_recipe()
    proc = subprocess.run(
        [sys.executable, "-m", "qtrain", "calibrate", str(path), "--json", "--target", "0.4"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"bits", "criterion", "error_x", "gradient_error", "target"} <= set(result)
    assert set(result["error_x"]) == {str(b) for b in range(2, 9)}
    assert set(result["gradient_error"]) == {str(b) for b in range(2, 9)}
    assert result["target"] == 0.4 and result["criterion"] == "gradient"
    chosen = result["bits"]
    assert result["gradient_error"][str(chosen)] <= 0.4 or chosen == 8
    if chosen > 2:
        assert result["gradient_error"][str(chosen - 1)] > 0.4


# ------------------------------------------------------------------ fused dropout


@pytest.mark.parametrize("shape", [(300, 40), (500, 4, 1), (7, 3)])
def test_fused_dropout_keeps_one_minus_p_scaled_and_backward_uses_the_same_mask(
    shape: tuple[int, ...],
) -> None:
    p = 0.6
    x = (torch.rand(shape) + 0.5).requires_grad_(True)  # no zeros: a zero output is a drop
    dropout = FusedDropout(seed=3, backend="auto")
    y = dropout.handle(torch.nn.functional.dropout, (x, p), {"training": True})
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / (1 - p))
    if x.numel() >= 1000:
        assert abs(kept.float().mean().item() - (1 - p)) < 0.05
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept.float() / (1 - p))
    assert dropout.calls == 1


def test_fused_dropout_draws_each_call_anew_and_repeats_from_the_same_position() -> None:
    x = torch.ones(200, 16)
    first, second = FusedDropout(0, "auto"), FusedDropout(0, "auto")
    args = (x, 0.5)
    a = first.handle(torch.nn.functional.dropout, args, {})
    b = first.handle(torch.nn.functional.dropout, args, {})
    assert not torch.equal(a, b)
    assert torch.equal(second.handle(torch.nn.functional.dropout, args, {}), a)
    second.calls = 1  # a resumed run restores the count
    assert torch.equal(second.handle(torch.nn.functional.dropout, args, {}), b)
    other_seed = FusedDropout(1, "auto").handle(torch.nn.functional.dropout, args, {})
    assert not torch.equal(other_seed, a)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((0.5,), {"training": False}),  # evaluation
        ((0.0,), {}),
        ((1.0,), {}),  # torch's own: everything dropped
        ((0.5,), {"inplace": True}),
    ],
    ids=["eval", "p0", "p1", "inplace"],
)
def test_fused_dropout_leaves_other_calls_to_torch(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    seen: list[Any] = []

    def torch_dropout(*a: Any, **k: Any) -> str:
        seen.append((a, k))
        return "torch"

    dropout = FusedDropout(0, "auto")
    assert dropout.handle(torch_dropout, (torch.ones(4, 3), *args), kwargs) == "torch"
    half = torch.ones(4, 3, dtype=torch.float16)
    assert dropout.handle(torch_dropout, (half, 0.5), {}) == "torch"
    assert dropout.calls == 0 and len(seen) == 2


def test_dgl_gat_dropout_runs_fused_under_tango_and_as_torch_without() -> None:
    g = _graph()
    conv = GATConv(12, 4, num_heads=2, feat_drop=0.5, attn_drop=0.5).train()
    x = torch.randn(g.num_nodes(), 12)
    with qtrain.patch("tango") as session:
        conv(g, x).sum().backward()
        calls = session.report()["tango"]["packed_dropout_calls"]
    assert calls == {"keyed": 0, "torch": 2}  # feat_drop and attn_drop
    with qtrain.patch("tango", packed_dropout=False) as session:
        conv(g, x).sum().backward()
        assert session.report()["tango"]["packed_dropout_calls"] == {"keyed": 0, "torch": 0}


# ------------------------------------------------------------------ row-scaled inputs


def _count_quantized_shapes(policy: QuantPolicy) -> list[tuple[tuple[int, ...], str]]:
    """The shapes ``policy`` quantizes from now on (cache misses and one-off quantizations),
    each with what it was quantized by (one scale per row: rows and columns apart)."""
    made: list[tuple[tuple[int, ...], str]] = []
    real = policy.fresh

    def fresh(
        t: torch.Tensor,
        constant: bool = False,
        by: str = "rows",
        bits: int | None = None,
        shifted: bool = False,
        packed: bool = False,
    ) -> Any:
        made.append((tuple(t.shape), policy.granularity(t, by)))
        return real(t, constant, by, bits, shifted, packed)

    policy.fresh = fresh  # type: ignore[method-assign]
    return made


def _once_each(made: list[tuple[tuple[int, ...], str]], shape: tuple[int, ...]) -> bool:
    """``shape`` was quantized, and at most once by each granularity (rows, columns)."""
    kinds = [by for s, by in made if s == shape]
    return bool(kinds) and len(kinds) == len(set(kinds))


def test_graphconv_quantizes_its_normalised_input_once_and_matches_the_scaled_product() -> None:
    """GraphConv(norm="both") multiplies the features by deg^-1/2 before its weight (input
    wider than output): tango multiplies the features themselves, whose int8 copy the
    cache keeps, and scales the product's rows; forward and the weight's gradient stay
    those of float32 to 8-bit accuracy."""
    g = _graph(60, 300)
    conv = GraphConv(48, 6, norm="both", allow_zero_in_degree=True)
    x = torch.rand(g.num_nodes(), 48)
    ref = conv(g, x)
    ref.square().sum().backward()
    ref_grad = conv.weight.grad.clone()
    conv.weight.grad = None
    with qtrain.patch("tango", rounding="nearest") as session:
        made = _count_quantized_shapes(session.plugins[0].policy)
        for _ in range(3):
            out = conv(g, x)
            out.square().sum().backward()
        report = session.report()["tango"]
    assert report["row_scaled_inputs"] == 3
    assert _once_each(made, (60, 48))  # the features: quantized once, then cached
    assert _rel(out, ref) < 0.02
    assert _rel(conv.weight.grad / 3, ref_grad) < 0.03


def test_graphconv_aggregating_first_quantizes_its_scaled_input_once() -> None:
    """Narrower input than output: GraphConv(norm="both") aggregates deg^-1/2 * X before its
    weight, a new tensor with the same values every step; its int8 copy is made in the
    first step only, and a changed X is quantized again. Results match float32."""
    g = _graph(60, 300)
    conv = GraphConv(6, 48, norm="both", allow_zero_in_degree=True)
    x = torch.rand(g.num_nodes(), 6)
    scaled = x * g.out_degrees().clamp(min=1).float().pow(-0.5).unsqueeze(1)
    ref = conv(g, x)
    ref.square().sum().backward()
    ref_grad = conv.weight.grad.clone()
    conv.weight.grad = None
    with qtrain.patch("tango", rounding="nearest") as session:
        policy = session.plugins[0].policy
        made: list[torch.Tensor] = []
        real = policy.fresh

        def fresh(
            t: torch.Tensor,
            constant: bool = False,
            by: str = "rows",
            bits: int | None = None,
            shifted: bool = False,
            packed: bool = False,
        ) -> Any:
            made.append(t.clone())
            return real(t, constant, by, bits, shifted, packed)

        policy.fresh = fresh  # type: ignore[method-assign]
        for _ in range(3):
            out = conv(g, x)
            out.square().sum().backward()
        report = session.report()["tango"]
        assert sum(torch.allclose(t, scaled) for t in made if t.shape == x.shape) == 1
        x.mul_(2.0)  # X written to: its copy is stale
        conv(g, x)
        assert sum(torch.allclose(t, 2 * scaled) for t in made if t.shape == x.shape) == 1
    assert report["row_scaled_inputs"] == 3
    assert _rel(out, ref) < 0.02
    assert _rel(conv.weight.grad / 3, ref_grad) < 0.03


def test_a_row_scaled_input_written_to_is_not_taken_unscaled() -> None:
    scaled = RowScaled()
    x, r = torch.rand(5, 4), torch.rand(5, 1)
    y = scaled.on_mul("mul", torch.Tensor.__mul__, (x, r), {})
    source = scaled.source(y)
    assert source is not None and source[0] is x and source[1] is r
    w = scaled.on_mul("mul", torch.mul, (r, x), {})  # either order
    assert scaled.source(w) == (x, r) and len(scaled) == 2
    del w
    assert len(scaled) == 1
    y.add_(1.0)
    assert scaled.source(y) is None  # changed since: its values are no longer r * X
    z = scaled.on_mul("mul", torch.Tensor.__mul__, (x, r), {})
    x.mul_(2.0)
    assert scaled.source(z) is None
    # not a per-row column, or a gradient to record: not remembered
    for a, b in [(x, torch.rand(4)), (x, torch.rand(5, 4)), (x.requires_grad_(True), r)]:
        assert scaled.source(scaled.on_mul("mul", torch.mul, (a, b), {})) is None
    del y, z
    assert len(scaled) == 0  # records die with their products


def test_a_row_scaled_input_is_quantized_again_when_its_scale_changes() -> None:
    scaled = RowScaled()
    x, r = torch.rand(5, 4), torch.rand(5, 1)
    calls: list[torch.Tensor] = []

    def quantize(t: torch.Tensor) -> str:
        calls.append(t)
        return f"q{len(calls)}"

    first = scaled.on_mul("mul", torch.mul, (x, r), {})
    assert scaled.quantized_once(first, quantize) == "q1"
    again = scaled.on_mul("mul", torch.mul, (x, r.clone()), {})  # same values, new tensors
    assert scaled.quantized_once(again, quantize) == "q1" and len(calls) == 1
    other = scaled.on_mul("mul", torch.mul, (x, r + 1.0), {})
    assert scaled.quantized_once(other, quantize) == "q2"
    assert scaled.quantized_once(torch.rand(5, 4), quantize) is None  # not an r * X
    del x, first, again, other
    assert scaled.quantized_once(torch.rand(5, 4), quantize) is None
    assert not scaled._copies  # a copy dies with its X


def test_a_session_entered_again_keeps_its_stream_and_its_int8_features() -> None:
    g = _graph(60, 300)
    conv = SAGEConv(48, 6, "mean")
    x = torch.rand(g.num_nodes(), 48)
    session = qtrain.patch("tango")
    with session:
        plugin = session.plugins[0]
        policy = plugin.policy
        made = _count_quantized_shapes(policy)
        conv(g, x).sum().backward()
    offset = policy._offset
    assert offset > 0  # the gradients drew from the stream
    with session:
        assert plugin.policy is policy and policy._offset == offset
        conv(g, x).sum().backward()
    assert _once_each(made, (60, 48))  # the features: quantized in the first step only
    assert policy._offset > offset


def test_builtin_gat_drops_what_an_fp32_step_with_its_seed_drops() -> None:
    """qtrain's GAT draws its feature and attention dropout keyed by node and edge (not
    torch's generator, as GATConv's own nn.Dropout would): a tango step zeroes exactly the
    elements an FP32 step of the same seeded model zeroes, so the two train on the same
    masks, and tango saves them packed (its keyed path, never the torch one)."""
    from qtrain.models.dropout import NodeDropout
    from qtrain.models.gat import GAT, GATOptions

    g = _graph(50, 200)
    x = torch.rand(g.num_nodes(), 12) + 0.1  # no zero of its own: a zero is dropout's

    def zeros(quantized: bool) -> tuple[list[torch.Tensor], dict[str, int] | None]:
        torch.manual_seed(3)
        model = GAT(12, 3, GATOptions(hidden=4, heads=2, dropout=0.5, attn_dropout=0.5))
        drops = [m for m in model.modules() if isinstance(m, NodeDropout)]
        assert len(drops) == 3  # the features' and each layer's attention
        seen: list[torch.Tensor] = []
        for m in drops:
            m.register_forward_hook(lambda _m, _a, out: seen.append(out.detach() == 0))
        graph = model.prepare_graph(g)
        model.train()
        if not quantized:
            model(graph, x).sum().backward()
            return seen, None
        with qtrain.patch("tango") as session:
            model(graph, x).sum().backward()
            return seen, session.report()["tango"]["packed_dropout_calls"]

    fp32, _ = zeros(False)
    tango, calls = zeros(True)
    assert len(fp32) == len(tango) == 4  # features and attention, each of 2 layers
    for a, b in zip(fp32, tango, strict=True):
        assert a.any() and torch.equal(a, b)
    assert calls == {"keyed": 4, "torch": 0}
