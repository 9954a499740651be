"""bench/hector.py runs on a small preset and records what it claims; the times themselves
are for the bench to measure, but the saved bytes are deterministic and are checked here."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_script


@pytest.fixture(scope="module")
def hector() -> Any:
    yield from bench_script("hector")


def test_a_small_run_records_every_variant(hector: Any, tmp_path: Path) -> None:
    out = tmp_path / "hector.json"
    argv = ["--presets", "aifb", "--max-edges", "3000", "--repeat", "1", "--threads", "1"]
    argv += ["--accuracy-seeds", "0", "--no-pyg"]
    assert hector.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    aifb = result["presets"]["aifb"]
    assert (aifb["edges"], aifb["relations"], aifb["node_types"]) == (3000, 104, 7)
    rgat = aifb["models"]["rgat"]
    assert set(rgat) == {"plain", "compact", "reorder", "compact+reorder", "hector", "hector+tango"}
    rgcn, hgt = aifb["models"]["rgcn"], aifb["models"]["hgt"]
    assert set(rgcn) == {"dgl", "typed_gemm", "compact", "hector", "hector+tango"}
    assert set(hgt) == {"dgl", "typed_gemm", "compact", "compact+reorder", "hector", "hector+tango"}
    for row in [*rgat.values(), *rgcn.values(), *hgt.values()]:
        assert row["train_ms"] > 0 and row["inference_ms"] > 0 and row["train_iqr_ms"] >= 0
    # the plugin's compaction saves fewer bytes for backward than DGL's per-edge messages
    assert rgcn["compact"]["saved_ratio"] > 1.0 and hgt["compact"]["saved_ratio"] > 1.0
    assert set(result["bars"]) == {"rgcn", "rgat", "hgt"}
    for bar in result["bars"].values():
        assert bar["train_geomean"] > 0 and bar["met"] == (bar["train_geomean"] >= bar["bar"])
        assert bar["tango_met"] == (bar["tango_over_hector"] > 1.0)
    rows = result["presets"]["aifb"]["models"]["rgcn"]
    tango = rows["hector"]["train_ms"] / rows["hector+tango"]["train_ms"]
    assert result["bars"]["rgcn"]["tango_over_hector"] == pytest.approx(tango)
    # compaction and reordering save fewer bytes for backward than the per-edge form
    assert rgat["plain"]["saved_ratio"] == 1.0
    assert rgat["compact"]["saved_ratio"] > 1.0 and rgat["reorder"]["saved_ratio"] > 1.0
    assert rgat["compact+reorder"]["saved_ratio"] > rgat["compact"]["saved_ratio"]


def test_the_accuracy_check_compares_fp32_hector_and_tango(hector: Any) -> None:
    checked = hector.accuracy(["rgcn"], seeds=1, epochs=2)["rgcn"]
    assert set(checked["variants"]) == {"fp32", "hector", "hector+tango"}
    rows = checked["variants"]
    # hector changes no number: its accuracy is FP32's
    assert rows["hector"]["test_accuracy"] == pytest.approx(rows["fp32"]["test_accuracy"])
    drop = rows["fp32"]["test_accuracy"] - rows["hector+tango"]["test_accuracy"]
    assert checked["tango_drop"] == pytest.approx(drop)
    assert checked["met"] == (drop <= hector.ACCURACY_DROP)


@pytest.mark.skipif(
    importlib.util.find_spec("torch_geometric") is None,
    reason="PyG is optional: bench/hector.py measures it where a user installed it",
)
def test_pyg_layers_take_the_same_graph(hector: Any, tmp_path: Path) -> None:
    out = tmp_path / "hector.json"
    argv = ["--presets", "aifb", "--max-edges", "2000", "--repeat", "1", "--threads", "1"]
    argv += ["--accuracy-seeds", "0", "--models", "rgcn", "hgt", "--json", str(out)]
    assert hector.main(argv) == 0
    models = json.loads(out.read_text())["presets"]["aifb"]["models"]
    assert "pyg" in models["rgcn"] and "pyg" in models["hgt"]


def test_a_variant_slower_than_slow_s_is_called_once_and_says_so(
    hector: Any, tmp_path: Path
) -> None:
    out = tmp_path / "hector.json"
    argv = ["--presets", "aifb", "--max-edges", "2000", "--repeat", "3", "--threads", "1"]
    argv += ["--models", "rgcn", "--slow-s", "0", "--accuracy-seeds", "0", "--no-pyg"]
    assert hector.main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["presets"]["aifb"]["models"]["rgcn"]
    assert {row["train_rounds"] for row in rows.values()} == {1}
    assert all(row["train_iqr_ms"] == 0 for row in rows.values())
