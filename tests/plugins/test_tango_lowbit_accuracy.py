"""Accuracy bar of issue 32: 4-bit tango, with its default scales, within 1.0 point of FP32.

Mean test accuracy (at the best validation epoch) over seeds 0, 1, 2 with the example
recipes as shipped plus ``quant.tango.bits=4``, on the real Planetoid splits; the FP32
runs use the same seeds and are shared with the other accuracy tests. At 4 bits the
default ``scales = "auto"`` quantizes with one scale per row (one per tensor lost 5.6
points on Cora GCN and 3.1 on Cora GAT, the issue's table). Reads ../shared/datasets
(skipped without it). ``pytest -s`` prints the table.
"""

from __future__ import annotations

import pytest
from conftest import SEEDS, ExampleRuns, needs_planetoid

TOLERANCE = 1.0  # points
FOUR_BITS = ['quant.plugin=["tango"]', "quant.tango.bits=4"]

pytestmark = [pytest.mark.slow, needs_planetoid]


@pytest.mark.parametrize(
    "example",
    ["cora-gcn", "cora-gat", "cora-sage", "citeseer-gcn", "citeseer-gat", "citeseer-sage"],
)
def test_tango_4_bits_within_one_point_of_fp32(example: str, example_runs: ExampleRuns) -> None:
    fp32 = example_runs.mean(example, [])
    mean = example_runs.mean(example, FOUR_BITS)
    accs = [f"{a:.1f}" for a in example_runs.accuracies(example, FOUR_BITS)]
    print(f"{example}: fp32 {fp32:.2f}, tango 4-bit {mean:.2f} (seeds {accs})")
    for summary in example_runs.summaries(example, FOUR_BITS):
        report = summary["plugin_reports"]["tango"]
        assert report["bits"] == 4 and report["scales"] == "row", report
        # a plugin that silently stayed float32 would pass the bar: the low-bit kernels ran
        kernels = summary["kernels"]
        for primitive in ("gemm", "spmm", "quantize_rows", "quantize_cols"):
            quantized = {b for b, n in kernels.get(primitive, {}).items() if n and b != "fp32"}
            assert quantized, f"{example}: no quantized {primitive} ran ({kernels})"
    gap = fp32 - mean
    assert gap <= TOLERANCE, (
        f"{example}: tango 4-bit mean {mean:.2f} is {gap:.2f} points below FP32 {fp32:.2f} "
        f"(seeds {SEEDS})"
    )
