"""bench/packed.py runs on the small synthetic preset and records every row with its ratios;
the times are for the bench to measure, not for a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_script

# their main() would keep freed memory for the rest of this worker
pytestmark = pytest.mark.usefixtures("allocator_left_alone")


@pytest.fixture(scope="module")
def packed() -> Any:
    yield from bench_script("packed")


def test_a_small_run_records_every_row(packed: Any, tmp_path: Path) -> None:
    out = tmp_path / "packed.json"
    argv = ["--dataset", "synthetic-small", "--repeat", "1", "--threads", "1"]
    assert packed.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    ops = [r["op"] for r in result["rows"]]
    assert ops == [
        "quantize rows",
        "SpMM copy_u",
        "SpMM u_mul_e (GAT)",
        "SDDMM dot (GAT dW)",
        "quantize cols (blocks)",
        "block GEMM dW (GCN)",
    ]
    rows, *sparse, cols, gemm = result["rows"]
    for quantize in (rows, cols):
        assert set(quantize) >= {"int8_ms", "int8+pack_ms", "packed_ms", "int8+pack_over_packed"}
    for r in sparse:
        assert r["int8_over_packed"] > 0 and r["packed_iqr_ms"] >= 0
    assert gemm["baseline"] == "unpack+int8" and gemm["unpack+int8_over_int8"] > 0
    assert gemm["unpack+int8_over_packed"] > 0


def test_bad_arguments_are_one_line(packed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        packed.main(["--repeat", "0"])
    assert exc.value.code == 2 and "--repeat must be at least 1" in capsys.readouterr().err
