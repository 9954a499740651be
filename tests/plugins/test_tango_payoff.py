"""tango keeps in float32 the primitives too small for int8 to pay (payoff.py) and says so."""

from __future__ import annotations

import pytest
import torch
from qtrain.plugins.tango import payoff

import qtrain
from qtrain._compat import import_dgl
from qtrain.ops import dispatch

dgl = import_dgl()
from dgl.nn import GraphConv  # noqa: E402

CPU = payoff.MEASURED["cpu"]


def test_gemm_is_kept_in_float32_below_the_measured_work() -> None:
    w = torch.zeros(64, 64)
    rows = CPU.gemm_macs // (64 * 64)
    assert payoff.gemm(torch.zeros(rows, 64), w, linear=False) is None
    why = payoff.gemm(torch.zeros(rows - 1, 64), w, linear=False)
    assert why is not None and "multiply-adds" in why and "cpu" in why
    # linear: w is [N, K]; leading dims of x count as rows
    assert payoff.gemm(torch.zeros(2, rows // 2, 64), torch.zeros(64, 64), linear=True) is None
    assert payoff.gemm(torch.zeros(rows, 64), torch.zeros(63, 64), linear=True) is not None


BIG = CPU.copy_edges  # edges of a graph large enough for the copy thresholds


@pytest.mark.parametrize(
    ("check", "op", "need"),
    [
        (payoff.spmm, "copy", CPU.copy_width),
        (payoff.spmm, "mul", CPU.weighted_width),
        (payoff.sddmm, "add", CPU.copy_width),
        (payoff.sddmm, "sub", CPU.copy_width),
        (payoff.sddmm, "dot", CPU.dot_width),
        (payoff.sddmm, "mul", CPU.dot_width),
    ],
)
def test_graph_primitives_are_kept_in_float32_below_the_measured_width(
    check: object, op: str, need: int
) -> None:
    assert check(op, torch.zeros(10, need), BIG) is None  # type: ignore[operator]
    assert check(op, torch.zeros(10, 2, need // 2), BIG) is None  # type: ignore[operator]
    why = check(op, torch.zeros(10, need - 1), BIG)  # type: ignore[operator]
    assert why is not None and f"{need - 1:,} < {need:,}" in why
    assert check(op, torch.zeros(0, need - 1), BIG) is not None  # type: ignore[operator]


@pytest.mark.parametrize(("check", "op"), [(payoff.spmm, "copy"), (payoff.sddmm, "add")])
def test_narrow_copies_and_sums_are_quantized_on_a_small_graph(check: object, op: str) -> None:
    """On Cora-sized graphs the int8 copy and add win at every width measured."""
    narrow = torch.zeros(10, 1)
    assert check(op, narrow, BIG - 1) is None  # type: ignore[operator]
    assert check(op, narrow, BIG) is not None  # type: ignore[operator]


def test_a_device_without_measured_thresholds_quantizes_everything() -> None:
    x = torch.zeros(3, 1, device="meta")
    assert payoff.gemm(x, torch.zeros(1, 1, device="meta"), linear=False) is None
    assert payoff.spmm("copy", x, BIG) is None
    assert payoff.sddmm("add", x, BIG) is None


def _graphconv_step(width: int, out: int, **options: object) -> tuple[dict, dict]:
    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.remove_self_loop(dgl.rand_graph(60, 300)))
    conv = GraphConv(width, out, norm="both")
    x = torch.randn(g.num_nodes(), width)
    dispatch.reset()
    with qtrain.patch("tango", **options) as session:
        conv(g, x).square().sum().backward()
        report = session.report()["tango"]
    return dispatch.snapshot(), report


def test_a_small_layer_stays_float32_and_the_report_says_why() -> None:
    kernels, report = _graphconv_step(48, 6)
    assert set(kernels["gemm"]) == {"fp32"} and "fp32" not in kernels["spmm"], kernels
    reasons = report["fp32_calls"]
    assert list(reasons) == [
        "gemm: too small for int8 to pay on cpu: multiply-adds 17,280 < 8,388,608 "
        "(quant.tango.fp32_when_small)"
    ], reasons


def test_a_narrow_aggregation_on_a_large_graph_stays_float32() -> None:
    g = dgl.rand_graph(2000, BIG)
    x = torch.randn(2000, 8, requires_grad=True)
    dispatch.reset()
    with qtrain.patch("tango") as session:
        dgl.ops.copy_u_sum(g, x).sum().backward()
        reasons = session.report()["tango"]["fp32_calls"]
    assert set(dispatch.snapshot()["spmm"]) == {"fp32"}
    assert any("copy SpMM, values per row on 65,536 edges 8 < 32" in k for k in reasons), reasons


def test_the_same_layer_is_quantized_with_the_thresholds_off() -> None:
    kernels, report = _graphconv_step(48, 6, fp32_when_small=False)
    assert "fp32" not in kernels["gemm"] and "fp32" not in kernels["spmm"], kernels
    assert not any("too small" in k for k in report["fp32_calls"])


def test_a_layer_wide_enough_is_quantized_by_default() -> None:
    """60 nodes x 4,096 x 64 is over 2^23 multiply-adds, and 64 values a row pay in SpMM."""
    kernels, report = _graphconv_step(4096, 64)
    assert "fp32" not in kernels["gemm"] and "fp32" not in kernels["spmm"], kernels
    assert not report["fp32_calls"]
