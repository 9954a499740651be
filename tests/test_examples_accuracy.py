"""Acceptance bars: the example recipes reach the published accuracies on the real splits.

Mean test accuracy (at the best validation epoch) over seeds 0, 1, 2 on the
public Planetoid split, FP32, with the example recipes exactly as shipped:
Cora GCN >= 80.0, GAT >= 81.5, GraphSAGE >= 79.0; Citeseer GCN >= 69.5.
Reads the original Planetoid files from ../shared/datasets (skipped without them).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from qtrain.recipe import load_recipe
from qtrain.train.progress import Reporter
from qtrain.train.runner import execute

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "datasets"
SEEDS = (0, 1, 2)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (DATA / "planetoid").is_dir(),
        reason=f"real Planetoid data not found at {DATA / 'planetoid'}",
    ),
]


@pytest.mark.parametrize(
    ("example", "bar"),
    [
        ("cora-gcn", 80.0),
        ("cora-gat", 81.5),
        ("cora-sage", 79.0),
        ("citeseer-gcn", 69.5),
    ],
)
def test_example_reaches_accuracy_bar(
    example: str, bar: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(DATA))
    accs = []
    for seed in SEEDS:
        recipe = load_recipe(
            ROOT / "examples" / f"{example}.toml",
            overrides=[f"train.seed={seed}", f"output.dir={tmp_path}"],
        )
        summary = execute(recipe, reporter=Reporter())
        assert summary["status"] == "completed"
        accs.append(100.0 * summary["test_acc"])
    mean = statistics.mean(accs)
    print(f"{example}: {mean:.2f} ± {statistics.stdev(accs):.2f} (seeds {SEEDS}: {accs})")
    assert mean >= bar, (
        f"{example}: mean test accuracy {mean:.2f} < {bar} over seeds {SEEDS}: {accs}"
    )
