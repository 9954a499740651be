"""tango with one scale per row (``scales = "row"``, issue 32): the products are the
per-row quantized ones, row scales keep small rows beside a hub row, the cache keeps a
tensor's rows and columns apart, and a run reports the scales it used."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.functions import quant_linear
from qtrain.plugins.tango.policy import COLUMNS, ROWS, TENSOR, QuantPolicy, resolve_scales

import qtrain
from qtrain._compat import import_dgl
from qtrain.ops import dispatch
from qtrain.quant.granular import quantize_rows_symmetric

dgl = import_dgl()


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _rows(t: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows_symmetric(t.detach().contiguous(), bits)


def _nt(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The int8 product A @ B^T with A's and B's row scales, as int8_gemm defines it."""
    acc = (a[0].to(torch.float64) @ b[0].to(torch.float64).t()).to(torch.float32)
    return acc * (a[1] * b[1].reshape(1, -1))


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("linear", [True, False])
def test_row_scaled_linear_is_the_per_row_quantized_product(linear: bool, cache: bool) -> None:
    """Forward, dX and dW each equal the int8 product of per-row quantizations of the
    operands laid out so that no scale varies along the sum (round to nearest: no
    stream to replay)."""
    torch.manual_seed(0)
    bits = 4
    x = torch.randn(30, 13, requires_grad=True)
    w = torch.randn(7, 13) if linear else torch.randn(13, 7)
    w.requires_grad_(True)
    b = torch.randn(7, requires_grad=True)
    policy = QuantPolicy(
        bits=bits, rounding="nearest", scales="row", cache=QuantCache() if cache else None
    )
    y = quant_linear(policy, x, w, b, linear=linear)
    g = torch.randn(30, 7)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), g)
    w_out_rows = w if linear else w.t()  # [7, 13]: a row per output feature
    assert torch.equal(y, _nt(_rows(x, bits), _rows(w_out_rows, bits)) + b)
    assert torch.equal(dx, _nt(_rows(g, bits), _rows(w_out_rows.t(), bits)))
    dw_want = _nt(_rows(g.t(), bits), _rows(x.t(), bits))  # [7, 13]
    assert torch.equal(dw, dw_want if linear else dw_want.t())
    assert torch.equal(db, g.sum(0))
    assert sum(dispatch.snapshot()["gemm"].values()) == 3


def test_row_scales_keep_small_rows_beside_a_hub_row() -> None:
    """At 4 bits one scale for the tensor leaves the rows beside a row 1000x larger with
    (almost) nothing; one scale per row keeps each row's own levels."""
    torch.manual_seed(1)
    x = torch.randn(64, 32)
    x[0] *= 1000.0
    w = torch.randn(16, 32)
    want = x @ w.t()
    errors = {}
    for scales in ("tensor", "row"):
        policy = QuantPolicy(bits=4, rounding="nearest", scales=scales)
        y = quant_linear(policy, x, w, linear=True)
        errors[scales] = float((y[1:] - want[1:]).norm() / want[1:].norm())
    assert errors["row"] < 0.25
    assert errors["tensor"] > 0.9
    assert errors["row"] * 4 < errors["tensor"], errors


def test_the_cache_keeps_a_tensors_rows_and_columns_apart() -> None:
    x = torch.randn(6, 4)
    policy = QuantPolicy(bits=8, scales="row")
    rows = policy.cached(x, False, ROWS)
    assert rows[0].shape == (6, 4) and rows[1].shape == (6, 1)
    cols = policy.cached(x, False, COLUMNS)
    assert cols[0].shape == (6, 4) and cols[1].shape == (1, 4)
    whole = policy.cached(x, False, TENSOR)
    assert whole[1].shape == ()
    assert policy.cached(x, False, ROWS) is rows and policy.cached(x, False, COLUMNS) is cols
    assert policy.cache is not None
    stats = policy.cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (2, 3, 3)
    x.mul_(2.0)  # an in-place change: every entry of x is stale
    assert policy.cached(x, False, ROWS) is not rows
    assert policy.cache.stats()["entries"] == 1
    del x
    assert len(policy.cache) == 0  # the weak reference dropped them


