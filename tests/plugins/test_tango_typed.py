"""tango's typed GEMM: DGL's segment_mm and gather_mm (every TypedLinear, so RelGraphConv
and HGTConv) as INT8 segment GEMMs, forward and both backward products, against float32;
under hector, whose compact layers it quantizes too."""

from __future__ import annotations

import pytest
import torch

import qtrain
from qtrain._compat import import_dgl
from qtrain.ops import dispatch

dgl = import_dgl()


def _typed_linear(sorted_by_type: bool, plugins: list[str], bits: int = 8):
    torch.manual_seed(0)
    linear = dgl.nn.TypedLinear(24, 16, 5)
    types = torch.sort(torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(1)))
    types = types.values if sorted_by_type else types.values[torch.randperm(300)]
    types[types == 2] = 3  # relation 2 has no row: an empty segment
    x = torch.randn(300, 24, generator=torch.Generator().manual_seed(2), requires_grad=True)
    policy: dict = {"plugin": plugins}
    if "tango" in plugins:
        # every operand at bits (x, a leaf that needs a gradient, counts as a weight)
        policy["tango"] = {"bits": bits, "weight_bits": bits, "fp32_before_softmax": False}
    with qtrain.patch(policy):
        out = linear(x, types, sorted_by_type)
        out.pow(2).sum().backward()
    return out.detach(), x.grad, linear.W.grad


@pytest.mark.parametrize("sorted_by_type", [True, False], ids=["segment_mm", "gather_mm"])
@pytest.mark.parametrize("plugins", [["tango"], ["hector", "tango"]], ids="+".join)
def test_typed_linear_runs_int8_and_stays_close_to_float32(
    sorted_by_type: bool, plugins: list[str]
) -> None:
    want, want_x, want_w = _typed_linear(sorted_by_type, [])
    dispatch.reset()
    got, got_x, got_w = _typed_linear(sorted_by_type, plugins)
    counts = dispatch.snapshot()
    # one forward (nn) and two backward (nt, tn) segment GEMMs, compiled
    assert counts.get("int8_segment_gemm") == {"ext-cpu": 3}
    assert "segment_gemm" not in counts  # no float32 fallback
    for a, b in [(got, want), (got_x, want_x), (got_w, want_w)]:
        assert not torch.equal(a, b)  # quantized
        assert float((a - b).norm() / b.norm()) < 0.03


def test_fewer_bits_cost_accuracy() -> None:
    want = _typed_linear(True, [])[0]
    errors = [float((_typed_linear(True, ["tango"], bits)[0] - want).norm()) for bits in (8, 4, 2)]
    assert errors[0] < errors[1] < errors[2]


def test_a_float64_typed_product_stays_float32_and_is_counted() -> None:
    linear = dgl.nn.TypedLinear(4, 3, 2).double()
    with qtrain.patch("tango") as session:
        out = linear(torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 1, 0]))
        report = session.report()["tango"]
    assert out.dtype == torch.float64
    assert any(key.startswith("segment_gemm:") for key in report["fp32_calls"]), report
