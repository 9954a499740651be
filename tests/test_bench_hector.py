"""bench/hector.py runs on a small preset and records what it claims; the times themselves
are for the bench to measure, but the saved bytes are deterministic and are checked here."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def hector() -> Any:
    sys.path.insert(0, str(BENCH))  # the scripts import their sibling _record and _timing
    try:
        yield importlib.import_module("hector")
    finally:
        sys.path.remove(str(BENCH))


def test_a_small_run_records_every_variant(hector: Any, tmp_path: Path) -> None:
    out = tmp_path / "hector.json"
    argv = ["--presets", "aifb", "--max-edges", "3000", "--repeat", "1", "--threads", "1"]
    assert hector.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    aifb = result["presets"]["aifb"]
    assert (aifb["edges"], aifb["relations"], aifb["node_types"]) == (3000, 104, 7)
    rgat = aifb["models"]["rgat"]
    assert set(rgat) == {"plain", "compact", "reorder", "compact+reorder"}
    assert set(aifb["models"]["rgcn"]) == {"dgl"} and set(aifb["models"]["hgt"]) == {"dgl"}
    for row in rgat.values():
        assert row["train_ms"] > 0 and row["inference_ms"] > 0 and row["train_iqr_ms"] >= 0
    # compaction and reordering save fewer bytes for backward than the per-edge form
    assert rgat["plain"]["saved_ratio"] == 1.0
    assert rgat["compact"]["saved_ratio"] > 1.0 and rgat["reorder"]["saved_ratio"] > 1.0
    assert rgat["compact+reorder"]["saved_ratio"] > rgat["compact"]["saved_ratio"]