def test_per_tensor_policy_ignores_what_a_primitive_asks_for() -> None:
    """``scales = "tensor"`` quantizes every operand with one scale whatever ``by`` says,
    so a run with the default scales is tango-sc23's."""
    x = torch.randn(6, 4)
    policy = QuantPolicy(bits=8)
    for by in (ROWS, COLUMNS, TENSOR):
        q, scale = policy.fresh(x, True, by)
        assert q.shape == x.shape and scale.shape == ()


def test_a_3d_operand_has_one_scale_per_node_and_head() -> None:
    """A node's heads are separate linear maps: one large head keeps its own scale and
    leaves the node's other heads theirs."""
    x = torch.randn(5, 3, 4)
    x[2, 1] *= 100.0
    q, scale = QuantPolicy(bits=4, rounding="nearest", scales="row").fresh(x, True)
    assert scale.shape == (5, 3, 1)
    want_q, want_scale = quantize_rows_symmetric(x.reshape(15, 4), 4)
    assert torch.equal(q, want_q.view(5, 3, 4)) and torch.equal(scale.view(15, 1), want_scale)
    assert bool((q[2, 0] != 0).any()) and bool((q[2, 2] != 0).any())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("kind", ["power-law", "empty", "zero-degree"])
def test_a_per_head_spmm_is_the_sum_of_its_dequantized_heads(
    bits: int, packed: bool, weighted: bool, kind: str
) -> None:
    """GAT's aggregation of [N, H, D] rows with one scale per node and head: forward, dX and
    the attention's gradient are the float sums of the rows each head's scale dequantizes
    (heads 100 times apart in size: one scale per node would round the small one to 0)."""
    from qtrain.plugins.tango.functions import QuantSpMM

    from qtrain.ops.graph import build_csr

    torch.manual_seed(7)
    n, heads, width = 50, 3, 9
    if kind == "power-law":
        dst = torch.multinomial(torch.arange(1, n + 1.0) ** -1.5, 300, replacement=True)
        src = torch.randint(0, n, (300,))
    elif kind == "empty":
        src = dst = torch.zeros(0, dtype=torch.int64)
    else:  # half the nodes receive nothing
        src, dst = torch.randint(0, n, (200,)), torch.randint(0, n // 2, (200,))
    csr = build_csr(src, dst, n, n)
    leaf = torch.randn(n, heads, width, requires_grad=True)
    scale_of_head = torch.tensor([1.0, 100.0, 0.01]).reshape(1, heads, 1)
    weight = torch.rand(src.numel(), heads, 1, requires_grad=True) if weighted else None
    policy = QuantPolicy(bits=bits, rounding="nearest", scales="row", packed=packed)
    x = leaf * scale_of_head
    out = QuantSpMM.apply(policy, csr, x, weight, True)
    g = torch.randn(n, heads, width)
    inputs = (leaf,) if weight is None else (leaf, weight)
    grads = torch.autograd.grad(out, inputs, g)

    def dequantized(t: torch.Tensor) -> torch.Tensor:
        q, s = _rows(t.reshape(-1, width), bits)
        return (q.to(torch.float32) * s).reshape(t.shape)

    x_hat, g_hat = dequantized(x), dequantized(g)
    w = torch.ones(src.numel(), heads, 1) if weight is None else weight.detach()
    want = torch.zeros(n, heads, width).index_add_(0, dst, x_hat[src] * w)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    want_dx = torch.zeros(n, heads, width).index_add_(0, src, g_hat[dst] * w)
    torch.testing.assert_close(grads[0], want_dx * scale_of_head, rtol=1e-5, atol=1e-4)
    if weight is not None:
        dw = (x_hat[src] * g_hat[dst]).sum(-1, keepdim=True)
        torch.testing.assert_close(grads[1], dw, rtol=1e-5, atol=1e-3)
    # packed rows are quantized straight into nibbles and read as stored: by both SpMMs and
    # by the attention's SDDMM (qsddmm4); no int8 copy is packed or unpacked
    counts = dispatch.snapshot()
    assert "pack_int4" not in counts and "unpack_int4" not in counts, counts
    assert policy.operands_packed == (2 if packed and bits <= 4 else 0)
    assert counts.get("sddmm", {}) == ({"ext-cpu": 1} if weighted else {}), counts


def test_gcn_layer_with_a_hub_node_trains_closer_with_row_scales() -> None:
    """A GraphConv on a star graph whose hub (node 0) has a large feature row and gathers
    from every leaf: the leaves' outputs under 4-bit row scales stay near float32; with
    one scale per tensor the hub's row leaves the leaves nothing. (The weight gradient
    X^T dY sums over nodes, so it takes X by columns, where the hub's row still sets every
    column's range: row scales do not help it here, and the test does not claim so.)"""
    from dgl.nn import GraphConv

    n = 200
    leaves = torch.arange(1, n)
    g = dgl.add_self_loop(dgl.graph((leaves, torch.zeros(n - 1, dtype=torch.int64)), num_nodes=n))
    torch.manual_seed(3)
    x = torch.randn(n, 16)
    x[0] *= 300.0
    layer = GraphConv(16, 8)
    results: dict[str, Any] = {}
    for scales in ("fp32", "tensor", "row"):
        layer.zero_grad()
        if scales == "fp32":
            y = layer(g, x)
        else:
            with qtrain.patch("tango", bits=4, rounding="nearest", scales=scales):
                y = layer(g, x)
        y[1:].square().sum().backward()  # backward runs too (the patched primitives' own)
        results[scales] = y.detach()[1:]
    ref_y = results["fp32"]

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    assert rel(results["row"], ref_y) < 0.2
    assert rel(results["row"], ref_y) * 3 < rel(results["tensor"], ref_y)
    assert rel(results["tensor"], ref_y) > 0.9


def test_calibration_measures_the_scales_the_run_uses() -> None:
    """bits = "auto" picks from Error_X of the quantization that will run: with row scales,
    rows beside a hub row lose far less at few bits, so fewer bits meet the target."""
    from qtrain.plugins.tango.calibrate import error_x_by_bits

    torch.manual_seed(4)
    x = torch.randn(300, 24)
    x[::50] *= 100.0
    tensor = error_x_by_bits(x, "nearest", 0, "tensor")
    rows = error_x_by_bits(x, "nearest", 0, "row")
    assert set(rows) == set(range(2, 9))
    assert all(rows[b] < tensor[b] for b in range(2, 8)), (rows, tensor)
    assert rows[4] < 0.3 < tensor[4]


@pytest.mark.parametrize(
    ("extra", "scales"),
    [
        ("bits = 4", "block"),  # the default, "auto": per row, blocks of nodes in dW
        ("bits = 8", "block"),
        ('bits = 4\nscales = "row"', "row"),
        ('bits = 4\nscales = "tensor"', "tensor"),
        ('bits = 8\nscales = "tensor"', "tensor"),
    ],
)
def test_a_run_reports_its_scales_and_runs_the_kernels(
    tango_recipe: Callable[[str], Path], extra: str, scales: str
) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    summary = execute(load_recipe(tango_recipe(extra), []), reporter=Reporter())
    assert summary["plugin_reports"]["tango"]["scales"] == scales
    kernels = summary["kernels"]
    assert "ext-cpu" in kernels["gemm"] and "ext-cpu" in kernels["spmm"]
    quantizers = ("quantize_rows", "quantize_cols") if scales != "tensor" else ("quantize",)
    for quantizer in quantizers:
        assert kernels[quantizer].get("ext-cpu", 0) > 0, kernels
    if scales == "tensor":
        assert "quantize_rows" not in kernels and "quantize_cols" not in kernels
    assert ("block_gemm" in kernels) == (scales == "block"), kernels


def test_auto_scales_are_blocks_at_every_bit_count() -> None:
    assert resolve_scales("auto") == "block"
    assert resolve_scales("tensor") == "tensor" and resolve_scales("row") == "row"
    assert resolve_scales("auto", rotation=16) == "row"  # rotated columns replace the blocks
    from qtrain.plugins.tango.calibrate import error_x_by_bits

    torch.manual_seed(4)
    x = torch.randn(300, 24)
    x[::50] *= 100.0
    auto = error_x_by_bits(x, "nearest", 0, "auto")
    assert auto == error_x_by_bits(x, "nearest", 0, "row")
    assert auto != error_x_by_bits(x, "nearest", 0, "tensor")
