"""bench/lowbit.py on a small graph: every variant runs side by side, the packed ones pack,
and the table and JSON say so (the times are the bench's to measure)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def lowbit() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("lowbit")
    finally:
        sys.path.remove(str(BENCH))


def test_every_variant_runs_side_by_side(
    lowbit: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lowbit.json"
    small = ["dataset.name=synthetic-small", "dataset.nodes=300", "model.hidden=32"]
    argv = ["--recipes", "arxiv-gcn", "--repeats", "1", "--epochs", "2", "--json", str(out)]
    argv += ["--variants", "tango 4", "tango 4 int8", "tango 2"]  # and the 8-bit baseline
    for override in (*small, "quant.tango.fp32_when_small=false"):  # every primitive tango's
        argv += ["--set", override]
    assert lowbit.main(argv) == 0
    rows = json.loads(out.read_text())["results"]["arxiv-gcn"]
    assert list(rows) == ["tango 8", "tango 4", "tango 4 int8", "tango 2"]
    for name, row in rows.items():
        assert row["completed"] == row["runs"] == 1, (name, row["statuses"])
        assert row["epoch_ms"] > 0 and row["saved_bytes"] > 0
    assert rows["tango 8"]["speedup"] == 1.0
    assert rows["tango 4"]["operands_packed"] > 0 and rows["tango 2"]["operands_packed"] > 0
    assert rows["tango 4 int8"]["operands_packed"] == rows["tango 8"]["operands_packed"] == 0
    assert rows["tango 4"]["saved_bytes"] < rows["tango 4 int8"]["saved_bytes"]
    assert "| arxiv-gcn | tango 4 |" in capsys.readouterr().out


def test_a_run_that_fails_is_a_row_not_the_end(lowbit: Any) -> None:
    row = lowbit.summarize([{"status": "failed: the run diverged at epoch 3"}])
    assert row["completed"] == 0 and row["epoch_ms"] is None and row["saved_bytes"] is None
    assert row["statuses"] == ["failed: the run diverged at epoch 3"]
