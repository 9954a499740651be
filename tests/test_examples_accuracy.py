"""Acceptance bars: the example recipes reach the published accuracies on the real splits.

Mean test accuracy (at the best validation epoch) over seeds 0, 1, 2 on the
public Planetoid split, FP32, with the example recipes exactly as shipped:
Cora GCN >= 80.0, GAT >= 81.5, GraphSAGE >= 79.0; Citeseer GCN >= 69.5.
Reads the original Planetoid files from ../shared/datasets (skipped without them).
"""

from __future__ import annotations

import statistics

import pytest
from conftest import SEEDS, ExampleRuns, needs_planetoid

pytestmark = [pytest.mark.slow, needs_planetoid]


@pytest.mark.parametrize(
    ("example", "bar"),
    [
        ("cora-gcn", 80.0),
        ("cora-gat", 81.5),
        ("cora-sage", 79.0),
        ("citeseer-gcn", 69.5),
    ],
)
def test_example_reaches_accuracy_bar(example: str, bar: float, example_runs: ExampleRuns) -> None:
    accs = example_runs.accuracies(example, [])
    mean = statistics.mean(accs)
    print(f"{example}: {mean:.2f} ± {statistics.stdev(accs):.2f} (seeds {SEEDS}: {accs})")
    assert mean >= bar, (
        f"{example}: mean test accuracy {mean:.2f} < {bar} over seeds {SEEDS}: {accs}"
    )
