"""Accuracy bar: 8-bit tango, and ``bits = "auto"``, within 1.0 point of FP32.

Mean test accuracy (at the best validation epoch) over seeds 0, 1, 2 with the
example recipes exactly as shipped, on the real Planetoid splits; the FP32
runs use the same seeds.
Reads ../shared/datasets (skipped without it). ``pytest -s`` prints the table.
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
TOLERANCE = 1.0  # points
VARIANTS = {
    "fp32": ["quant.plugin=[]"],
    "tango-8": ['quant.plugin=["tango"]', "quant.tango.bits=8"],
    "tango-auto": ['quant.plugin=["tango"]', 'quant.tango.bits="auto"'],
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (DATA / "planetoid").is_dir(),
        reason=f"real Planetoid data not found at {DATA / 'planetoid'}",
    ),
]


def _mean_accuracy(example: str, overrides: list[str], tmp_path: Path) -> tuple[float, list]:
    accs, bits = [], []
    for seed in SEEDS:
        recipe = load_recipe(
            ROOT / "examples" / f"{example}.toml",
            overrides=[*overrides, f"train.seed={seed}", f"output.dir={tmp_path}"],
        )
        summary = execute(recipe, reporter=Reporter())
        assert summary["status"] == "completed"
        accs.append(100.0 * summary["test_acc"])
        bits.append(summary["plugin_reports"].get("tango", {}).get("bits"))
    return statistics.mean(accs), bits


@pytest.mark.parametrize(
    "example",
    ["cora-gcn", "cora-gat", "cora-sage", "citeseer-gcn", "citeseer-gat", "citeseer-sage"],
)
def test_tango_within_one_point_of_fp32(
    example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(DATA))
    means = {}
    for name, overrides in VARIANTS.items():
        means[name], bits = _mean_accuracy(example, overrides, tmp_path)
        print(f"{example} {name}: {means[name]:.2f} (bits per seed: {bits})")
    for name in ("tango-8", "tango-auto"):
        gap = means["fp32"] - means[name]
        assert gap <= TOLERANCE, (
            f"{example}: {name} mean {means[name]:.2f} is {gap:.2f} points below "
            f"FP32 {means['fp32']:.2f} (seeds {SEEDS})"
        )
