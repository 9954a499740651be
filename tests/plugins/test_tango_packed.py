"""tango's packed operands (``[quant.tango] packed``, issue 32): at 4 bits or fewer the
quantized operands are stored two values a byte (what the cache keeps, what a product saves
for backward, the rows an SpMM gathers), holding the same values as int8 storage: a step
gives the same bits packed or not, and a tensor asked for both forms is quantized once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.functions import quant_linear
from qtrain.plugins.tango.policy import (
    COLUMNS,
    ROTATED_COLUMNS,
    ROTATED_ROWS,
    ROWS,
    TENSOR,
    QuantPolicy,
)

import qtrain
from qtrain._compat import import_dgl
from qtrain.errors import RecipeError
from qtrain.ops import dispatch
from qtrain.ops.packed import unpack_int4

dgl = import_dgl()


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _policy(bits: int, packed: bool, **kwargs: Any) -> QuantPolicy:
    return QuantPolicy(bits=bits, packed=packed, scales="row", seed=7, **kwargs)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("width", [1, 7, 16, 33])
@pytest.mark.parametrize("by", [ROWS, COLUMNS, TENSOR])
def test_a_packed_operand_holds_the_int8_quantizations_values(
    bits: int, width: int, by: str
) -> None:
    """Asked packed first, then int8 (or the other way), a tensor is quantized once: one
    form is the other packed, and the second ask draws nothing from the stream."""
    torch.manual_seed(width)
    x = torch.randn(23, width, requires_grad=True) * 3.0
    for first_packed in (True, False):
        policy = _policy(bits, True)
        first = policy.cached(x, True, by, packed=first_packed)
        offset = policy._offset
        second = policy.cached(x, True, by, packed=not first_packed)
        assert policy._offset == offset  # no second draw
        packed, int8 = (first, second) if first_packed else (second, first)
        assert packed[0].dtype == torch.uint8 and int8[0].dtype == torch.int8
        assert packed[0].shape == (23, (width + 1) // 2)
        assert torch.equal(unpack_int4(packed[0], width), int8[0])
        assert packed[1] is int8[1] or torch.equal(packed[1], int8[1])
        assert policy.operands_packed == 1
        assert policy.cache is not None and policy.cache.stats()["misses"] == 2
        again = policy.cached(x, True, by, packed=True)
        assert again[0] is packed[0]  # the cache hands the packed form back


@pytest.mark.parametrize("bits", [5, 6, 8])
def test_above_four_bits_nothing_is_packed(bits: int) -> None:
    x = torch.randn(10, 9, requires_grad=True)
    policy = _policy(bits, True)
    assert policy.cached(x, True, ROWS, packed=True)[0].dtype == torch.int8
    assert policy.gradient(torch.randn(10, 9), packed=True)[0].dtype == torch.int8
    assert policy.operands_packed == 0


def test_packed_false_never_packs() -> None:
    x = torch.randn(10, 9, requires_grad=True)
    policy = _policy(4, False)
    assert policy.cached(x, True, ROWS, packed=True)[0].dtype == torch.int8
    assert policy.operands_packed == 0


def test_without_the_cache_a_packed_operand_is_quantized_and_packed() -> None:
    torch.manual_seed(1)
    x = torch.randn(12, 5, requires_grad=True)
    packed_policy, int8_policy = _policy(4, True, cache=None), _policy(4, True, cache=None)
    q4, s4 = packed_policy.cached(x, True, ROWS, packed=True)
    q8, s8 = int8_policy.cached(x, True, ROWS)
    assert torch.equal(unpack_int4(q4, 5), q8) and torch.equal(s4, s8)


def test_quantized_width_covers_the_rotated_sides() -> None:
    policy = QuantPolicy(bits=4, scales="row", rotation=16)
    x = torch.randn(37, 11)
    assert policy.quantized_width(x, ROWS) == 11
    assert policy.quantized_width(x, COLUMNS) == 11  # q in x's layout
    assert policy.quantized_width(x, ROTATED_ROWS) == 16  # 11 padded to its block (16)
    assert policy.quantized_width(x, ROTATED_COLUMNS) == 48  # x^T's rows: 37 padded to 16s
    for by in (ROTATED_ROWS, ROTATED_COLUMNS):
        q, _ = policy.cached(x, False, by)
        assert q.shape[-1] == policy.quantized_width(x, by)


def _linear_step(
    policy: QuantPolicy, linear: bool, nan_gradient: bool = False
) -> list[torch.Tensor]:
    """A two-step run of quant_linear on an activation (so X's columns are saved): the
    outputs and the gradients of x and w."""
    torch.manual_seed(3)
    w = torch.randn(9, 13, requires_grad=True) if linear else torch.randn(13, 9, requires_grad=True)
    results = []
    for _ in range(2):
        x = (torch.randn(31, 13) * 2.0).requires_grad_()
        h = x * 1.0  # not a leaf: an activation
        out = quant_linear(policy, h, w, linear=linear)
        grad = torch.full_like(out, float("nan")) if nan_gradient else torch.randn_like(out)
        out.backward(grad)
        results += [out.detach(), x.grad, w.grad.clone()]
        w.grad = None
    return results


@pytest.mark.parametrize("linear", [True, False])
@pytest.mark.parametrize("rotation", [0, 16])
@pytest.mark.parametrize("cache", [True, False])
def test_a_gemm_gives_the_same_bits_packed_or_not(linear: bool, rotation: int, cache: bool) -> None:
    def policy(packed: bool) -> QuantPolicy:
        kept = QuantCache() if cache else None
        return _policy(4, packed, rotation=rotation, cache=kept)

    packed = policy(True)
    for a, b in zip(_linear_step(packed, linear), _linear_step(policy(False), linear), strict=True):
        assert torch.equal(a, b)
    assert (packed.operands_packed > 0) == cache  # without the cache x itself is saved


@pytest.mark.parametrize("rotation", [0, 16])
def test_a_nan_gradient_reads_the_packed_columns_in_float32(rotation: int) -> None:
    """A non-finite gradient sends the backward to float32, which dequantizes the saved
    packed columns (unpacked to their width first): NaN gradients, as float32 gives."""
    fallbacks: list[tuple[str, str]] = []
    policy = _policy(4, True, rotation=rotation, on_fp32=lambda *why: fallbacks.append(why))
    _, dx, dw, *_ = _linear_step(policy, True, nan_gradient=True)
    assert dx.shape == (31, 13) and dw.shape == (9, 13)
    assert torch.isnan(dw).all() and fallbacks and fallbacks[0][0] == "gemm"


def _gcn_and_gat(packed: bool, graph: Any, x: torch.Tensor) -> tuple[list[torch.Tensor], dict]:
    """Two steps of a GraphConv (aggregating after its weight: an SpMM of an activation)
    and a GATConv (a weighted SpMM, the attention gradient an SDDMM of its input) under
    tango at 4 bits; the outputs and every parameter's gradient, and the report."""
    from dgl.nn import GATConv, GraphConv

    torch.manual_seed(0)
    conv = GraphConv(x.shape[1], 6, norm="both", allow_zero_in_degree=True)
    gat = GATConv(6, 5, num_heads=3, allow_zero_in_degree=True)
    results: list[torch.Tensor] = []
    with qtrain.patch("tango", bits=4, packed=packed, rounding="stochastic", seed=2) as session:
        for _ in range(2):
            h = conv(graph, x).relu()
            out = gat(graph, h)
            out.square().sum().backward()
            results.append(out.detach())
            for p in [*conv.parameters(), *gat.parameters()]:
                results.append(p.grad.clone())
                p.grad = None
        report = session.report()["tango"]
    return results, report


@pytest.mark.parametrize(
    "graph",
    [
        "power-law",
        "empty",
        "zero-degree",
    ],
)
def test_a_gnn_step_gives_the_same_bits_packed_or_not(graph: str) -> None:
    torch.manual_seed(4)
    if graph == "power-law":  # hubs: a few nodes take most edges
        n = 60
        dst = torch.multinomial(torch.arange(1, n + 1.0) ** -1.5, 400, replacement=True)
        g = dgl.graph((torch.randint(0, n, (400,)), dst), num_nodes=n)
    elif graph == "empty":
        g = dgl.graph(([], []), num_nodes=20)
    else:  # half the nodes receive nothing
        g = dgl.graph((torch.randint(0, 40, (150,)), torch.randint(0, 20, (150,))), num_nodes=40)
    x = torch.randn(g.num_nodes(), 11)
    with_packing, report = _gcn_and_gat(True, g, x)
    without, report_int8 = _gcn_and_gat(False, g, x)
    for a, b in zip(with_packing, without, strict=True):
        assert torch.equal(a, b)
    assert report["packed"] and not report_int8["packed"]
    assert report_int8["operands_packed"] == 0
    if g.num_edges():
        assert report["operands_packed"] > 0


def test_a_run_reports_its_packed_operands(tango_recipe: Callable[..., Path]) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    summaries = {}
    for packed in ("true", "false"):
        path = tango_recipe(f"bits = 4\npacked = {packed}", model="sage")
        recipe = load_recipe(path, ["model.layers=3"])  # a hidden layer before the output
        summaries[packed] = execute(recipe, reporter=Reporter())
    packed, int8 = summaries["true"], summaries["false"]
    assert packed["plugin_reports"]["tango"]["operands_packed"] > 0
    assert int8["plugin_reports"]["tango"]["operands_packed"] == 0
    # operands are quantized straight into nibbles and read as stored; the one conversion
    # left is a tensor read in both forms (SAGE's hidden input: packed rows for its SpMM,
    # int8 rows for its self GEMM), unpacked once a step rather than quantized twice
    assert "pack_int4" not in packed["kernels"] and "pack_int4" not in int8["kernels"]
    assert sum(packed["kernels"].get("unpack_int4", {}).values()) <= 3  # 3 epochs
    assert "unpack_int4" not in int8["kernels"]
    assert packed["final_loss"] == int8["final_loss"]  # the same values, stored apart
    assert packed["test_acc"] == int8["test_acc"]
    # what a step saves falls: SAGE saves its activations' columns packed
    assert packed["activation_bytes"] < int8["activation_bytes"]


def test_a_packed_value_that_is_not_a_boolean_is_refused(
    tango_recipe: Callable[..., Path],
) -> None:
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match="packed") as info:
        load_recipe(tango_recipe('packed = "yes"'), [])
    assert "\n" not in str(info.value)
