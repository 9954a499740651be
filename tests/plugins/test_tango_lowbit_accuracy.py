"""Accuracy bars of issue 32: tango with its defaults at 4 bits within 1.0 point of FP32,
at 2 bits within 3.0 points.

Mean test accuracy (at the best validation epoch) over seeds 0, 1, 2 with the example
recipes as shipped plus ``quant.tango.bits=B``, on the real Planetoid splits; the FP32
runs use the same seeds and are shared with the other accuracy tests. The default
``scales = "auto"`` quantizes with one scale per row, and the weight gradient with one per
block of 64 nodes of each column (one per tensor lost 5.6 points on Cora GCN and 3.1 on
Cora GAT at 4 bits, the issue's table), and the defaults
``input_bits = weight_bits = 8`` keep the node features and the weights at 8 bits;
``evaluation = "fp32"`` evaluates the trained weights with the float32 primitives.
Reads ../shared/datasets (skipped without it). ``pytest -s`` prints the table.
"""

from __future__ import annotations

import pytest
from accuracy_checks import assert_tango_low_bits_ran
from conftest import SEEDS, ExampleRuns, needs_planetoid

pytestmark = [pytest.mark.slow, needs_planetoid]


EXAMPLES = ["cora-gcn", "cora-gat", "cora-sage", "citeseer-gcn", "citeseer-gat", "citeseer-sage"]
BARS = {4: 1.0, 2: 3.0}  # points below FP32, issue 32


@pytest.mark.parametrize("bits", sorted(BARS, reverse=True))
@pytest.mark.parametrize("example", EXAMPLES)
def test_tango_low_bits_stay_near_fp32(example: str, bits: int, example_runs: ExampleRuns) -> None:
    """4 bits within 1.0 point, 2 bits within 3.0 points, with the default input_bits and
    weight_bits (8): the activations and gradients take ``bits``."""
    sets = ['quant.plugin=["tango"]', f"quant.tango.bits={bits}"]
    fp32 = example_runs.mean(example, [])
    mean = example_runs.mean(example, sets)
    accs = [f"{a:.1f}" for a in example_runs.accuracies(example, sets)]
    print(f"{example}: fp32 {fp32:.2f}, tango {bits}-bit {mean:.2f} (seeds {accs})")
    for summary in example_runs.summaries(example, sets):
        assert_tango_low_bits_ran(example, summary, bits)
    gap = fp32 - mean
    assert gap <= BARS[bits], (
        f"{example}: tango {bits}-bit mean {mean:.2f} is {gap:.2f} points below FP32 "
        f"{fp32:.2f} (seeds {SEEDS}; the bar is {BARS[bits]})"
    )
