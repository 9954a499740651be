"""bench/gcint.py on a small graph: every variant runs, the table and JSON say so, and
gcint's int8 saved tensors are smaller than FP32's (the times are the bench's to measure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_script


@pytest.fixture(scope="module")
def gcint() -> Any:
    yield from bench_script("gcint")


def test_every_variant_runs_side_by_side(
    gcint: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gcint.json"
    argv = ["--datasets", "synthetic-small", "--seeds", "1", "--epochs", "5"]
    argv += ["--set", "dataset.nodes=200", "--set", f"output.dir={tmp_path}", "--json", str(out)]
    assert gcint.main(argv) == 0
    rows = json.loads(out.read_text())["results"]["synthetic-small"]
    assert list(rows) == [
        "fp32",
        "tango",
        "gcint dyq",
        "gcint stq",
        "gcint dyq softmax",
        "gcint bounded softmax",
    ]
    for name, row in rows.items():
        assert row["completed"] == row["runs"] == 1, (name, row["statuses"])
        assert row["epoch_ms"] > 0 and row["test_acc"] is not None
    assert rows["fp32"]["speedup"] == 1.0
    assert rows["gcint dyq"]["saved_bytes"] < rows["fp32"]["saved_bytes"]
    assert rows["gcint dyq"]["saved_ratio"] > 1.0
    printed = capsys.readouterr().out
    assert "| synthetic-small | gcint stq |" in printed


def test_a_run_that_fails_is_a_row_not_the_end(gcint: Any) -> None:
    rows = gcint.summarize([{"status": "failed: the run diverged at epoch 3"}])
    assert rows["completed"] == 0 and rows["epoch_ms"] is None and rows["test_acc"] is None
    assert rows["statuses"] == ["failed: the run diverged at epoch 3"]


def test_variants_choose_the_rows_and_fp32_always_runs(gcint: Any, tmp_path: Path) -> None:
    out = tmp_path / "gcint.json"
    argv = ["--datasets", "synthetic-small", "--seeds", "1", "--epochs", "2"]
    argv += ["--set", "dataset.nodes=200", "--set", "train.mode=minibatch"]
    argv += ["--set", "train.fanouts=[3, 3]", "--set", "train.batch_size=32"]
    argv += ["--variants", "gcint stq", "--json", str(out)]
    assert gcint.main(argv) == 0
    rows = json.loads(out.read_text())["results"]["synthetic-small"]
    assert list(rows) == ["fp32", "gcint stq"]
    assert all(row["completed"] == 1 for row in rows.values())
    with pytest.raises(SystemExit):
        gcint.main(["--variants", "bf16"])
